"""Waiting for one fd to become readable, whatever its number.

``select.select`` raises ValueError for an fd >= 1024 (FD_SETSIZE), and mount
processes lift their RLIMIT_NOFILE far above that; poll has no such limit.
"""

from __future__ import annotations

import math
import select


def readable(fd: int, timeout: float | None) -> bool:
    """True once ``fd`` is readable (or at EOF, or a pidfd's process exited); False
    after ``timeout`` seconds (None: no limit)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
    return bool(p.poll(ms))
