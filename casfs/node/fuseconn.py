"""A supervisor's hold on a mount process's FUSE connection (its ``/dev/fuse`` fd).

The kernel keeps a FUSE connection while any process holds its ``/dev/fuse``
file. casfsd takes a dup of each mount process's connection (a fuse mode
mount's, an overlay mode mount's FUSE layer's, the node host's) with
``pidfd_getfd(2)`` (Linux 5.6, root: ptrace access to its own children); when
that process dies the connection, and with it every job's open files, mapped
files and cwds in the mount, survives for a new process to serve
(casfs.view.adopt). Whoever holds it must hand it to that process or close it:
a held connection nobody serves makes every job's request wait.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
from pathlib import Path
from typing import Any

from casfs.util.libc import libc

log = logging.getLogger(__name__)

SYS_PIDFD_GETFD = {"x86_64": 438, "aarch64": 438}


def find(pid: int) -> int | None:
    """The number of process ``pid``'s ``/dev/fuse`` fd (one: a mount process serves one
    session), or None."""
    base = f"/proc/{pid}/fd"
    try:
        names = os.listdir(base)
    except OSError:
        return None
    found = []
    for n in names:
        with contextlib.suppress(OSError):
            if os.readlink(f"{base}/{n}") == "/dev/fuse":
                found.append(int(n))
    return found[0] if len(found) == 1 else None


_warned = False


def _refused(pid: int, err: int) -> None:
    """The kernel or a syscall filter refused: once a WARNING (crash survival is off
    for every mount; an operator can fix it), then DEBUG."""
    global _warned
    if _warned or err not in (errno.EPERM, errno.ENOSYS, errno.EACCES):
        log.debug("pid %d: pidfd_getfd: %s", pid, os.strerror(err))
        return
    _warned = True
    log.warning("cannot hold the mount processes' FUSE connections (pidfd_getfd: %s): a"
                " crashed mount process's jobs see ENOTCONN until it is mounted again."
                " Needs Linux 5.6+, root, and pidfd_getfd allowed by any syscall filter"
                " (systemd: SystemCallFilter=... pidfd_getfd)", os.strerror(err))


def grab(pid: int) -> int | None:
    """A dup (close-on-exec) of process ``pid``'s FUSE connection, or None (said why at
    DEBUG: no connection, another kernel; a refusal once at WARNING)."""
    nr = SYS_PIDFD_GETFD.get(os.uname().machine)
    target = find(pid)
    if nr is None or target is None:
        log.debug("pid %d: no FUSE connection to hold", pid)
        return None
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as e:
        log.debug("pid %d: pidfd_open: %s", pid, e)
        return None
    try:
        call = libc().syscall
        call.restype = ctypes.c_long
        fd = int(call(ctypes.c_long(nr), ctypes.c_int(pidfd), ctypes.c_int(target),
                      ctypes.c_uint(0)))
        if fd < 0:
            _refused(pid, ctypes.get_errno())
            return None
    finally:
        os.close(pidfd)
    try:
        if os.readlink(f"/proc/self/fd/{fd}") != "/dev/fuse":  # the fd was reused meanwhile
            os.close(fd)
            return None
    except OSError:
        os.close(fd)
        return None
    return fd  # pidfd_getfd sets O_CLOEXEC itself


def adoptable(cfg: Any, pid: int) -> bool:
    """Whether a new process can serve crashed mount process ``pid``'s held connection:
    it left its handle table (casfs.view.op_restore.state_paths; a view that keeps no
    state leaves none), and its mount is still on top where it served (the mount
    table only: the mount itself is not touched, it would wait). ``cfg``: its
    MountConfig or HostConfig (mountpoint, run_dir, name)."""
    from casfs.node import guard, handover
    from casfs.view.op_restore import state_paths

    if not state_paths(cfg.run_dir, cfg.name, pid)[1].exists():
        return False

    def fuse_on_top(path: Path) -> bool:
        top = handover.top(path)
        return top is not None and not guard.is_guard(top) and guard.our_fuse(top)

    if fuse_on_top(cfg.mountpoint):
        return True
    if getattr(cfg, "mode", None) != "overlay":
        return False
    # Overlay mode: the kernel's overlay is still mounted (a crash leaves it) over the
    # FUSE layer the process served, on the plain layers (the only ones it journals).
    from casfs.view.overlay import OverlayPaths

    top = handover.top(cfg.mountpoint)
    return (top is not None and top.fstype == "overlay"
            and fuse_on_top(OverlayPaths(cfg.upper, cfg.overlay_base, cfg.overlay_work).fuse))
