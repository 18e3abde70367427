"""File I/O: open (with copy-up on write), create, read, write, fsync, release."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat

import pyfuse3
import trio

from casfs.store.entry import Entry
from casfs.view.handleslots import FILE_RO, FILE_RW
from casfs.view.layers import Node, split
from casfs.view.op_base import (
    MEMFD_IDLE_MAX,
    MEMFD_SHARES,
    STRIP_FLAGS,
    Handle,
    Miss,
    err,
    fuse_errors,
    sync_handler,
)
from casfs.view.op_copyup import CopyUpOps

log = logging.getLogger(__name__)


def _writeback_flags(flags: int) -> int:
    """With the kernel's writeback cache it may read any page it writes partially,
    so a write-only open gets a read-write fd on the upper file."""
    if flags & os.O_ACCMODE == os.O_WRONLY:
        return (flags & ~os.O_ACCMODE) | os.O_RDWR
    return flags


def _open_cached(path: str) -> int:
    """Open a local cache file: never following a link, never blocking, regular only."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "cached object is not a regular file", path)
    return fd


_PRESENTED_MAX = 4096  # remembered presented files (group files: a few hundred bytes)
_KINDS_MAX = 1 << 16  # remembered (path: digest, presented, keep_cache) of lower files
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_TRUNC  # an open with any of these may copy up
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


def _sealed_memfd(shown: bytes) -> int:
    """A memfd holding ``shown``, sealed: no handle sharing it can ever see other bytes."""
    fd = os.memfd_create("casfs-presented", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        if os.write(fd, shown) != len(shown):
            raise OSError(errno.EIO, "short write to a memfd")
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except OSError:
        os.close(fd)
        raise
    return fd


class FileOps(CopyUpOps):
    async def _open_node(self, node: Node, ino: int, flags: int) -> pyfuse3.FileInfo:
        accmode = flags & os.O_ACCMODE
        writable = accmode != os.O_RDONLY or bool(flags & os.O_TRUNC)
        entry = node.lower_file
        if entry is not None and not writable:
            kind = self._lower_kinds.get(node.path)
            if kind is None or kind[0] != entry.digest:
                # (digest, presented, keep_cache): each depends on the path and its
                # digest only, and asking the family's rules costs ~3 us per open.
                kind = (entry.digest,
                        self.presenter is not None and self.presenter.size(entry) is not None,
                        not self.replaced(node.path))
                if len(self._lower_kinds) >= _KINDS_MAX:
                    self._lower_kinds.clear()
                self._lower_kinds[node.path] = kind
            if kind[1]:
                key = (node.path, entry.digest)
                slot = self._memfds.get(key)
                if slot is None:
                    shown = self._presented.get(key)
                    if shown is None:
                        src = self.fetcher.cached(entry) or await self._fetch(node.path, entry)
                        shown = self._present(node.path, entry, src)
                    slot = self._memfds.get(key)  # another open made one meanwhile?
                    if slot is None:
                        slot = self._memfds[key] = [_sealed_memfd(shown), 0]
                if not slot[1]:
                    self._memfd_idle.pop(key, None)
                slot[1] += 1
                self.counters.inc("presented_opens")
                self.counters.inc("open_lower")
                if self.on_lower_open is not None:
                    self.on_lower_open(node.path, entry.digest)
                fh = self.slots.alloc(ino, FILE_RO)
                self._handles[fh] = Handle(slot[0], ino, node.path, False, None, False, key)
                return pyfuse3.FileInfo(fh=fh, keep_cache=True)
            # Warm: the object is local, open it inline. Cold: fetch in a thread.
            warm = self.fetcher.open_cached(entry)
            if warm is None:
                fd = await self._open_fetched(node.path, entry)
                # A replaced path's pages may hold an older version: never keep them.
                return self._opened_lower(fd, ino, node.path, entry, kind[2], False)
            if kind[2]:  # the next open of this inode may skip the resolving
                if len(self._warm) >= _KINDS_MAX:
                    self._warm.clear()
                self._warm[ino] = (self.layers.state(), node.path, entry)
            return self._opened_lower(warm, ino, node.path, entry, kind[2], True)
        if entry is not None:
            await self._copy_up(node, empty=bool(flags & os.O_TRUNC))
            self._invalidate_entry(node.path)  # drop the long lower timeouts
        # An upper file truncated by this open gives its bytes back.
        was = node.upper.st_size if (self.quota is not None and flags & os.O_TRUNC
                                     and entry is None and node.upper is not None) else None
        fd = self.layers.open(
            node.path, _writeback_flags(flags & ~STRIP_FLAGS) | os.O_CLOEXEC | os.O_NOFOLLOW
        )
        if was is not None:
            self._settle(fd, was, 0)
        fh = self.slots.alloc(ino, FILE_RW if writable else FILE_RO)
        self._handles[fh] = Handle(fd, ino, node.path, writable, None)
        self._open_upper[ino] += 1
        if writable:
            self.tracker.opened_for_write(node.path)
        if flags & os.O_TRUNC:
            self.tracker.modified(node.path)
        return pyfuse3.FileInfo(fh=fh)

    def _opened_lower(self, fd: int, ino: int, path: str, entry: Entry,
                      keep_cache: bool, shared: bool) -> pyfuse3.FileInfo:
        """A handle of a lower object's fd: ``shared`` for one of ``open_cached``
        (handles may share it: its own fh number), else an fd of this handle only."""
        self.counters.inc("open_lower")
        if self.on_lower_open is not None:
            self.on_lower_open(path, entry.digest)
        fh = self.slots.alloc(ino, FILE_RO)
        self._handles[fh] = Handle(fd, ino, path, False, entry.digest, shared)
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep_cache)

    async def _open_fetched(self, path: str, entry: Entry) -> int:
        """An fd of the entry's object (pinned) when it is not both local and trusted yet."""
        src = self.fetcher.cached(entry) or await self._fetch(path, entry)
        try:
            return _open_cached(src)
        except FileNotFoundError:
            # Evicted by another mount process between fetch and open: once more.
            self.fetcher.unpin(entry.digest)
            src = await self._fetch(path, entry)
            try:
                return _open_cached(src)
            except OSError as e:
                self.fetcher.unpin(entry.digest)
                raise self._lower_failed(path, e) from None
        except OSError as e:
            self.fetcher.unpin(entry.digest)
            raise self._lower_failed(path, e) from None

    def _present(self, path: str, entry: Entry, src: str) -> bytes:
        """The presented bytes of ``entry`` (small: a group file), remembered per path
        and digest: they depend on nothing else, and presenting costs a read and a
        JSON round trip (~0.3 ms) on every open of a file Triton opens on every run."""
        try:
            with open(src, "rb") as f:
                stored = f.read(entry.size + 1)
        except OSError as e:
            raise self._lower_failed(path, e) from None
        finally:
            self.fetcher.unpin(entry.digest)
        assert self.presenter is not None
        shown = self.presenter.content(entry, stored)
        if shown is None:  # not the stored form its manifest row announced: a miss
            raise self._lower_failed(path, ValueError("not a path-free stored form"))
        if len(self._presented) >= _PRESENTED_MAX:
            self._presented.clear()
        self._presented[(path, entry.digest)] = shown
        return shown

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        if not flags & _WRITES:
            # A lower file opened warm before, nothing in the view changed since, the
            # inode still attached (a newer version of a replaced path detaches it):
            # nothing to resolve again; only its object must still be cached. Not
            # wrapped in fuse_errors (a coroutine per request): the same rule inline.
            warm = self._warm.get(inode)
            if (warm is not None and warm[0] == self.layers.state()
                    and self.inodes.path(inode) is not None):
                try:
                    fd = self.fetcher.open_cached(warm[2])
                    if fd is not None:
                        return self._opened_lower(fd, inode, warm[1], warm[2], True, True)
                except Exception:
                    log.exception("bug in open")
                    raise err(errno.EIO) from None
        return await self._open(inode, flags)

    @fuse_errors
    async def _open(self, inode: int, flags: int) -> pyfuse3.FileInfo:
        path = self._path(inode)
        node = self._resolve(path)
        if node.is_dir:
            raise err(errno.EISDIR)
        try:
            return await self._open_node(node, inode, flags)
        except Miss as miss:
            # The kernel holds no lock on the parent during open, so waiting for the
            # invalidation is safe: the caller's next stat already sees ENOENT.
            if not self.stable_names:
                await self._invalidate_entry_now(miss.path)
            raise err(errno.ENOENT) from None

    @fuse_errors
    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        path = self._new_child(parent_inode, name)
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise err(errno.EOPNOTSUPP)
        node = self.layers.resolve(path)
        if node is not None:  # raced with another creator: behave like open(O_CREAT)
            if flags & os.O_EXCL:
                raise err(errno.EEXIST)
            if node.is_dir:
                raise err(errno.EISDIR)
            ino = self.inodes.lookup(path)
            fi = await self._open_node(node, ino, flags)
            self._forget_negative(parent_inode, name)
            return fi, self._attrs(self._resolve(path), ino)
        parent_st = self.layers.ensure_upper_dir(split(path)[0], self.dir_mode)
        self.layers.remove_whiteout(path)
        created = self._initial_perm(ctx, mode, 0o600)
        fd = self.layers.open(
            path,
            _writeback_flags(flags & ~STRIP_FLAGS) | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
            created,
        )
        try:
            self._own(path, ctx, stat.S_IFREG | stat.S_IMODE(mode), created, parent_st)
        except BaseException:
            os.close(fd)
            self.layers.unlink(path)
            raise
        ino = self.inodes.lookup(path)
        writable = flags & os.O_ACCMODE != os.O_RDONLY
        fh = self.slots.alloc(ino, FILE_RW if writable else FILE_RO)
        self._handles[fh] = Handle(fd, ino, path, writable, None)
        self._open_upper[ino] += 1
        if writable:
            self.tracker.opened_for_write(path)  # marks it changed too
        else:
            self.tracker.modified(path)
        self._forget_negative(parent_inode, name)
        return pyfuse3.FileInfo(fh=fh), self._upper_attrs(os.fstat(fd), ino)

    @sync_handler
    def read(self, fh: int, off: int, size: int) -> bytes:
        return os.pread(self._handle(fh).fd, size, off)

    @sync_handler
    def write(self, fh: int, off: int, buf: bytes) -> int:
        h = self._handle(fh)
        if self.quota is None:
            n = os.pwrite(h.fd, buf, off)
        else:
            # Growth is charged first: beyond the tenant's bound nothing is written
            # (EDQUOT; with the writeback cache the job sees it at close or fsync).
            before, charged = self._grow(h.fd, off + len(buf))
            try:
                n = os.pwrite(h.fd, buf, off)
            except BaseException:
                self._settle(h.fd, before, charged)
                raise
            if charged and n < len(buf):
                self._settle(h.fd, before, charged)
        self.tracker.modified(self.inodes.path(h.ino) or h.path)
        return n

    def owns_fd(self, fh: int) -> bool:
        """Whether handle ``fh`` holds a file descriptor of its own (an upper file, a cold
        object), not a shared one (casfs.view.mux bounds those per tenant)."""
        h = self._handles.get(fh)
        return h is not None and not h.shared and h.presented is None

    async def flush(self, fh: int) -> None:
        # Writes reach the upper file as they come (the kernel writes its dirty
        # pages back before it would send FLUSH), so there is nothing to do:
        # ENOSYS makes the kernel stop sending FLUSH at all (one round trip less
        # per close, for the rest of the mount).
        raise err(errno.ENOSYS)

    @fuse_errors
    async def fsync(self, fh: int, datasync: bool) -> None:
        fd = self._handle(fh).fd
        await trio.to_thread.run_sync(os.fdatasync if datasync else os.fsync, fd)

    async def release(self, fh: int) -> None:
        # fuse_errors's rule inline (no coroutine per request): only FUSEError leaves.
        h = self._handles.pop(fh, None)
        if h is None:
            if fh in self.slots.held:  # a crashed process's, never used here
                self.slots.free(fh)
            return
        self.slots.free(fh)
        try:
            if h.shared:
                assert h.digest is not None
                self.fetcher.release_cached(h.digest, h.fd)
                return
            if h.presented is not None:
                self._release_memfd(h.presented)
                return
            upper = h.digest is None
            gone = None
            if upper:
                self._open_upper[h.ino] -= 1
                last = self._open_upper[h.ino] <= 0
                if last:
                    del self._open_upper[h.ino]
                if last and self.layers.deferred:
                    gone = os.fstat(h.fd)  # removed while open: its space goes now
            os.close(h.fd)
            if gone is not None and gone.st_nlink == 0 and self.quota is not None and (
                    (key := (gone.st_dev, gone.st_ino)) in self.layers.deferred):
                self.layers.deferred.discard(key)
                self.quota.give_entry(gone)
            if h.digest is not None:
                self.fetcher.unpin(h.digest)
            if h.writable:
                self.tracker.closed_for_write(self.inodes.path(h.ino) or h.path)
                # Every other name of the file holds the same new bytes (a hard link
                # written through one name had the other published as it was).
                for other in self.inodes.aliases(h.ino):
                    self.tracker.modified(other)
        except OSError as e:
            raise err(e.errno or errno.EIO) from None
        except Exception:
            log.exception("bug in release")
            raise err(errno.EIO) from None

    def close_idle(self) -> None:
        """The namespace is released: close its idle memfds, leave the process's shares
        (a presented handle still open closes its memfd at release)."""
        self._memfd_bound = 0
        while self._memfd_idle:
            old, _ = self._memfd_idle.popitem(last=False)
            os.close(self._memfds.pop(old)[0])
        self._leave_memfd_shares()

    def _release_memfd(self, key: tuple[str, str]) -> None:
        """A presented handle closed: its memfd stays open (idle) while the bound allows."""
        slot = self._memfds[key]
        slot[1] -= 1
        if not slot[1]:
            self._memfd_idle[key] = None
            bound = min(MEMFD_IDLE_MAX, MEMFD_SHARES.of(self._memfd_bound))
            while len(self._memfd_idle) > bound:
                old, _ = self._memfd_idle.popitem(last=False)
                os.close(self._memfds.pop(old)[0])
