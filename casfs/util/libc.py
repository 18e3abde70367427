"""The C library, for the few calls Python's os module lacks (renameat2, syncfs, mount).

``ctypes.util.find_library("c")`` runs ``ldconfig -p`` in a subprocess on every
call (tens of ms, and a fork of a large process): the process's own symbol
table already holds libc, so it is opened once from there.
"""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def libc() -> ctypes.CDLL:
    """libc with errno kept (read it with ``ctypes.get_errno()``)."""
    return ctypes.CDLL(None, use_errno=True)
