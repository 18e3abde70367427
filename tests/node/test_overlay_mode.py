"""The `overlay` view mode: kernel overlayfs over hard links to local objects and a
read-only casfs FUSE view; writes in a node-local upper, promoted and published."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from casfs.view import overlay

from .test_two_nodes import published, seed

pytestmark = pytest.mark.fuse


def _fstype(path: Path) -> str | None:
    target = os.path.realpath(path)
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if parts[4] == target:
                found = parts[parts.index("-") + 1]
    return found


def _wait(cond: Any, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_overlay_mode(cluster: dict[str, Any], tmp_path: Path) -> None:
    if (why := overlay.unavailable_reason()) is not None:
        pytest.skip(why)
    a, b = cluster["a"], cluster["b"]
    files = {f"K{i}/k.cubin": os.urandom(3000 + i) for i in range(4)}
    seed(cluster["root"], files, tmp=tmp_path)

    # Node b reads K0 once through a fuse mount: its object is now on the node.
    w = b.mount()
    assert (w.cfg.mountpoint / "K0" / "k.cubin").read_bytes() == files["K0/k.cubin"]
    b.stop(w)

    w = b.mount(mode="overlay")
    mnt = w.cfg.mountpoint
    assert _fstype(mnt) == "overlay"
    st = b.ask(w, "stats")["counters"]
    assert st["overlay_linked"] == 1  # K0's object; the rest comes through FUSE
    assert st["overlay_sealed_dirs"] == 1  # K0/ is wholly local: not merged with FUSE
    for rel, data in files.items():
        assert (mnt / rel).read_bytes() == data

    # A write lands in the upper at native speed and is promoted and published.
    (mnt / "NEW").mkdir()
    (mnt / "NEW" / "k.so").write_bytes(b"new kernel")
    # Rewriting a linked file in place copies it up: the cached object stays intact.
    obj = b.state / "objects"
    digest = published(cluster["root"])["K0/k.cubin"].digest
    cached = obj / digest[:2] / digest[2:]
    with open(mnt / "K0" / "k.cubin", "r+b") as f:
        f.write(b"XX")
    assert cached.read_bytes() == files["K0/k.cubin"]
    assert (mnt / "K0" / "k.cubin").read_bytes()[:2] == b"XX"
    # Deleting a lower file: an overlayfs whiteout (0/0 char device) in the upper.
    os.unlink(mnt / "K1" / "k.cubin")
    assert not (mnt / "K1" / "k.cubin").exists()
    wh = os.lstat(w.cfg.upper / "K1" / "k.cubin")
    assert stat.S_ISCHR(wh.st_mode) and wh.st_rdev == 0

    def new_published() -> bool:
        b.ask(w, "publish")
        return "NEW/k.so" in published(cluster["root"])

    _wait(new_published, "NEW/k.so never published")
    assert published(cluster["root"])["NEW/k.so"].extras["pack"]  # promoted into a pack
    assert "K1/k.cubin" in published(cluster["root"])  # local deletions are not published

    # Refresh under the mounted overlay: a new entry at a name never looked up appears.
    wa = a.mount(mountpoint=cluster["mnt"] / "a")
    (wa.cfg.mountpoint / "LATE").mkdir()
    (wa.cfg.mountpoint / "LATE" / "k.cubin").write_bytes(b"late")
    a.stop(wa)
    assert "LATE/k.cubin" in published(cluster["root"])
    assert b.ask(w, "refresh")["ok"]
    assert (mnt / "LATE" / "k.cubin").read_bytes() == b"late"

    b.stop(w)
    assert _fstype(mnt) is None
    assert _fstype(b.state / "overlay" / "testns" / "fuse") is None
