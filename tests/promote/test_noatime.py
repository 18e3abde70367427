"""casfs's own reads of a job's tree leave the job's access times alone.

Promotion reads every file the job wrote; dir and overlay modes rescan the tree.
Under relatime an atime older than a day is updated by any read, so a job that set
an old atime would otherwise see it turn to "now" (seen as a flaky conformance
failure: overlay's periodic upper scan reading a directory right after the job's
utimensat). The tree lives on a tmpfs mounted here with relatime, so the control
read below is known to update atimes.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs.families import CacheRules, walk_files
from casfs.families import rules as family_rules
from casfs.store.objects import open_regular, read_regular
from casfs.util import noatime

Step = tuple[str, list[str], list[str]]
OLD = 1_000_000_000_000_000_000  # 2001


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[Path]:
    top = tmp_path / "fs"
    top.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,relatime", "tmpfs", str(top)],
                   check=True, timeout=30)
    try:
        yield top
    finally:
        subprocess.run(["umount", "-l", str(top)], check=False, timeout=30)


def _tree(top: Path) -> list[Path]:
    for d in ("a", "a/b", "c", "scratch.tmp.d"):
        (top / d).mkdir()
    for f in ("x", "a/y", "a/b/z", "c/w"):
        (top / f).write_bytes(f.encode() * 100)
    (top / "link-to-dir").symlink_to("a")
    paths = [top / p for p in ("x", "a/y", "a/b/z", "c/w", "a", "a/b", "c")]
    for p in paths:
        os.utime(p, ns=(OLD, OLD))
    return paths


def test_walk_and_reads_keep_old_atimes(fs: Path) -> None:
    paths = _tree(fs)
    control = fs / "control"
    control.write_bytes(b"c")
    os.utime(control, ns=(OLD, OLD))
    control.read_bytes()
    assert os.stat(control).st_atime_ns != OLD, "this tmpfs must update atimes on read"

    rules: CacheRules = family_rules("generic")
    seen = []
    for rel, full, scratch in walk_files(fs, rules):
        seen.append(rel)
        if not scratch and os.path.isfile(full) and not os.path.islink(full):
            size = os.lstat(full).st_size
            assert read_regular(full, size + 1, size) == rel.encode() * 100 or rel == "control"
            with open_regular(full) as f:
                f.read()
    assert {"x", "a/y", "a/b/z", "c/w"} <= set(seen)
    assert [os.stat(p).st_atime_ns for p in paths] == [OLD] * len(paths)


def test_walk_is_os_walk(fs: Path) -> None:
    _tree(fs)

    def collect(walker: Iterator[Step]) -> list[Step]:
        out = []
        for d, dirs, files in walker:
            dirs[:] = [x for x in dirs if x != "c"]  # pruning in place is honoured
            out.append((d, sorted(dirs), sorted(files)))
        return sorted(out)

    assert collect(noatime.walk(str(fs))) == collect(os.walk(str(fs)))
