"""The bench's pyfuse3 floor serves the tree it loaded, byte for byte, and unmounts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fusehelpers import mounted, require_fuse

from bench.common import resident_fraction
from bench.mounts import floor_mounted

pytestmark = pytest.mark.fuse


def test_floor_serves_the_tree(tmp_path: Path) -> None:
    require_fuse()
    src = tmp_path / "src"
    (src / "k1").mkdir(parents=True)
    (src / "k1" / "a.bin").write_bytes(os.urandom(300_000))
    (src / "top.json").write_text('{"x": 1}')
    mnt = tmp_path / "mnt"
    with floor_mounted(src, mnt) as fm:
        path = fm.path
        assert fm.cpu() >= 0
        assert mounted(path)
        got = {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}
        assert got == {"k1/a.bin": (src / "k1" / "a.bin").read_bytes(),
                       "top.json": b'{"x": 1}'}
        assert not (path / "missing").exists()
        with pytest.raises(OSError):
            (path / "top.json").write_text("no")
    assert not mounted(mnt)


def test_resident_fraction_sees_read_pages(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(os.urandom(64 * 1024))
    f.read_bytes()
    assert resident_fraction([f]) == 1.0
