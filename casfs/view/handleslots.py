"""File and directory handle numbers, each recorded where a crashed process's adopter reads it.

The kernel names an open file by the ``fh`` its OPEN got and sends nothing
else with a READ or WRITE. A process that adopts a crashed mount's connection
(casfs.view.adopt) must therefore learn, for each fh the dead process gave
out, which inode it opened and how: then it can open the file again on first
use. Every handle is a slot in a table of fixed 16-byte records, and ``fh``
is the slot's number + 1; with a ``path`` the table lives in a shared mapping
of that file (root-only run dir), so a record is a memory store, no system
call, and a crash loses nothing stored (the page cache outlives the process).

Record: ``<QI4x``: the inode (u64), the kind (u32: 0 free, FILE_RO, FILE_RW,
DIR). Slots are reused once released (the kernel forgets an fh at RELEASE).
The file is docs/format.md's "Handle table".
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import struct
from pathlib import Path

log = logging.getLogger(__name__)

FREE, FILE_RO, FILE_RW, DIR = 0, 1, 2, 3
_REC = struct.Struct("<QI4x")
_FIRST = 4096  # slots: 64 KiB of table; doubled when full
_FLAGS = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW


class HandleSlots:
    """Handle numbers for one view; ``path``: kept in that file (None: in memory only).

    ``restore_from``: the file a crashed process left is read (``held``: fh ->
    (ino, kind) of each handle it gave out) and its slots stay taken until released.
    """

    def __init__(self, path: Path | None = None, *, restore_from: Path | None = None) -> None:
        self.path = path
        self._free: list[int] = []
        self._next = 0
        self.held: dict[int, tuple[int, int]] = {}
        self._mm: mmap.mmap | None = None
        self._fd = -1
        if path is None:
            return
        if restore_from is not None:
            with open(restore_from, "rb") as f:
                old = f.read()
            for i in range(len(old) // _REC.size):
                ino, kind = _REC.unpack_from(old, i * _REC.size)
                if kind != FREE:
                    self.held[i + 1] = (ino, kind)
            self._next = max(self.held, default=0)
            self._free = [i for i in range(self._next) if i + 1 not in self.held]
        # A new file, never an old one truncated: a process that is handing over may
        # still have it mapped (a truncated mapping faults: SIGBUS).
        path.unlink(missing_ok=True)
        self._fd = os.open(path, _FLAGS | os.O_CREAT | os.O_EXCL, 0o600)
        slots = _FIRST
        while slots < self._next:
            slots *= 2
        try:
            # Its blocks allocated now: a store to a page of a sparse file on a full disk
            # is a SIGBUS, which kills the mount process (every job's mount with it).
            _allocate(self._fd, 0, slots * _REC.size)
        except OSError as e:
            self._unkept(e)
            return
        self._mm = mmap.mmap(self._fd, slots * _REC.size)
        for fh, (ino, kind) in self.held.items():
            _REC.pack_into(self._mm, (fh - 1) * _REC.size, ino, kind)

    def _unkept(self, e: OSError) -> None:
        """The table cannot be kept in its file (a full disk): in memory from now on, the
        file removed, so that no adopter reads a table that misses handles (an adopting
        process then refuses, and the mount starts again: jobs see the restart)."""
        log.warning("handle table %s: %s; kept in memory only (a crash of this mount"
                    " process cannot be adopted)", self.path, e.strerror or e)
        self.close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None

    def alloc(self, ino: int, kind: int) -> int:
        """A free handle number, recorded as ``kind`` of ``ino``."""
        i = self._free.pop() if self._free else self._take()
        if self._mm is not None:
            _REC.pack_into(self._mm, i * _REC.size, ino, kind)
        return i + 1

    def _take(self) -> int:
        i = self._next
        self._next += 1
        mm = self._mm
        if mm is not None and (i + 1) * _REC.size > len(mm):
            try:
                _allocate(self._fd, len(mm), len(mm))  # as at the start: never sparse
                mm.resize(len(mm) * 2)  # the file grows with it
            except OSError as e:
                self._unkept(e)
        return i

    def free(self, fh: int) -> None:
        i = fh - 1
        if self._mm is not None:
            _REC.pack_into(self._mm, i * _REC.size, 0, FREE)
        self.held.pop(fh, None)
        self._free.append(i)

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _allocate(fd: int, offset: int, length: int) -> None:
    """Give ``fd``'s bytes [offset, offset + length) disk blocks (zeros), growing the
    file; OSError (ENOSPC) if the disk cannot hold them."""
    try:
        os.posix_fallocate(fd, offset, length)
        return
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
    zeros = memoryview(bytes(length))  # no fallocate here: zeros written take blocks
    while zeros:
        offset += (n := os.pwrite(fd, zeros, offset))
        zeros = zeros[n:]
