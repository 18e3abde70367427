"""Directory changes: mkdir, mknod, symlink, link, unlink, rmdir, rename, readdir."""

from __future__ import annotations

import errno
import stat

import pyfuse3

from casfs.view.handleslots import DIR
from casfs.view.layers import split
from casfs.view.op_base import Unopened, err, fuse_errors, link_key, sync_handler
from casfs.view.op_copyup import CopyUpOps
from casfs.view.whiteout import WHITEOUT_DEV


class DirOps(CopyUpOps):
    @sync_handler
    def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = self._new_child(parent_inode, name)
        parent_st = self._prepare_new(path)
        created = self._initial_perm(ctx, mode, 0o700)
        self.layers.mkdir(path, created, new=True)  # _prepare_new: nothing showed there
        self._own(path, ctx, stat.S_IFDIR | stat.S_IMODE(mode), created, parent_st)
        if self.layers.lower_lookup(path) is not None:
            self.layers.make_opaque(path)  # re-created over a removed lower dir: starts empty
        self._forget_negative(parent_inode, name)
        self.tracker.named(path)
        return self._entry_reply(path)

    @sync_handler
    def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        if stat.S_ISCHR(mode) and rdev == WHITEOUT_DEV:
            raise err(errno.EPERM)  # the 0/0 device is the whiteout marker (docs/format.md)
        path = self._new_child(parent_inode, name)
        self._prepare_new(path)
        created = self._initial_perm(ctx, mode, 0o600)
        # The kernel already checked the caller's CAP_MKNOD for device nodes.
        self.layers.mknod(path, stat.S_IFMT(mode) | created, rdev)
        self._own(path, ctx, mode, created)
        if stat.S_ISREG(mode):
            self.tracker.modified(path)
        else:
            self.tracker.named(path)
        self._forget_negative(parent_inode, name)
        return self._entry_reply(path)

    @sync_handler
    def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = self._new_child(parent_inode, name)
        self._prepare_new(path)
        self.layers.symlink(target, path)
        self._own(path, ctx, stat.S_IFLNK, 0)
        self._forget_negative(parent_inode, name)
        self.tracker.named(path)
        return self._entry_reply(path)

    @fuse_errors
    async def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        """A hard link in the upper; a lower file is copied up first, as overlayfs does."""
        path = self._path(inode)
        node = self._resolve(path)
        if node.is_dir:
            raise err(errno.EPERM)
        new = self._new_child(new_parent_inode, new_name)
        self._prepare_new(new)
        if node.lower_file is not None:
            await self._copy_up(node)
            self._invalidate_entry(path)  # its long lower timeouts no longer hold
            self._not_moved(path, new)
            node = self._resolve(path)
            self._prepare_new(new)  # the copy-up awaited: check the name again
        self.layers.link(path, new)
        self.tracker.named(new)
        st = self.layers.lstat(new)
        self.inodes.add_name(inode, new, (st.st_dev, st.st_ino))
        self.inodes.lookup(new)  # the reply counts as a lookup of the inode
        if stat.S_ISREG(st.st_mode):
            self.tracker.modified(new)
        self._forget_negative(new_parent_inode, new_name)
        return self._upper_attrs(st, inode)


    @sync_handler
    def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = self._child(parent_inode, name)
        node = self._resolve(path)
        if node.is_dir:
            raise err(errno.EISDIR)
        if self._needs_whiteout(path):
            # Renamed over the upper file (if any): the lower entry never shows in between.
            self.layers.add_whiteout(path, self.dir_mode)
        elif node.upper is not None:
            self.layers.unlink(path)
        self.inodes.detach(path)
        self.tracker.removed(path)

    @sync_handler
    def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = self._child(parent_inode, name)
        node = self._resolve(path)
        if not node.is_dir:
            raise err(errno.ENOTDIR)
        if node.upper is not None and not node.has_lower_dir:
            # Only its upper entries can show (no lower directory is merged in): the
            # upper's own rmdir tells empty from not, with no listing (a Triton put's
            # temporary dir, and removedirs's ENOTEMPTY of the key dir after it). A
            # directory holding only whiteouts is empty to the job: cleared, removed;
            # while this view made no whiteout, the upper holds none to look for.
            if not self.layers.rmdir_if_empty(path):
                if not self.layers.whiteouts_possible or self.layers.holds_visible(path):
                    raise err(errno.ENOTEMPTY)
                self.layers.clear_markers(path)
                self.layers.rmdir(path)
        else:
            if self.layers.children(node):
                raise err(errno.ENOTEMPTY)
            if node.upper is not None:
                self.layers.clear_markers(path)
                self.layers.rmdir(path)
        if self._needs_whiteout(path):
            self.layers.add_whiteout(path, self.dir_mode)
        self.inodes.detach(path)
        self.tracker.removed(path)

    @fuse_errors
    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise err(errno.EINVAL)
        old = self._child(parent_inode_old, name_old)
        new = self._new_child(parent_inode_new, name_new)
        src = self._resolve(old)
        if old == new:
            return
        dst = self.layers.resolve(new)
        if dst is not None:
            if flags & pyfuse3.RENAME_NOREPLACE:
                raise err(errno.EEXIST)
            if src.is_dir and not dst.is_dir:
                raise err(errno.ENOTDIR)
            if dst.is_dir and not src.is_dir:
                raise err(errno.EISDIR)
            if dst.is_dir and self.layers.children(dst):
                raise err(errno.ENOTEMPTY)
        if src.is_dir and new.startswith(old + "/"):
            raise err(errno.EINVAL)
        # Materialize the source wholly in upper so it can move as one real rename.
        if src.is_dir:
            if src.has_lower_dir:
                await self._copy_up_tree(src)
                self._not_moved(old, new)  # it awaited: a directory above may be a link now
                self.layers.make_opaque(old)
            elif self.layers.lower_lookup(new) is not None:
                self.layers.make_opaque(old)  # must not merge with lower entries at ``new``
        elif src.lower_file is not None:
            await self._copy_up(src)
            self._not_moved(old, new)
        if dst is not None and dst.is_dir and dst.upper is not None:
            self.layers.clear_markers(new)
        self.layers.ensure_upper_dir(split(new)[0], self.dir_mode)
        self.layers.remove_whiteout(new)
        whiteout_old = self._needs_whiteout(old)
        self.layers.rename(old, new)
        if whiteout_old:
            self.layers.add_whiteout(old, self.dir_mode)
        self.inodes.rename(old, new)
        self.tracker.renamed(old, new)
        self._forget_negative(parent_inode_new, name_new)


    @sync_handler
    def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        node = self._resolve(self._path(inode))
        if not node.is_dir:
            raise err(errno.ENOTDIR)
        fh = self.slots.alloc(inode, DIR)
        # Snapshot at opendir: offsets stay meaningful while the directory changes.
        self._dirs[fh] = (node.path, [name for name, _ in self.layers.children(node)])
        return fh

    @sync_handler
    def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        listing = self._dirs.get(fh)
        if listing is None:
            if fh in self.slots.held:
                raise Unopened(fh)
            raise err(errno.EBADF)
        path, names = listing
        prefix = f"{path}/" if path else ""
        resolve, inodes = self.layers.resolve, self.inodes  # per entry: no attribute lookups
        for i in range(start_id, len(names)):
            name = names[i]
            cpath = prefix + name
            node = resolve(cpath)
            if node is None:
                continue  # removed since opendir
            key = link_key(node) if node.upper is not None else None
            ino = inodes.ino(cpath, key)
            attrs = self._attrs(node, ino)
            # os.fsencode's own encoding (UTF-8, surrogateescape), without its checks
            if not pyfuse3.readdir_reply(token, name.encode("utf-8", "surrogateescape"),
                                         attrs, i + 1):
                inodes.drop_if_unused(ino)
                return
            inodes.lookup(cpath, key)  # readdirplus counts as a lookup

    async def releasedir(self, fh: int) -> None:
        if self._dirs.pop(fh, None) is not None or fh in self.slots.held:
            self.slots.free(fh)

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        return None

