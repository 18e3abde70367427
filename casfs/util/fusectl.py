"""A FUSE connection's background queue, widened through the fusectl filesystem.

The kernel sends some FUSE requests in the background: RELEASE and RELEASEDIR
after a close, the writeback cache's WRITEs, read-ahead. At most
``max_background`` of them (12 by default) are handed to the server at once;
the others wait in one queue per connection, behind every earlier one, while
foreground requests (OPEN, OPENDIR, LOOKUP, CREATE) go straight to the server.
On casfsd's shared mount that queue is every tenant's: one tenant's 40
processes opening and closing a directory in a loop left 40,000 RELEASEDIRs
waiting, and another tenant's close, whose writeback WRITE queued behind them,
took 7 s (a review, 2026-12-06). With the queue as wide as the server can take
requests, background requests reach the server in the order they came, and a
flood throttles itself: each OPENDIR waits behind its own RELEASEDIRs.

``/sys/fs/fuse/connections/<dev>/`` is root's. systemd mounts fusectl there at
boot; a container (casfsd's privileged pod) may have the directory without it,
so root mounts it there once if it is missing. Without it, or not as root,
nothing changes (logged at debug).
"""

from __future__ import annotations

import ctypes
import logging
import os

from casfs.util.libc import libc

log = logging.getLogger(__name__)

CONNECTIONS = "/sys/fs/fuse/connections"
MAX_BACKGROUND = 1024  # background requests handed to the server at once (kernel: 12)


def _device(mountpoint: str) -> int | None:
    """The kernel's device number (``major << 20 | minor``: fusectl's directory name) of
    the FUSE mount on top at ``mountpoint``, from the mount table: the mount itself is
    never asked (the caller may be its server)."""
    target = os.path.normpath(os.path.abspath(mountpoint))
    dev = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                a, b = left.split(), right.split()
                if (len(a) >= 5 and b and b[0].startswith("fuse")
                        and a[4].encode().decode("unicode_escape") == target):
                    major, _, minor = a[2].partition(":")
                    dev = int(major) << 20 | int(minor)  # the last one mounted is on top
    except (OSError, ValueError):
        return None
    return dev


def widen_background(mountpoint: str, limit: int = MAX_BACKGROUND) -> bool:
    """Set the FUSE connection at ``mountpoint`` to hand ``limit`` background requests
    to its server at once (congestion at three quarters of it); whether it was set."""
    dev = _device(mountpoint)
    if dev is None:
        log.debug("%s: no FUSE mount found to widen its background queue", mountpoint)
        return False
    conn = f"{CONNECTIONS}/{dev}"
    if not os.path.isdir(conn):
        _mount_fusectl()
    try:
        # congestion_threshold may not exceed max_background: raise that first.
        with open(f"{conn}/max_background", "w") as f:
            f.write(str(limit))
        with open(f"{conn}/congestion_threshold", "w") as f:
            f.write(str(limit * 3 // 4))
    except OSError as e:
        log.debug("%s: cannot widen its FUSE background queue (%s): %s", mountpoint, conn,
                  e)
        return False
    return True


def _mount_fusectl() -> None:
    """Mount fusectl at CONNECTIONS if nothing is there (a container's /sys): root only."""
    if os.geteuid() != 0 or not os.path.isdir(CONNECTIONS) or os.listdir(CONNECTIONS):
        return
    if libc().mount(b"fusectl", CONNECTIONS.encode(), b"fusectl", 0, None) != 0:
        e = ctypes.get_errno()
        log.debug("cannot mount fusectl at %s: %s", CONNECTIONS, os.strerror(e))
