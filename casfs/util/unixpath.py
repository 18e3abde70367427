"""Unix socket paths of any length: sun_path holds 108 bytes, a state dir may be longer.

A path too long to bind or connect to directly is reached through its directory's
fd: ``/proc/self/fd/<fd>/<name>`` is short, and the kernel resolves it to the same
directory (a state dir under a deep job or CI path failed every mount with "AF_UNIX
path too long", and casfs run fell back to private caches).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

SUN_PATH_MAX = 107  # bytes, without the terminating NUL


@contextlib.contextmanager
def reachable(path: str | Path) -> Iterator[str]:
    """A path naming ``path`` that fits sun_path, valid inside the ``with``."""
    text = os.fspath(path)
    if len(os.fsencode(text)) <= SUN_PATH_MAX:
        yield text
        return
    fd = os.open(os.path.dirname(text) or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{os.path.basename(text)}"
    finally:
        os.close(fd)
