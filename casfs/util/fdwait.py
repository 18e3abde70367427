"""Waiting for one fd to become readable, whatever its number.

``select.select`` raises ValueError for an fd >= 1024 (FD_SETSIZE), and mount
processes lift their RLIMIT_NOFILE far above that; poll has no such limit.
"""

from __future__ import annotations

import math
import os
import select
import subprocess
from typing import Any


def readable(fd: int, timeout: float | None) -> bool:
    """True once ``fd`` is readable (or at EOF, or a pidfd's process exited); False
    after ``timeout`` seconds (None: no limit)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
    return bool(p.poll(ms))


def wait_exit(proc: subprocess.Popen[Any], timeout: float) -> int:
    """``proc.wait(timeout)``, woken by the exit itself (a pidfd) rather than by Popen's
    polling, which sleeps up to 50 ms between looks once a wait has lasted ~0.1 s:
    ``casfs run`` waited 20-60 ms more for its mount process after every job.
    Raises subprocess.TimeoutExpired as ``wait`` does."""
    if proc.returncode is None:
        try:
            fd = os.pidfd_open(proc.pid)
        except OSError:  # reaped already, or no pidfds here: Popen's own wait
            fd = -1
        if fd >= 0:
            try:
                if not readable(fd, timeout):
                    raise subprocess.TimeoutExpired(proc.args, timeout)
            finally:
                os.close(fd)
    return proc.wait(timeout)
