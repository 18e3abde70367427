"""A tiny real pyfuse3 filesystem for tests/view/test_adopt.py (run as a process).

``serve MNT SOCK``: mounts MNT and sends a dup of its /dev/fuse fd over the
inherited socket SOCK (the supervisor's hold). ``adopt FD MNT HOW``: serves the
connection FD that a killed ``serve`` initialised; what the dead process had
read is ``resend`` (queued again) or ``interrupt`` (answered EINTR). Every file reads as its
generation's tag ("A" or "B") six times; ``slow`` never answers in generation
A, so a read of it is in flight when that process is killed.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import sys

import pyfuse3
import trio

from casfs.view.adopt import Adoption

NAMES = {b"hello": 2, b"slow": 3}


class Ops(pyfuse3.Operations):
    def __init__(self, tag: bytes, adoption: Adoption | None = None,
                 how: str = "resend") -> None:
        super().__init__()
        self.tag = tag
        self.adoption = adoption
        self.how = how

    def init(self) -> None:
        if self.adoption is not None:
            self.adoption.take_over()
            if self.how == "resend":
                print(json.dumps({"how": self.adoption.recover_lost(5.0)}), flush=True)
            else:
                first = self.adoption.answer_lost(timeout=5.0)
                print(json.dumps({"how": "interrupted", "first": first}), flush=True)

    async def getattr(self, inode: int, ctx: object = None) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = inode
        e.attr_timeout = e.entry_timeout = 0
        if inode == pyfuse3.ROOT_INODE:
            e.st_mode = stat.S_IFDIR | 0o755
        else:
            e.st_mode = stat.S_IFREG | 0o644
            e.st_size = 6
        return e

    async def lookup(self, parent: int, name: bytes, ctx: object = None
                     ) -> pyfuse3.EntryAttributes:
        if parent != pyfuse3.ROOT_INODE or name not in NAMES:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return await self.getattr(NAMES[name])

    async def open(self, inode: int, flags: int, ctx: object) -> pyfuse3.FileInfo:
        return pyfuse3.FileInfo(fh=inode, direct_io=True)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        if fh == NAMES[b"slow"] and self.tag == b"A":
            await trio.sleep_forever()
        return (self.tag * 6)[off:off + size]


def main() -> None:
    if sys.argv[1] == "serve":
        mnt, sock = sys.argv[2], int(sys.argv[3])
        pyfuse3.init(Ops(b"A"), mnt, {"fsname=adopttest", "allow_other"})
        fd = next(int(n) for n in os.listdir("/proc/self/fd")
                  if os.readlink(f"/proc/self/fd/{n}") == "/dev/fuse")
        socket.send_fds(socket.socket(fileno=sock), [b"fd"], [fd])
    else:
        held, mnt, how = int(sys.argv[2]), sys.argv[3], sys.argv[4]
        adoption = Adoption(held)
        pyfuse3.init(Ops(b"B", adoption, how), adoption.mountpoint(), {"fsname=adopttest"})
        adoption.probe(mnt)
    trio.run(pyfuse3.main)
    pyfuse3.close(unmount=False)


if __name__ == "__main__":
    main()
