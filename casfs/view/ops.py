"""The FUSE view: a writable overlay of the served generation (lower) and a local upper dir.

Lower entries are immutable: they get long kernel entry/attr timeouts and
``keep_cache``; their bytes come from the ObjectFetcher, in a worker thread.
Upper entries are plain files served by fd pass-through with short timeouts.
Deletions of lower entries are whiteouts in upper (casfs.view.whiteout).

Concurrency: every handler runs on the trio thread, so code between two
``await``s is atomic; only fetching, copying and fsync go to worker threads.
A copy-up is staged off-thread and linked into place on the trio thread after
re-checking the path, so a racing create/unlink is never clobbered.

A lower object that fails to fetch or verify makes its path absent for the
rest of the mount (ENOENT, a cache miss): never EIO, never wrong bytes.

Refresh: ``set_lower`` swaps in a newer generation. Negative lookups are not
cached by the kernel (ENOENT replies carry no entry timeout) and readdir is
not cached (no FOPEN_CACHE_DIR), and published paths never change bytes
(first writer wins), so newly published paths simply appear: nothing to
invalidate.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import pyfuse3
import trio

from casfs.errors import CasfsError, CorruptObjectError
from casfs.promote.tracker import WriteTracker
from casfs.store.entry import Entry
from casfs.util.counters import Counters
from casfs.view.attrs import lower_attrs, upper_attrs
from casfs.view.inodes import InodeTable
from casfs.view.layers import Layers, Node, join, split
from casfs.view.lower import LowerNode, LowerTree, ObjectFetcher
from casfs.view.whiteout import is_reserved

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S", bound="OverlayOperations")

# Flags that make no sense on the upper fd: the kernel already resolved
# creation, and it computes O_APPEND offsets itself (pwrite must not append).
_STRIP_FLAGS = os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOCTTY


def _fuse_errors(
    fn: Callable[Concatenate[S, P], Awaitable[R]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """Only FUSEError may leave a handler: OSError keeps its errno, a bug is EIO."""

    @functools.wraps(fn)
    async def wrapper(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(self, *args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except _Miss as miss:
            self._invalidate_entry(miss.path)
            raise pyfuse3.FUSEError(errno.ENOENT) from None
        except OSError as e:
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        except Exception:
            log.exception("bug in %s", fn.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


class _Miss(Exception):
    """A lower object failed to fetch: its path is now absent (ENOENT to the caller)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def _err(code: int) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(code)


@dataclass(slots=True)
class _Handle:
    fd: int
    ino: int
    path: str  # at open time; the inode table has the current one
    writable: bool
    digest: str | None  # set for a lower object: unpin on release


class OverlayOperations(pyfuse3.Operations):
    enable_writeback_cache = False

    def __init__(
        self,
        lower: LowerTree,
        fetcher: ObjectFetcher,
        upper_dir: Path,
        tracker: WriteTracker,
        counters: Counters,
        *,
        lower_timeout: float = 3600.0,
        upper_timeout: float = 1.0,
        fetch_timeout: float = 20.0,
        fetch_threads: int = 16,
        lower_dir_mode: int = 0o777,
        root_mode: int = 0o1777,
    ) -> None:
        super().__init__()
        self.layers = Layers(lower, Path(upper_dir))
        self.fetcher = fetcher
        self.tracker = tracker
        self.counters = counters
        self.lower_timeout = lower_timeout
        self.upper_timeout = upper_timeout
        self.fetch_timeout = fetch_timeout
        # Fetches get their own threads: stuck ones must not starve fsync or copy-up.
        self._fetch_limiter = trio.CapacityLimiter(fetch_threads)
        self.dir_mode = lower_dir_mode
        self.inodes = InodeTable()
        self._handles: dict[int, _Handle] = {}
        self._dirs: dict[int, tuple[str, list[str]]] = {}
        self._next_dir_fh = 1
        self._owner = (os.geteuid(), os.getegid())
        self._is_root = os.geteuid() == 0
        self._umask = os.umask(0o022)  # read it (and put it back)
        os.umask(self._umask)
        self._start_ns = time.time_ns()
        self._mounted = False  # kernel notifications only once a session exists
        os.chmod(self.layers.up(""), root_mode)  # any user may create entries, like /tmp

    # --- lifecycle / refresh --------------------------------------------
    def init(self) -> None:
        self._mounted = True

    def set_lower(self, lower: LowerTree) -> None:
        """Serve a newer generation (see the module docstring: nothing to invalidate)."""
        self.layers.lower = lower

    def lower_changed(self) -> None:
        """The LowerTree grew in place: nothing to do (kept as the refresh hook).

        New paths appear on the next lookup/readdir because negative lookups and
        directory listings are never cached; lower directory attributes are
        synthesized constants, so no cached attribute goes stale.
        """

    # --- helpers ----------------------------------------------------------
    def _path(self, ino: int) -> str:
        path = self.inodes.path(ino)
        if path is None:
            raise _err(errno.ENOENT)
        return path

    def _child(self, parent_ino: int, name: bytes) -> str:
        """Path of an existing-or-not child; reserved names simply do not exist."""
        parent = self._path(parent_ino)
        sname = os.fsdecode(name)
        if sname == ".":
            return parent
        if sname == "..":
            return split(parent)[0]
        if is_reserved(sname):
            raise _err(errno.ENOENT)
        return join(parent, sname)

    def _new_child(self, parent_ino: int, name: bytes) -> str:
        """Path of a child about to be created: reserved names are refused."""
        sname = os.fsdecode(name)
        if is_reserved(sname):
            raise _err(errno.EPERM)
        return join(self._path(parent_ino), sname)

    def _resolve(self, path: str) -> Node:
        node = self.layers.resolve(path)
        if node is None:
            raise _err(errno.ENOENT)
        return node

    def _attrs(self, node: Node, ino: int) -> pyfuse3.EntryAttributes:
        if node.upper is not None:
            return self._upper_attrs(node.upper, ino)
        assert node.lower is not None
        return self._lower_attrs(node.lower, ino)

    def _upper_attrs(self, st: os.stat_result, ino: int) -> pyfuse3.EntryAttributes:
        return upper_attrs(st, ino, self.upper_timeout)

    def _lower_attrs(self, node: LowerNode, ino: int) -> pyfuse3.EntryAttributes:
        return lower_attrs(
            node,
            ino,
            self.lower_timeout,
            owner=self._owner,
            dir_mode=self.dir_mode,
            dir_time_ns=self._start_ns,
        )

    def _invalidate_entry(self, path: str) -> None:
        """Make the kernel forget the dentry of ``path`` (asynchronously: no deadlock)."""
        if not self._mounted or not path:
            return
        parent, name = split(path)
        parent_ino = self.inodes.find(parent)
        if parent_ino is not None:
            pyfuse3.invalidate_entry_async(parent_ino, os.fsencode(name), ignore_enoent=True)

    def _lower_failed(self, path: str, exc: BaseException) -> _Miss:
        if path not in self.layers.failed:
            # Only a corrupt object is a miss for the life of the mount; a missing
            # object, a timeout or an unreachable root is retried later.
            self.layers.failed.add(path, permanent=isinstance(exc, CorruptObjectError))
            self.counters.inc("fetch_errors")
            log.warning("lower object for %r unavailable, serving a miss: %s", path, exc)
        self.inodes.detach(path)  # a file re-created here gets a fresh inode
        return _Miss(path)

    async def _invalidate_entry_now(self, path: str) -> None:
        """Invalidate and wait: only where the kernel holds no lock on the parent (open)."""
        if not self._mounted or not path:
            return
        parent, name = split(path)
        parent_ino = self.inodes.find(parent)
        if parent_ino is None:
            return
        try:
            await trio.to_thread.run_sync(pyfuse3.invalidate_entry, parent_ino, os.fsencode(name))
        except OSError as e:
            if e.errno != errno.ENOENT:  # ENOENT: the kernel had no such dentry
                log.warning("invalidating %r: %s", path, e)

    async def _fetch(self, path: str, entry: Entry) -> str:
        """The entry's local file (pinned), or a miss; never waits past fetch_timeout.

        The fetch runs in a thread the handler can abandon: a shared root that
        stops answering (a hard NFS mount, a FIFO planted in the store) must
        cost the job a miss, not a process stuck in D state.
        """
        lock = threading.Lock()
        state = {"done": False, "abandoned": False}

        def run() -> str:
            local = self.fetcher.fetch(entry)
            with lock:
                if state["abandoned"]:
                    self.fetcher.unpin(entry.digest)  # nobody is waiting for it any more
                else:
                    state["done"] = True
            return local

        try:
            with trio.move_on_after(self.fetch_timeout):
                return await trio.to_thread.run_sync(
                    run, abandon_on_cancel=True, limiter=self._fetch_limiter
                )
        except Exception as e:  # any fetch failure is a miss, never an error to the job
            if not isinstance(e, CasfsError | OSError):
                log.exception("unexpected fetch failure for %r", path)
            raise self._lower_failed(path, e) from None
        with lock:
            state["abandoned"] = True
            if state["done"]:  # finished just as we gave up: its pin is ours to drop
                self.fetcher.unpin(entry.digest)
        self.counters.inc("fetch_timeouts")
        raise self._lower_failed(
            path, TimeoutError(f"no answer from the shared root in {self.fetch_timeout:.0f}s")
        )

    async def _copy_up(self, node: Node, *, empty: bool = False) -> None:
        """Give a lower-only file an upper copy (``empty``: content not needed, no fetch)."""
        entry = node.lower_file
        if entry is None:
            return
        src = None if empty else await self._fetch(node.path, entry)
        try:
            tmp = await trio.to_thread.run_sync(self.layers.stage_copy, src, entry)
        finally:
            if src is not None:
                self.fetcher.unpin(entry.digest)
        # From here on no await: nothing can change the path under us.
        current = self.layers.resolve(node.path)
        if current is None or current.upper is not None:
            os.unlink(tmp)
            if current is None:
                raise _err(errno.ENOENT)
            return
        self.layers.ensure_upper_dir(split(node.path)[0], self.dir_mode)
        self.layers.install_staged(tmp, node.path)
        self.counters.inc("copy_up")

    async def _copy_up_tree(self, node: Node) -> None:
        """Copy a merged directory and everything visible below it into upper."""
        self.layers.ensure_upper_dir(node.path, self.dir_mode)
        for name, _ in self.layers.children(node):
            child = self.layers.resolve(join(node.path, name))
            if child is None:
                continue
            if child.is_dir:
                if child.has_lower_dir:
                    await self._copy_up_tree(child)
            elif child.lower_file is not None:
                try:
                    await self._copy_up(child)
                except _Miss as miss:  # failed object: dropped, like any miss
                    self._invalidate_entry(miss.path)
                    continue
                self.tracker.modified(child.path)  # now a new file at its new path

    def _initial_perm(self, ctx: pyfuse3.RequestContext, perm: int, private: int) -> int:
        """Permissions to create an entry with.

        An entry for another user is created private and opened up only after
        the chown, so nobody can use it in between; one for the daemon's own
        user gets its final permissions at once, and then needs no chmod.
        """
        if self._is_root and (ctx.uid, ctx.gid) != self._owner:
            return private
        return stat.S_IMODE(perm) & 0o777

    def _own(self, path: str, ctx: pyfuse3.RequestContext, mode: int, created: int) -> None:
        """New entries belong to the caller (the daemon runs as root); honour setgid dirs.

        ``created`` is the permission the entry was created with; only the
        syscalls that change something are made.
        """
        up = self.layers.up(path)
        if self._is_root:
            gid = ctx.gid
            pst = os.lstat(self.layers.up(split(path)[0]))
            created_gid = self._owner[1]
            if pst.st_mode & stat.S_ISGID:
                gid = created_gid = pst.st_gid  # the kernel already gave it the dir's group
                if stat.S_ISDIR(mode):
                    mode |= stat.S_ISGID
            if (ctx.uid, gid) != (self._owner[0], created_gid):
                os.lchown(up, ctx.uid, gid)
        perm = stat.S_IMODE(mode)
        if not stat.S_ISLNK(mode) and (created & ~self._umask != perm):
            os.chmod(up, perm)  # exact mode: the daemon's umask must not apply

    def _prepare_new(self, path: str) -> None:
        if self.layers.resolve(path) is not None:
            raise _err(errno.EEXIST)
        self.layers.ensure_upper_dir(split(path)[0], self.dir_mode)

    def _entry_reply(self, path: str) -> pyfuse3.EntryAttributes:
        ino = self.inodes.lookup(path)
        return self._attrs(self._resolve(path), ino)

    async def _open_node(self, node: Node, ino: int, flags: int) -> pyfuse3.FileInfo:
        accmode = flags & os.O_ACCMODE
        writable = accmode != os.O_RDONLY or bool(flags & os.O_TRUNC)
        entry = node.lower_file
        if entry is not None and not writable:
            # Warm: the object is local, open it inline. Cold: fetch in a thread.
            src = self.fetcher.cached(entry) or await self._fetch(node.path, entry)
            try:
                fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                # Evicted by another mount process between fetch and open: once more.
                self.fetcher.unpin(entry.digest)
                src = await self._fetch(node.path, entry)
                try:
                    fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
                except OSError as e:
                    self.fetcher.unpin(entry.digest)
                    raise self._lower_failed(node.path, e) from None
            except OSError as e:
                self.fetcher.unpin(entry.digest)
                raise self._lower_failed(node.path, e) from None
            self.counters.inc("open_lower")
            self._handles[fd] = _Handle(fd, ino, node.path, False, entry.digest)
            return pyfuse3.FileInfo(fh=fd, keep_cache=True)
        if entry is not None:
            await self._copy_up(node, empty=bool(flags & os.O_TRUNC))
            self._invalidate_entry(node.path)  # drop the long lower timeouts
        fd = os.open(
            self.layers.up(node.path), (flags & ~_STRIP_FLAGS) | os.O_CLOEXEC | os.O_NOFOLLOW
        )
        self._handles[fd] = _Handle(fd, ino, node.path, writable, None)
        if writable:
            self.tracker.opened_for_write(node.path)
        if flags & os.O_TRUNC:
            self.tracker.modified(node.path)
        return pyfuse3.FileInfo(fh=fd)

    def _handle(self, fh: int) -> _Handle:
        h = self._handles.get(fh)
        if h is None:
            raise _err(errno.EBADF)
        return h

    # --- names ----------------------------------------------------------
    @_fuse_errors
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        node = self.layers.resolve(path)
        if node is None:
            self.counters.inc("lookup_miss")
            raise _err(errno.ENOENT)
        self.counters.inc("lookup_upper" if node.upper is not None else "lookup_lower")
        return self._attrs(node, self.inodes.lookup(path))

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for ino, n in inode_list:
            self.inodes.forget(ino, n)

    @_fuse_errors
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        path = self.inodes.path(inode)
        if path is None:  # unlinked but still open: answer from the open fd
            for h in self._handles.values():
                if h.ino == inode:
                    return self._upper_attrs(os.fstat(h.fd), inode)
            raise _err(errno.ENOENT)
        return self._attrs(self._resolve(path), inode)

    @_fuse_errors
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
        if path is None:
            if fd is None:
                raise _err(errno.ENOENT)
            target: str | int = fd
        else:
            node = self._resolve(path)
            if node.upper is None:
                if node.is_dir:
                    self.layers.ensure_upper_dir(path, self.dir_mode)
                else:
                    to_zero = fields.update_size and attr.st_size == 0
                    await self._copy_up(node, empty=to_zero)
                    self._invalidate_entry(path)
            target = fd if fd is not None else self.layers.up(path)
        is_link = isinstance(target, str) and os.path.islink(target)
        if fields.update_mode and not is_link:
            os.chmod(target, stat.S_IMODE(attr.st_mode))
        if fields.update_uid or fields.update_gid:
            uid = attr.st_uid if fields.update_uid else -1
            gid = attr.st_gid if fields.update_gid else -1
            if isinstance(target, int):
                os.fchown(target, uid, gid)
            else:
                os.lchown(target, uid, gid)
        if fields.update_size:
            os.truncate(target, attr.st_size)
        if fields.update_atime or fields.update_mtime:
            st = os.stat(target, follow_symlinks=False) if isinstance(target, str) else os.fstat(
                target
            )
            atime = attr.st_atime_ns if fields.update_atime else st.st_atime_ns
            mtime = attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns
            if isinstance(target, int):
                os.utime(target, ns=(atime, mtime))
            else:
                os.utime(target, ns=(atime, mtime), follow_symlinks=False)
        st = os.stat(target, follow_symlinks=False) if isinstance(target, str) else os.fstat(target)
        if path is not None:
            self.tracker.modified(path)
        return self._upper_attrs(st, inode)

    @_fuse_errors
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        return os.readlink(os.fsencode(self.layers.up(self._path(inode))))

    @_fuse_errors
    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = self._new_child(parent_inode, name)
        self._prepare_new(path)
        created = self._initial_perm(ctx, mode, 0o700)
        os.mkdir(self.layers.up(path), created)
        self._own(path, ctx, stat.S_IFDIR | stat.S_IMODE(mode), created)
        if self.layers.lower.lookup(path) is not None:
            self.layers.make_opaque(path)  # re-created over a removed lower dir: starts empty
        self.layers.remove_whiteout(path)
        return self._entry_reply(path)

    @_fuse_errors
    async def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            raise _err(errno.EPERM)
        path = self._new_child(parent_inode, name)
        self._prepare_new(path)
        created = self._initial_perm(ctx, mode, 0o600)
        os.mknod(self.layers.up(path), stat.S_IFMT(mode) | created)
        self._own(path, ctx, mode, created)
        self.layers.remove_whiteout(path)
        if stat.S_ISREG(mode):
            self.tracker.modified(path)
        return self._entry_reply(path)

    @_fuse_errors
    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = self._new_child(parent_inode, name)
        self._prepare_new(path)
        os.symlink(target, os.fsencode(self.layers.up(path)))
        self._own(path, ctx, stat.S_IFLNK, 0)
        self.layers.remove_whiteout(path)
        return self._entry_reply(path)

    @_fuse_errors
    async def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        raise _err(errno.EPERM)  # no hard links (like vfat): callers fall back to copies

    def _needs_whiteout(self, path: str) -> bool:
        """Would lower ``path`` show once the upper entry at ``path`` is gone?"""
        return self.layers.lower.lookup(path) is not None and self.layers.lower_visible(path)

    @_fuse_errors
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = self._child(parent_inode, name)
        node = self._resolve(path)
        if node.is_dir:
            raise _err(errno.EISDIR)
        # Whiteout first: a crash in between leaves the name hidden, not resurrected.
        if self._needs_whiteout(path):
            self.layers.add_whiteout(path, self.dir_mode)
        if node.upper is not None:
            os.unlink(self.layers.up(path))
        self.inodes.detach(path)
        self.tracker.removed(path)

    @_fuse_errors
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = self._child(parent_inode, name)
        node = self._resolve(path)
        if not node.is_dir:
            raise _err(errno.ENOTDIR)
        if self.layers.children(node):
            raise _err(errno.ENOTEMPTY)
        if self._needs_whiteout(path):
            self.layers.add_whiteout(path, self.dir_mode)
        if node.upper is not None:
            self.layers.clear_markers(path)
            os.rmdir(self.layers.up(path))
        self.inodes.detach(path)
        self.tracker.removed(path)

    @_fuse_errors
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
            raise _err(errno.EINVAL)
        old = self._child(parent_inode_old, name_old)
        new = self._new_child(parent_inode_new, name_new)
        src = self._resolve(old)
        if old == new:
            return
        dst = self.layers.resolve(new)
        if dst is not None:
            if flags & pyfuse3.RENAME_NOREPLACE:
                raise _err(errno.EEXIST)
            if src.is_dir and not dst.is_dir:
                raise _err(errno.ENOTDIR)
            if dst.is_dir and not src.is_dir:
                raise _err(errno.EISDIR)
            if dst.is_dir and self.layers.children(dst):
                raise _err(errno.ENOTEMPTY)
        if src.is_dir and new.startswith(old + "/"):
            raise _err(errno.EINVAL)
        # Materialize the source wholly in upper so it can move as one real rename.
        if src.is_dir:
            if src.has_lower_dir:
                await self._copy_up_tree(src)
                self.layers.make_opaque(old)
            elif self.layers.lower.lookup(new) is not None:
                self.layers.make_opaque(old)  # must not merge with lower entries at ``new``
        elif src.lower_file is not None:
            await self._copy_up(src)
        if dst is not None and dst.is_dir and dst.upper is not None:
            self.layers.clear_markers(new)
        self.layers.ensure_upper_dir(split(new)[0], self.dir_mode)
        if self._needs_whiteout(old):
            self.layers.add_whiteout(old, self.dir_mode)
        os.rename(self.layers.up(old), self.layers.up(new))
        self.layers.remove_whiteout(new)
        self.inodes.rename(old, new)
        self.tracker.renamed(old, new)

    # --- files ------------------------------------------------------------
    @_fuse_errors
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        path = self._path(inode)
        node = self._resolve(path)
        if node.is_dir:
            raise _err(errno.EISDIR)
        try:
            return await self._open_node(node, inode, flags)
        except _Miss as miss:
            # The kernel holds no lock on the parent during open, so waiting for the
            # invalidation is safe: the caller's next stat already sees ENOENT.
            await self._invalidate_entry_now(miss.path)
            raise _err(errno.ENOENT) from None

    @_fuse_errors
    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        path = self._new_child(parent_inode, name)
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise _err(errno.EOPNOTSUPP)
        node = self.layers.resolve(path)
        if node is not None:  # raced with another creator: behave like open(O_CREAT)
            if flags & os.O_EXCL:
                raise _err(errno.EEXIST)
            if node.is_dir:
                raise _err(errno.EISDIR)
            ino = self.inodes.lookup(path)
            fi = await self._open_node(node, ino, flags)
            return fi, self._attrs(self._resolve(path), ino)
        self.layers.ensure_upper_dir(split(path)[0], self.dir_mode)
        up = self.layers.up(path)
        created = self._initial_perm(ctx, mode, 0o600)
        fd = os.open(
            up,
            (flags & ~(os.O_APPEND | os.O_NOCTTY)) | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
            created,
        )
        try:
            self._own(path, ctx, stat.S_IFREG | stat.S_IMODE(mode), created)
        except BaseException:
            os.close(fd)
            os.unlink(up)
            raise
        self.layers.remove_whiteout(path)
        ino = self.inodes.lookup(path)
        writable = flags & os.O_ACCMODE != os.O_RDONLY
        self._handles[fd] = _Handle(fd, ino, path, writable, None)
        if writable:
            self.tracker.opened_for_write(path)
        self.tracker.modified(path)
        return pyfuse3.FileInfo(fh=fd), self._upper_attrs(os.fstat(fd), ino)

    @_fuse_errors
    async def read(self, fh: int, off: int, size: int) -> bytes:
        return os.pread(self._handle(fh).fd, size, off)

    @_fuse_errors
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        h = self._handle(fh)
        n = os.pwrite(h.fd, buf, off)
        self.tracker.modified(self.inodes.path(h.ino) or h.path)
        return n

    async def flush(self, fh: int) -> None:
        return None  # writes went straight to the upper file

    @_fuse_errors
    async def fsync(self, fh: int, datasync: bool) -> None:
        fd = self._handle(fh).fd
        await trio.to_thread.run_sync(os.fdatasync if datasync else os.fsync, fd)

    @_fuse_errors
    async def release(self, fh: int) -> None:
        h = self._handles.pop(fh, None)
        if h is None:
            return
        os.close(h.fd)
        if h.digest is not None:
            self.fetcher.unpin(h.digest)
        if h.writable:
            self.tracker.closed_for_write(self.inodes.path(h.ino) or h.path)

    # --- directories --------------------------------------------------------
    @_fuse_errors
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        node = self._resolve(self._path(inode))
        if not node.is_dir:
            raise _err(errno.ENOTDIR)
        fh = self._next_dir_fh
        self._next_dir_fh += 1
        # Snapshot at opendir: offsets stay meaningful while the directory changes.
        self._dirs[fh] = (node.path, [name for name, _ in self.layers.children(node)])
        return fh

    @_fuse_errors
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        path, names = self._dirs[fh]
        for i in range(start_id, len(names)):
            cpath = join(path, names[i])
            node = self.layers.resolve(cpath)
            if node is None:
                continue  # removed since opendir
            ino = self.inodes.ino(cpath)
            attrs = self._attrs(node, ino)
            if not pyfuse3.readdir_reply(token, os.fsencode(names[i]), attrs, i + 1):
                self.inodes.drop_if_unused(ino)
                return
            self.inodes.lookup(cpath)  # readdirplus counts as a lookup

    async def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        return None

    @_fuse_errors
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        s = os.statvfs(self.layers.up(""))
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
