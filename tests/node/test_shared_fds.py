"""Warm opens through a real mount share an object's fd (kept open, bounded, after
its last release): eviction, the fd bound and RLIMIT_NOFILE never cost a right byte."""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from bench import tree
from casfs.families import rules as family_rules
from casfs.promote.importer import import_tree
from casfs.store.root import SharedRoot
from tests.node.test_two_nodes import seed

pytestmark = pytest.mark.fuse


def fds(pid: int) -> list[str]:
    """The targets of a process's fds."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return out


def object_fds(pid: int, objects: Path) -> list[str]:
    """The targets of the mount process's fds that are object cache files."""
    return [t for t in fds(pid) if t.startswith(str(objects) + "/")]


def test_eviction_of_an_idle_shared_fd_keeps_bytes_right(
        cluster: dict[str, Any], tmp_path: Path) -> None:
    files = {f"d{i % 4}/f{i}": os.urandom(100_000 + i) for i in range(30)}  # 3 MB
    seed(cluster["root"], files, tmp=tmp_path)
    b = cluster["b"]
    w = b.mount(cache_max_bytes=1_000_000)  # room for ~10 of them
    mp, objects = w.cfg.mountpoint, b.state / "objects"
    for _ in range(4):
        assert (mp / "d0/f0").read_bytes() == files["d0/f0"]
    # The 1st open fetched (its own fd), the 2nd opened the object's shared fd and
    # left it open (idle): the 3rd and 4th were served by it.
    assert b.ask(w, "stats")["counters"].get("open_shared", 0) == 2
    assert object_fds(w.proc.pid, objects)  # kept open after the last release
    for _ in range(2):  # each pass evicts what the pass before read, idle fds included
        for rel, data in files.items():
            assert (mp / rel).read_bytes() == data, rel
            # An evicted object's idle fd is closed: no fd keeps an unlinked file.
            assert not [t for t in object_fds(w.proc.pid, objects) if t.endswith(" (deleted)")]
    c = b.ask(w, "stats")["counters"]
    assert c["objects_fetched"] > len(files)  # evicted and fetched again: no EIO
    cached = sum(p.stat().st_size for p in objects.rglob("*") if p.is_file())
    assert cached <= 1_000_000


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_idle_fds_stay_within_a_quarter_of_rlimit_nofile(
        cluster: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {f"d{i % 50}/f{i}": b"%d" % i * 7 for i in range(2000)}
    seed(cluster["root"], files, tmp=tmp_path)
    b = cluster["b"]
    # A mount process lifts its soft limit to the hard one: started under a hard limit
    # of 256 (as an operator's LimitNOFILE=256 would), it keeps a quarter of that.
    wrapper = tmp_path / "python-nofile-256"
    wrapper.write_text(f'#!/bin/sh\nexec prlimit --nofile=256:256 -- {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(wrapper))
    w = b.mount()
    monkeypatch.undo()
    assert resource.prlimit(w.proc.pid, resource.RLIMIT_NOFILE) == (256, 256)
    mp, objects = w.cfg.mountpoint, b.state / "objects"
    for _ in range(2):
        for rel, data in files.items():
            assert (mp / rel).read_bytes() == data, rel
    # Idle object fds: a quarter of the limit (once the kernel's last RELEASE, sent
    # after close returns, has arrived).
    wait_until(lambda: len(object_fds(w.proc.pid, objects)) <= 256 // 4,
               "idle object fds within a quarter of RLIMIT_NOFILE")
    assert object_fds(w.proc.pid, objects)
    assert len(os.listdir(f"/proc/{w.proc.pid}/fd")) < 256
    for rel in list(files)[-20:]:  # the most recent ones are still open: shared
        assert (mp / rel).read_bytes() == files[rel]
    assert b.ask(w, "stats")["counters"].get("open_shared", 0) >= 20


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_a_mount_process_lifts_its_soft_fd_limit_to_the_hard_one(
        cluster: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file a job holds open through the mount is an fd of the mount process:
    the 1,024 a login shell hands down is not the process's to keep."""
    wrapper = tmp_path / "python-nofile"
    wrapper.write_text(f'#!/bin/sh\nexec prlimit --nofile=256:4096 -- {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(wrapper))
    w = cluster["b"].mount()
    monkeypatch.undo()
    assert resource.prlimit(w.proc.pid, resource.RLIMIT_NOFILE) == (4096, 4096)


def test_presented_group_files_share_one_sealed_memfd(
        cluster: dict[str, Any], tmp_path: Path) -> None:
    """A presented file's bytes go into one memfd per (path, digest), sealed, shared
    by its opens and kept after the last release (no memfd_create + write per open)."""
    src = tmp_path / "src"
    tree.build(src, 3, seed="memfd")
    SharedRoot.open(cluster["root"], create=True)
    import_tree(SharedRoot.open(cluster["root"]), src, "testns",
                rules=family_rules("triton"), node="seed")
    b = cluster["b"]
    w = b.mount("triton")
    mp = w.cfg.mountpoint
    groups = sorted(str(p.relative_to(src)) for p in src.rglob("__grp__*"))
    assert len(groups) == 3
    shown = {g: (mp / g).read_bytes() for g in groups}
    for data in shown.values():  # presented with this mount's paths
        assert all(p.startswith(f"{mp}/") for p in json.loads(data)["child_paths"].values())
    with open(mp / groups[0], "rb") as f1, open(mp / groups[0], "rb") as f2:
        for _ in range(3):
            for g, data in shown.items():
                assert (mp / g).read_bytes() == data
        assert f1.read() == f2.read() == shown[groups[0]]
        memfds = [t for t in fds(w.proc.pid) if t.startswith("/memfd:casfs-presented")]
        assert len(memfds) == len(groups)  # one each, the two open handles' shared
    assert b.ask(w, "stats")["counters"]["presented_opens"] == 4 * len(groups) + 2
    memfds = [t for t in fds(w.proc.pid) if t.startswith("/memfd:casfs-presented")]
    assert len(memfds) == len(groups)  # kept after the last release
