"""A tenant's FUSE server that stops answering: ``python -m tests.security.hangfs
MOUNTPOINT FLAGFILE [UID]``.

Mounted with ``allow_other`` (what a user may do where /etc/fuse.conf has
``user_allow_other``), so root's calls into it reach it. It serves a root (a
directory, or a regular file when MOUNTPOINT is a file) holding one file ``k``
until FLAGFILE exists; from then on every request waits for ever, as a hostile
server's would. Only aborting the connection (/sys/fs/fuse/connections) frees
a caller: see ``abort``.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path

import pyfuse3
import trio

ROOT, FILE = pyfuse3.ROOT_INODE, pyfuse3.ROOT_INODE + 1


class HangFS(pyfuse3.Operations):
    def __init__(self, root_mode: int, flag: str) -> None:
        super().__init__()
        self.root_mode, self.flag, self.data = root_mode, flag, b"hers\n"

    async def _gate(self) -> None:
        if os.path.exists(self.flag):
            await trio.sleep_forever()

    def _attr(self, inode: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode
        a.st_mode = self.root_mode if inode == ROOT else stat.S_IFREG | 0o666
        a.st_size = len(self.data) if inode != ROOT or stat.S_ISREG(self.root_mode) else 0
        a.st_nlink = 1
        a.attr_timeout = a.entry_timeout = 0  # every call reaches the server
        return a

    async def getattr(self, inode: int, ctx: object = None) -> pyfuse3.EntryAttributes:
        await self._gate()
        return self._attr(inode)

    async def lookup(self, parent: int, name: bytes, ctx: object = None
                     ) -> pyfuse3.EntryAttributes:
        await self._gate()
        if parent == ROOT and name == b"k":
            return self._attr(FILE)
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def setattr(self, inode: int, attr: object, fields: object, fh: object,
                      ctx: object) -> pyfuse3.EntryAttributes:
        await self._gate()
        return self._attr(inode)

    async def opendir(self, inode: int, ctx: object) -> int:
        await self._gate()
        return inode

    async def readdir(self, fh: int, start_id: int, token: object) -> None:
        await self._gate()
        if start_id == 0 and not stat.S_ISREG(self.root_mode):
            pyfuse3.readdir_reply(token, b"k", self._attr(FILE), 1)

    async def open(self, inode: int, flags: int, ctx: object) -> pyfuse3.FileInfo:
        await self._gate()
        return pyfuse3.FileInfo(fh=inode, direct_io=True)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        await self._gate()
        return self.data[off:off + size]

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        await self._gate()
        return len(buf)

    async def access(self, inode: int, mode: int, ctx: object) -> bool:
        await self._gate()
        return True

    async def statfs(self, ctx: object) -> pyfuse3.StatvfsData:
        await self._gate()
        return pyfuse3.StatvfsData()


def abort(mountpoint: Path) -> None:
    """Free every caller waiting on the server at ``mountpoint`` (ENOTCONN), and detach
    it. Its connection is found by the device of the mount's root, read without asking
    the server (casfs.util.statx)."""
    from casfs.util import statx
    try:
        dev = statx.ident(statx.AT_FDCWD, str(mountpoint)).dev
    except OSError:
        return
    found = statx.fs_type(dev)
    if os.major(dev) != 0 or found is None or found[0] != "fuse.hangfs":
        return  # not (or no longer) ours: never another test's connection
    conn = Path(f"/sys/fs/fuse/connections/{os.minor(dev)}/abort")
    if conn.exists():
        conn.write_text("1")
    os.system(f"umount -l {mountpoint} 2>/dev/null")


def main() -> None:
    mountpoint, flag = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 3:  # mounted as this uid (its user_id=), as fusermount3 would
        uid = int(sys.argv[3])  # for her: root's effective ids kept for mount(2) itself
        os.setresuid(uid, 0, 0)
    root_mode = (stat.S_IFREG | 0o666 if os.path.isfile(mountpoint)
                 else stat.S_IFDIR | 0o777)
    pyfuse3.init(HangFS(root_mode, flag), mountpoint,
                 {"fsname=hangfs", "allow_other", "subtype=hangfs"})
    print("mounted", flush=True)
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=False)


if __name__ == "__main__":
    main()
