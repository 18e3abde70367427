"""The pyfuse3 write floor: the leanest writable pyfuse3 passthrough, for reference rows.

    python -m bench.floorwfs [--tasks MIN,MAX] SRC MOUNTPOINT

Serves the local directory SRC at MOUNTPOINT, read-write, and prints ``READY``
on stdout once mounted; unmounts on SIGTERM/SIGINT. It faces the kernel the way
casfs's FUSE view does (casfs.view.session, casfs.view.op_*): the same mount
options (``default_permissions``, ``nodev``), the writeback cache, hour-long
entry/attr timeouts (1 s on the root), misses answered as cached negative
entries, FLUSH answered ENOSYS, write-only opens given a read-write fd, inode
numbers of its own that are never reused. So a Triton put sends it the same
requests as casfs (``python -m bench.fusecount write N --floor``), and it does
for each only the upper's own syscall plus a dict or two: no layers, no
whiteouts, no tracker, no counters, no threads. What a put costs it is
pyfuse3's (and trio's) own cost per request plus the syscalls a plain directory
pays too: the floor casfs's FUSE writes can at best approach.

``--tasks MIN,MAX``: ``pyfuse3.main(min_tasks, max_tasks)`` (default 1,99, as casfs).
Hard links, xattrs, mknod and symlinks are not served (a put uses none of them).
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

import pyfuse3

from bench.floorfs import serve

HOUR = 3600.0
ROOT_TIMEOUT = 1.0  # as casfs: stat of the mount point must reach the daemon


def _err(e: OSError) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(e.errno or errno.EIO)


class FloorWFS(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = True  # as casfs's view
    enable_acl = False

    def __init__(self, src: Path) -> None:
        super().__init__()
        self.path: dict[int, bytes] = {pyfuse3.ROOT_INODE: os.fsencode(src)}
        self.ino: dict[bytes, int] = {self.path[pyfuse3.ROOT_INODE]: pyfuse3.ROOT_INODE}
        self.count: dict[int, int] = {}
        self.isdir: set[int] = set()  # known directories (a rename moves their subtree)
        self.dirs: dict[int, list[bytes]] = {}
        self._next = pyfuse3.ROOT_INODE + 1
        self._next_dir = 1
        self.owner = (os.geteuid(), os.getegid())
        os.umask(0)  # modes exactly as asked (the kernel applied the caller's umask)

    # --- inodes -------------------------------------------------------------
    def _attrs(self, st: os.stat_result, ino: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.generation = 0
        a.entry_timeout = a.attr_timeout = ROOT_TIMEOUT if ino == pyfuse3.ROOT_INODE else HOUR
        a.st_mode = st.st_mode
        a.st_nlink = st.st_nlink
        a.st_uid = st.st_uid
        a.st_gid = st.st_gid
        a.st_rdev = st.st_rdev
        a.st_size = st.st_size
        a.st_blksize = st.st_blksize
        a.st_blocks = st.st_blocks
        a.st_atime_ns = st.st_atime_ns
        a.st_mtime_ns = st.st_mtime_ns
        a.st_ctime_ns = st.st_ctime_ns
        return a

    def _entry(self, path: bytes, st: os.stat_result) -> pyfuse3.EntryAttributes:
        """The reply to a lookup (or mkdir/create/readdirplus): counts one lookup."""
        ino = self.ino.get(path)
        if ino is None:
            ino = self._next
            self._next += 1
            self.ino[path] = ino
            self.path[ino] = path
            if stat.S_ISDIR(st.st_mode):
                self.isdir.add(ino)
        self.count[ino] = self.count.get(ino, 0) + 1
        return self._attrs(st, ino)

    def _detach(self, path: bytes) -> None:
        """``path`` is gone (unlink, rmdir, replaced): its inode keeps no name."""
        ino = self.ino.pop(path, None)
        if ino is not None:
            del self.path[ino]

    def _p(self, ino: int) -> bytes:
        p = self.path.get(ino)
        if p is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return p

    def _own(self, path: bytes, ctx: pyfuse3.RequestContext) -> None:
        if (ctx.uid, ctx.gid) != self.owner and self.owner[0] == 0:
            os.lchown(path, ctx.uid, ctx.gid)

    # --- names and attributes ------------------------------------------------
    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
                     ) -> pyfuse3.EntryAttributes:
        path = self._p(parent_inode) + b"/" + name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            a = pyfuse3.EntryAttributes()
            a.st_ino = 0  # a negative entry the kernel caches (as casfs answers misses)
            a.entry_timeout = HOUR
            return a
        except OSError as e:
            raise _err(e) from None
        return self._entry(path, st)

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for ino, n in inode_list:
            left = self.count.get(ino, 0) - n
            if left > 0:
                self.count[ino] = left
                continue
            self.count.pop(ino, None)
            self.isdir.discard(ino)
            path = self.path.pop(ino, None)
            if path is not None and self.ino.get(path) == ino:
                del self.ino[path]

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        try:
            return self._attrs(os.lstat(self._p(inode)), inode)
        except OSError as e:
            raise _err(e) from None

    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes,
                      fields: pyfuse3.SetattrFields, fh: int | None,
                      ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        target: bytes | int = fh if fh is not None else self._p(inode)
        try:
            if fields.update_mode:
                os.chmod(target, stat.S_IMODE(attr.st_mode))
            if fields.update_uid or fields.update_gid:
                os.chown(target, attr.st_uid if fields.update_uid else -1,
                         attr.st_gid if fields.update_gid else -1)
            if fields.update_size:
                os.truncate(target, attr.st_size)
            if fields.update_atime or fields.update_mtime:
                if fields.update_atime and fields.update_mtime:
                    times = (attr.st_atime_ns, attr.st_mtime_ns)
                else:
                    st = os.stat(target)
                    times = (attr.st_atime_ns if fields.update_atime else st.st_atime_ns,
                             attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns)
                os.utime(target, ns=times)
            st = os.fstat(target) if isinstance(target, int) else os.lstat(target)
        except OSError as e:
            raise _err(e) from None
        return self._attrs(st, inode)

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        s = os.statvfs(self.path[pyfuse3.ROOT_INODE])
        d = pyfuse3.StatvfsData()
        for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                  "f_ffree", "f_favail", "f_namemax"):
            setattr(d, k, getattr(s, k))
        return d

    # --- directory changes ---------------------------------------------------
    async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        path = self._p(parent_inode) + b"/" + name
        try:
            os.mkdir(path, stat.S_IMODE(mode))
            self._own(path, ctx)
            return self._entry(path, os.lstat(path))
        except OSError as e:
            raise _err(e) from None

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = self._p(parent_inode) + b"/" + name
        try:
            os.rmdir(path)
        except OSError as e:
            raise _err(e) from None
        self._detach(path)

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = self._p(parent_inode) + b"/" + name
        try:
            os.unlink(path)
        except OSError as e:
            raise _err(e) from None
        self._detach(path)

    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int,
                     name_new: bytes, flags: int, ctx: pyfuse3.RequestContext) -> None:
        if flags:
            raise pyfuse3.FUSEError(errno.EINVAL)  # RENAME_NOREPLACE/EXCHANGE: not served
        old = self._p(parent_inode_old) + b"/" + name_old
        new = self._p(parent_inode_new) + b"/" + name_new
        try:
            os.rename(old, new)
        except OSError as e:
            raise _err(e) from None
        self._detach(new)  # replaced, if it was there
        ino = self.ino.pop(old, None)
        if ino is None:
            return
        self.ino[new] = ino
        self.path[ino] = new
        if ino not in self.isdir:
            return
        prefix = old + b"/"  # a directory: its known descendants move with it
        for p in [p for p in self.ino if p.startswith(prefix)]:
            i = self.ino.pop(p)
            q = new + p[len(old):]
            self.ino[q] = i
            self.path[i] = q

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        try:
            names = sorted(os.listdir(self._p(inode)))
        except OSError as e:
            raise _err(e) from None
        fh = self._next_dir
        self._next_dir += 1
        self.dirs[fh] = [os.fsencode(n) for n in names]
        self.dirs[fh].insert(0, self._p(inode))
        return fh

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        top, *names = self.dirs[fh]
        for i in range(start_id, len(names)):
            path = top + b"/" + names[i]
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue  # removed since opendir
            a = self._entry(path, st)  # readdirplus counts as a lookup...
            if not pyfuse3.readdir_reply(token, names[i], a, i + 1):
                self.count[a.st_ino] -= 1  # ...unless the entry did not fit
                return

    async def releasedir(self, fh: int) -> None:
        self.dirs.pop(fh, None)

    # --- files ---------------------------------------------------------------
    @staticmethod
    def _flags(flags: int) -> int:
        # The writeback cache may read back any page it writes partially: a write-only
        # open gets a read-write fd; the kernel computes O_APPEND offsets itself.
        if flags & os.O_ACCMODE == os.O_WRONLY:
            flags = (flags & ~os.O_ACCMODE) | os.O_RDWR
        return (flags & ~(os.O_APPEND | os.O_NOCTTY)) | os.O_CLOEXEC

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext
                   ) -> pyfuse3.FileInfo:
        try:
            fd = os.open(self._p(inode),
                         self._flags(flags & ~(os.O_CREAT | os.O_EXCL)) | os.O_NOFOLLOW)
        except OSError as e:
            raise _err(e) from None
        return pyfuse3.FileInfo(fh=fd)

    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext
                     ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        path = self._p(parent_inode) + b"/" + name
        try:
            fd = os.open(path, self._flags(flags) | os.O_CREAT | os.O_EXCL, stat.S_IMODE(mode))
            self._own(path, ctx)
            return pyfuse3.FileInfo(fh=fd), self._entry(path, os.fstat(fd))
        except OSError as e:
            raise _err(e) from None

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return os.pread(fh, size, off)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return os.pwrite(fh, buf, off)

    async def flush(self, fh: int) -> None:
        raise pyfuse3.FUSEError(errno.ENOSYS)  # the kernel stops sending FLUSH

    async def release(self, fh: int) -> None:
        os.close(fh)


def mount_options() -> set[str]:
    """casfs.view.session.mount_options's, under another fsname."""
    return {"default_permissions", "nodev", "fsname=casfs-floorw", "subtype=casfs"}


def main(argv: list[str]) -> int:
    tasks = (1, 99)  # pyfuse3.main's defaults, which casfs uses
    if argv[:1] == ["--tasks"] and len(argv) >= 2:
        lo, hi = argv[1].split(",")
        tasks = (int(lo), int(hi))
        argv = argv[2:]
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    fs = FloorWFS(Path(argv[0]).resolve())
    pyfuse3.init(fs, argv[1], mount_options())
    return serve(*tasks)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
