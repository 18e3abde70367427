"""casfs.node.fuseconn: holding a mount process's FUSE connection (real processes)."""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from casfs.node import fuseconn

HOLDER = ("import os, sys, time; fd = os.open('/dev/fuse', os.O_RDWR);"
          " print(fd, flush=True); time.sleep(60)")


def _holder() -> tuple[subprocess.Popen[str], int]:
    p = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    return p, int(p.stdout.readline())


def test_grab_dups_the_one_dev_fuse_fd_of_a_child() -> None:
    if not os.path.exists("/dev/fuse") or os.geteuid() != 0:
        pytest.fail("needs root and /dev/fuse (scripts/check-capabilities.sh)")
    p, target = _holder()
    try:
        assert fuseconn.find(p.pid) == target
        fd = fuseconn.grab(p.pid)
        assert fd is not None
        try:
            assert os.readlink(f"/proc/self/fd/{fd}") == "/dev/fuse"
            assert not os.get_inheritable(fd)
        finally:
            os.close(fd)
    finally:
        p.kill()
        p.wait()
    assert fuseconn.grab(os.getpid()) is None  # this process holds no connection


@pytest.mark.expect_log(r"cannot hold the mount processes' FUSE connections")
def test_a_refusal_is_said_once_at_warning(monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """A syscall filter refusing pidfd_getfd (systemd 252's @system-service did)."""
    p, _ = _holder()
    monkeypatch.setattr(fuseconn, "_warned", False)

    class Refusing:
        restype = None

        def __call__(self, *args: object) -> int:
            ctypes.set_errno(errno.EPERM)
            return -1

    class Libc:
        syscall = Refusing()

    monkeypatch.setattr(fuseconn, "libc", Libc)
    try:
        with caplog.at_level(logging.DEBUG, logger="casfs.node.fuseconn"):
            assert fuseconn.grab(p.pid) is None
            assert fuseconn.grab(p.pid) is None
    finally:
        p.kill()
        p.wait()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "SystemCallFilter" in warnings[0].getMessage(), warnings


def test_a_fuse_mount_another_user_made_is_never_taken_for_ours(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A crashed mount process is adopted only where its FUSE mount is still on top; a
    tenant's own FUSE mount stacked there (``user_id`` hers, from mountinfo) is not it:
    adopting would wait on her server."""
    from casfs.node import guard, handover
    from casfs.view.op_restore import state_paths

    cfg = SimpleNamespace(mountpoint=tmp_path / "mp", run_dir=tmp_path / "run", name="t/ns",
                          mode="fuse")
    table = state_paths(cfg.run_dir, cfg.name, 4242)[1]
    table.parent.mkdir(parents=True, exist_ok=True)
    table.write_bytes(b"")
    ours = guard.MountEntry(str(cfg.mountpoint), "/", "fuse.casfs-t/ns", "casfs-t/ns",
                            options=f"rw,user_id={os.geteuid()},group_id=0")
    hers = guard.MountEntry(str(cfg.mountpoint), "/", "fuse.casfs-t/ns", "casfs-t/ns",
                            options="rw,user_id=1001,group_id=1001,allow_other")
    for top, adoptable in ((ours, True), (hers, False)):
        monkeypatch.setattr(handover, "top", lambda path, t=top: t)
        assert fuseconn.adoptable(cfg, 4242) is adoptable
        assert guard.our_fuse(top) is adoptable


def test_a_successor_refuses_a_mount_point_another_user_stacked_on(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A successor (handover) starts without refuse_stacking (its predecessor's mount is
    on top, by design) and then makes sure of its mount point: a tenant's own FUSE mount
    stacked there instead is refused in one line, never stat()ed."""
    from casfs.errors import UsageError
    from casfs.node import guard

    mp = tmp_path / "mp"
    pred = guard.MountEntry(str(mp), "/", "fuse.casfs", "casfs-t/ns",
                            options=f"rw,user_id={os.geteuid()},group_id=0")
    hers = guard.MountEntry(str(mp), "/", "fuse.hangfs", "hangfs",
                            options="rw,user_id=1001,group_id=1001,allow_other")
    monkeypatch.setattr(guard, "mounts_at", lambda path: [pred])
    guard.refuse_foreign(mp, "namespace t~ns")  # its predecessor's: fine
    monkeypatch.setattr(guard, "mounts_at", lambda path: [pred, hers])
    with pytest.raises(UsageError, match="another user's FUSE mount \\(hangfs\\)"):
        guard.refuse_foreign(mp, "namespace t~ns")
