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


@pytest.mark.parametrize("kind", ["python", "c"])
def test_write_floors_pass_a_triton_put_through(tmp_path: Path, kind: str) -> None:
    """bench.floorwfs (and bench/floorwc.c): what a put writes lands in the source dir,
    byte for byte, as it would in a plain directory; misses stay misses; unmounts."""
    require_fuse()
    from bench.clients import write_tree
    from bench.mounts import build_c_floor

    program = None
    if kind == "c":
        program = build_c_floor(tmp_path / "floorwc")
        if program is None:
            pytest.skip("no cc / pkg-config / fuse3 headers to build bench/floorwc.c")
    src, plain, mnt = tmp_path / "src", tmp_path / "plain", tmp_path / "mnt"
    src.mkdir()
    plain.mkdir()
    with floor_mounted(src, mnt, writable=True, program=program) as fm:
        assert mounted(fm.path)
        write_tree(str(fm.path), 3, "t")
        write_tree(str(plain), 3, "t")
        assert not (fm.path / "missing").exists()
        (fm.path / "missing").write_bytes(b"now")  # a cached miss must not hide a create
        assert (fm.path / "missing").read_bytes() == b"now"
        os.unlink(fm.path / "missing")
        os.makedirs(fm.path / "d" / "e")
        os.rename(fm.path / "d", fm.path / "d2")
        assert (fm.path / "d2" / "e").is_dir()
        os.removedirs(fm.path / "d2" / "e")
    assert not mounted(mnt)

    def tree(top: Path) -> dict[str, bytes]:
        return {str(p.relative_to(top)): p.read_bytes() for p in top.rglob("*") if p.is_file()}

    assert tree(src) == tree(plain)
    assert len(tree(src)) == 21  # 3 kernel dirs of 7 files, no temporary dir left
    assert sorted(p.name for p in src.iterdir()) == sorted(p.name for p in plain.iterdir())
