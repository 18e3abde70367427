"""Names and attributes: lookup, forget, getattr, setattr, readlink, statfs."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Sequence

import pyfuse3

from casfs.view.op_base import err, fuse_errors, link_key, sync_handler
from casfs.view.op_copyup import CopyUpOps


class AttrOps(CopyUpOps):
    # Called with each path a lookup found in no layer (casfs.node.compiletime: the first
    # miss of an entry starts its compile time); None: nobody asks.
    on_lookup_miss: Callable[[str], None] | None = None

    @sync_handler
    def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        node = self.layers.resolve(path)
        if node is None:
            self.counters.inc("lookup_miss")
            if self.on_lookup_miss is not None:
                self.on_lookup_miss(path)
            return self._negative_reply(parent_inode, name, path)
        self.counters.inc("lookup_upper" if node.upper is not None else "lookup_lower")
        return self._attrs(node, self.inodes.lookup(path, link_key(node)))

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for ino, n in inode_list:
            self.inodes.forget(ino, n)
            if ino in self._negative and self.inodes.last_path(ino) is None:
                self._forget_negatives_under(ino)

    @sync_handler
    def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        path = self.inodes.path(inode)
        if path is None:  # unlinked but still open: answer from the open fd
            for h in self._handles.values():
                if h.ino == inode:
                    return self._upper_attrs(os.fstat(h.fd), inode)
            raise err(errno.ENOENT)
        return self._attrs(self._resolve(path), inode)

    @fuse_errors
    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        h = self._handles.get(fh) if fh is not None else None
        fd = h.fd if h is not None and h.writable else None
        path = self.inodes.path(inode)
        times_only = not (fields.update_mode or fields.update_uid or fields.update_gid
                          or fields.update_size)
        if path is None:
            if fd is None:
                for other in self._handles.values():
                    if other.ino == inode and times_only:
                        # The writeback cache flushing cached times of an unlinked,
                        # still-open file: nothing left to record them on.
                        return self._upper_attrs(os.fstat(other.fd), inode)
                raise err(errno.ENOENT)
            target: str | int = fd
        else:
            node = self._resolve(path)
            up_st = node.upper
            if (times_only and up_st is not None and not fields.update_atime
                    and stat.S_ISREG(up_st.st_mode)):
                # The writeback cache flushing the times it keeps (at close, after a
                # rename: two per Triton put): the upper file's own stat serves.
                return self._flush_times(path, up_st, inode, attr, fields, fd)
            lower = node.lower_file
            if (node.upper is None and lower is not None and times_only
                    and not fields.update_atime and attr.st_mtime_ns == lower.mtime_ns):
                # The kernel writing back times it caches (writeback cache) on a
                # lower file it never changed: no copy-up for that.
                return self._attrs(node, inode)
            if node.upper is None:
                if node.is_dir:
                    self.layers.ensure_upper_dir(path, self.dir_mode)
                else:
                    to_zero = fields.update_size and attr.st_size == 0
                    await self._copy_up(node, empty=to_zero)
                    self._invalidate_entry(path)
            target = fd if fd is not None else path  # an fd, or a path in the upper
        up = self.layers

        def stat_target() -> os.stat_result:
            return os.fstat(target) if isinstance(target, int) else up.lstat(target)

        if fields.update_mode and not stat.S_ISLNK(stat_target().st_mode):
            mode = stat.S_IMODE(attr.st_mode)
            os.fchmod(target, mode) if isinstance(target, int) else up.chmod(target, mode)
        changes = (fields.update_mode or fields.update_uid or fields.update_gid
                   or fields.update_size or fields.update_atime or fields.update_mtime)
        if fields.update_uid or fields.update_gid or not changes:
            # Nothing else to change (chown(-1, -1)): a no-op chown still sets ctime,
            # as on a local filesystem.
            uid = attr.st_uid if fields.update_uid else -1
            gid = attr.st_gid if fields.update_gid else -1
            if isinstance(target, int):
                os.fchown(target, uid, gid)
            else:
                up.lchown(target, uid, gid)
        if fields.update_size:
            before, charged = self._grow(target, attr.st_size)  # EDQUOT: beyond the bound
            try:
                if isinstance(target, int):
                    os.ftruncate(target, attr.st_size)
                else:
                    up.truncate(target, attr.st_size)
            finally:
                self._settle(target, before, charged)  # a shrink gives back
        if fields.update_atime or fields.update_mtime:
            st = stat_target()
            atime = attr.st_atime_ns if fields.update_atime else st.st_atime_ns
            mtime = attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns
            if isinstance(target, int):
                os.utime(target, ns=(atime, mtime))
            else:
                up.utime(target, (atime, mtime))
        st = stat_target()
        if path is not None:
            self.tracker.modified(path)
            for name in self.inodes.aliases(inode):  # (its other names: the same file)
                self.tracker.modified(name)
        if path is not None:
            return self._attrs(self._resolve(path), inode)  # merged dirs: their link count
        return self._upper_attrs(st, inode)

    def _flush_times(self, path: str, st: os.stat_result, inode: int,
                     attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                     fd: int | None) -> pyfuse3.EntryAttributes:
        """A times-only SETATTR of an upper file: one utime, none when the mtime asked
        is the one it has (the flush after a rename repeats the one at close)."""
        if fields.update_mtime and attr.st_mtime_ns != st.st_mtime_ns:
            times = (st.st_atime_ns, attr.st_mtime_ns)
            if fd is not None:
                os.utime(fd, ns=times)
                st = os.fstat(fd)
            else:
                self.layers.utime(path, times)
                st = self.layers.lstat(path)
            self.tracker.modified(path)
        elif not fields.update_mtime:
            # ctime alone (chown(-1, -1) sets it, as on a local filesystem)
            if fd is not None:
                os.fchown(fd, -1, -1)
            else:
                self.layers.lchown(path, -1, -1)
            st = os.fstat(fd) if fd is not None else self.layers.lstat(path)
            self.tracker.modified(path)
        return self._upper_attrs(st, inode)

    @sync_handler
    def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        return self.layers.readlink(self._path(inode))


    @sync_handler
    def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        s = os.statvfs(self.layers.fd)
        d = pyfuse3.StatvfsData()
        d.f_bsize = s.f_bsize
        d.f_frsize = s.f_frsize
        d.f_blocks = s.f_blocks
        d.f_bfree = s.f_bfree
        d.f_bavail = s.f_bavail
        d.f_files = s.f_files
        d.f_ffree = s.f_ffree
        d.f_favail = s.f_favail
        d.f_namemax = s.f_namemax
        return d
