"""The pyfuse3 floor: the cheapest read-only pyfuse3 filesystem, for reference rows.

    python -m bench.floorfs SRC MOUNTPOINT

Loads every file under SRC into memory, mounts it read-only and prints ``READY``
on stdout once mounted; unmounts on SIGTERM/SIGINT. Everything a FUSE filesystem
can do to be fast from Python is done: day-long entry/attr timeouts,
``keep_cache`` on every open, FLUSH answered ENOSYS (the kernel then stops
sending it), no work per OPEN beyond a dict lookup, no threads. What is left is
pyfuse3's own cost per request: what casfs's FUSE mode can at best approach.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import sys
from pathlib import Path

import pyfuse3
import trio

DAY = 86400.0


class FloorFS(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, src: Path) -> None:
        super().__init__()
        self.data: dict[int, bytes] = {}
        self.children: dict[int, dict[bytes, int]] = {pyfuse3.ROOT_INODE: {}}
        self.attrs: dict[int, pyfuse3.EntryAttributes] = {}
        self._next = pyfuse3.ROOT_INODE + 1
        self.attrs[pyfuse3.ROOT_INODE] = self._attr(pyfuse3.ROOT_INODE, os.lstat(src))
        self._load(src, pyfuse3.ROOT_INODE)

    def _attr(self, ino: int, st: os.stat_result, size: int | None = None
              ) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = st.st_mode
        a.st_nlink = 1 if stat.S_ISREG(st.st_mode) else 2
        a.st_uid, a.st_gid = st.st_uid, st.st_gid
        a.st_size = st.st_size if size is None else size
        a.st_blksize = 4096
        a.st_blocks = (a.st_size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = st.st_mtime_ns
        a.entry_timeout = a.attr_timeout = DAY
        a.generation = 0
        return a

    def _load(self, d: Path, parent: int) -> None:
        for e in os.scandir(d):
            ino = self._next
            self._next += 1
            st = e.stat(follow_symlinks=False)
            self.children[parent][os.fsencode(e.name)] = ino
            if e.is_dir(follow_symlinks=False):
                self.children[ino] = {}
                self.attrs[ino] = self._attr(ino, st)
                self._load(Path(e.path), ino)
            elif e.is_file(follow_symlinks=False):
                self.data[ino] = Path(e.path).read_bytes()
                self.attrs[ino] = self._attr(ino, st, len(self.data[ino]))

    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
                     ) -> pyfuse3.EntryAttributes:
        ino = self.children.get(parent_inode, {}).get(name)
        if ino is None:
            a = pyfuse3.EntryAttributes()
            a.st_ino = 0  # a negative entry, cached like a positive one
            a.entry_timeout = DAY
            return a
        return self.attrs[ino]

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self.attrs[inode]

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        items = list(self.children[fh].items())
        for i in range(start_id, len(items)):
            name, ino = items[i]
            if not pyfuse3.readdir_reply(token, name, self.attrs[ino], i + 1):
                return

    async def releasedir(self, fh: int) -> None:
        return None

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext
                   ) -> pyfuse3.FileInfo:
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise pyfuse3.FUSEError(errno.EROFS)
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return self.data[fh][off:off + size]

    async def flush(self, fh: int) -> None:
        raise pyfuse3.FUSEError(errno.ENOSYS)

    async def release(self, fh: int) -> None:
        return None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    fs = FloorFS(Path(argv[0]))
    pyfuse3.init(fs, argv[1], {"fsname=casfs-floor", "ro", "default_permissions"})
    return serve()


def serve(min_tasks: int = 1, max_tasks: int = 99) -> int:
    """Run the initialised pyfuse3 session: ``READY`` on stdout once serving, unmount
    on SIGTERM/SIGINT (the floors' shared main loop)."""

    async def run() -> None:
        async with trio.open_nursery() as n:
            async def stop_on_signal() -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
                    async for _ in sigs:
                        pyfuse3.terminate()
                        return

            n.start_soon(stop_on_signal)
            print("READY", flush=True)
            await pyfuse3.main(min_tasks=min_tasks, max_tasks=max_tasks)
            n.cancel_scope.cancel()

    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
