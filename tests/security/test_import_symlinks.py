"""``casfs import`` run by root over a tree another user can write reads nothing of
root's through a symlink she swaps in after the scan (a review's note, 2026-12-06).

The scan lstat()s each file; the reads came after, by path: a parent directory
renamed away and replaced by a symlink to a root-only directory holding the same
names (or a file replaced by a symlink to one), and root read its own files and
published them into the namespace. Now every file is opened beneath the source's
directory (no symlink followed, no mount crossed) and fstat()ed: such a path is
skipped, and nothing of root's is stored.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from casfs.families import rules
from casfs.promote import importer
from casfs.store.root import SharedRoot

SECRET = b"root:$6$not-for-tenants:19000:0:99999:7:::\n"


@pytest.mark.parametrize("swap", ["parent", "leaf"])
def test_a_path_swapped_after_the_scan_reads_nothing_of_roots(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: str) -> None:
    src = tmp_path / "hers"
    (src / "k1").mkdir(parents=True)
    (src / "k1" / "a.cubin").write_bytes(b"her kernel\n")
    (src / "k2").mkdir()
    (src / "k2" / "b.cubin").write_bytes(b"another of hers\n")
    secret = tmp_path / "rootonly"
    secret.mkdir(mode=0o700)
    (secret / "a.cubin").write_bytes(SECRET)
    scan = importer.scan_tree

    def scanned_then_swapped(*a: object, **k: object) -> object:
        found = scan(*a, **k)  # type: ignore[arg-type]
        if swap == "parent":  # her directory k1 renamed away, a symlink in its place
            (src / "k1").rename(src / "k1.old")
            (src / "k1").symlink_to(secret)
        else:  # her file replaced by a symlink to root's
            (src / "k1" / "a.cubin").unlink()
            (src / "k1" / "a.cubin").symlink_to(secret / "a.cubin")
        return found

    monkeypatch.setattr(importer, "scan_tree", scanned_then_swapped)
    root = SharedRoot.open(tmp_path / "root", create=True)
    rep = importer.import_tree(root, src, "generic-x", rules=rules("generic"),
                               node="n")
    assert "k1/a.cubin" in rep.skipped_other
    snap = root.generations().entries("generic-x")
    assert set(snap.entries) == {"k2/b.cubin"}
    for d, _, files in os.walk(tmp_path / "root"):
        for f in files:
            assert b"not-for-tenants" not in (Path(d) / f).read_bytes()
