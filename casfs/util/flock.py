"""One non-blocking flock for every lock file casfs takes."""

from __future__ import annotations

import errno
import fcntl


def try_flock(fd: int, how: int = fcntl.LOCK_EX) -> bool:
    """Take ``how`` (LOCK_EX or LOCK_SH) on ``fd`` without blocking; False when another
    process holds a lock that excludes it. Other errors raise."""
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True
