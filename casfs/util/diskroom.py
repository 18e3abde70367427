"""Room on the node's state filesystem: what stays free for the node index.

The node index (LMDB) and the local object cache share the state filesystem
with fuse mode's uppers. Whatever grows there on a tenant's behalf (an upper
file, an object fetched for a read) is refused once it would leave less than
the reserve free, so an index commit always finds room (casfs.view.quota,
casfs.index.objcache, docs/security.md).
"""

from __future__ import annotations

import errno
import functools
import os
from pathlib import Path

GiB = 1 << 30


def _existing(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def fs_size(path: str | os.PathLike[str]) -> int:
    """Size of the filesystem holding ``path`` (or its nearest existing ancestor)."""
    s = os.statvfs(_existing(path))
    return s.f_blocks * s.f_frsize


def free_bytes(path: str | os.PathLike[str]) -> int:
    s = os.statvfs(_existing(path))
    return s.f_bavail * s.f_frsize


def default_reserve(path: str | os.PathLike[str]) -> int:
    """min(max(1 GiB, 5%), 10%) of the filesystem: 1 GiB from 10 to 20 GiB, 5% above,
    a tenth of a small one (a test's tmpfs)."""
    size = fs_size(path)
    return min(max(GiB, size // 20), size // 10)


@functools.lru_cache(maxsize=64)
def cached_default_reserve(path: str) -> int:
    return default_reserve(path)


def check_room(path: str | os.PathLike[str], size: int, reserve: int | None = None) -> None:
    """ENOSPC unless ``size`` more bytes leave ``reserve`` (default: ``default_reserve``)
    free on the filesystem of ``path``."""
    if reserve is None:
        reserve = cached_default_reserve(os.fspath(path))
    if reserve <= 0:
        return
    free = free_bytes(path)
    if free - size < reserve:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {free} bytes free,"
                                    f" {reserve} kept for the node index", os.fspath(path))
