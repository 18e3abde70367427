"""A POSIX shared root that goes away under a running node is never written in its place.

Seen by a reviewer: the root's filesystem unmounted mid-job (`umount -l`) left its
bare mount point; the node's publication wrote records, objects and packs into that
local directory and the job's summary said "7 published", while the real root got
nothing. Every write of casfs.store.backend.LocalBackend now checks that the
directory it writes beneath is the one it opened."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from casfs.store.entry import Entry
from casfs.store.root import SharedRoot


def _publish_one(root: SharedRoot, data: bytes) -> None:
    obj = root.objects.put_bytes(data)
    root.generations().publish("ns", [Entry("f", obj.digest, obj.size, 0o644, 1)], node="n")


def _written(path: Path) -> list[str]:
    return [str(p) for p in path.rglob("*") if p.is_file() and p.parent != path / "tmp"]


def test_a_root_directory_replaced_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "root"
    root = SharedRoot.open(path, create=True)
    _publish_one(root, b"first")
    path.rename(tmp_path / "moved-away")
    path.mkdir()  # what is at the path now is another directory
    with pytest.raises(OSError) as e:
        _publish_one(root, b"second")
    assert e.value.errno == errno.ESTALE and "no longer the directory" in str(e.value)
    assert _written(path) == []  # no record, object or pack there (a staged temp may be)


def test_a_root_filesystem_unmounted_under_a_node_is_not_written(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root (CI runs as root)")
    path = tmp_path / "root"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(path)], check=True)
    try:
        root = SharedRoot.open(path, create=True)
        _publish_one(root, b"first")
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)
    with pytest.raises(OSError) as e:
        _publish_one(root, b"second")
    assert e.value.errno == errno.ESTALE
    assert _written(path) == []
