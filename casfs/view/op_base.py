"""State and helpers every part of the FUSE view shares (see casfs.view.ops).

``OpsBase`` owns the per-namespace state (layers, inodes, handles, tracker)
and the small helpers every handler family uses: path resolution, attribute
replies, kernel invalidation, ownership of new entries. Handlers live in the
mixins of op_attrs, op_files, op_dirs and op_copyup.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import logging
import os
import resource
import stat
import sys
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import pyfuse3
import trio

from casfs.promote.tracker import WriteTracker
from casfs.store.entry import Entry
from casfs.util.counters import Counters
from casfs.util.shares import EvenShares
from casfs.view.attrs import lower_attrs, upper_attrs
from casfs.view.breaker import FetchBreaker
from casfs.view.handleslots import HandleSlots
from casfs.view.inodes import InodeTable
from casfs.view.layers import Layers, Node, join, split
from casfs.view.lower import LowerNode, LowerTree, ObjectFetcher
from casfs.view.quota import NamespaceQuota, round_up

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S", bound="OpsBase")

# Flags that make no sense on the upper fd: the kernel already resolved
# creation, and it computes O_APPEND offsets itself (pwrite must not append).
# O_DIRECT is the job's say over its own page cache: on the upper fd it made the
# mount's own unaligned buffers fail the job's aligned writes with EINVAL.
STRIP_FLAGS = os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOCTTY | os.O_DIRECT
ROOT_TIMEOUT = 1.0
_FS_ENCODING = sys.getfilesystemencoding()  # os.fsdecode's (with surrogateescape)
# Negative dentries the kernel may hold at once on this view's word (~100 B each):
# past this, misses are answered uncached (the kernel asks again each time).
NEGATIVE_MAX = 1 << 16

def _fuse_error(ops: Any, name: str, e: Exception) -> pyfuse3.FUSEError:
    """The one rule for what leaves a handler: a Miss is ENOENT (its entry dropped
    from the kernel), an OSError keeps its errno, anything else is a bug: EIO."""
    if isinstance(e, Miss):
        if not ops.stable_names:  # (overlay mode's FUSE layer keeps its names)
            ops._invalidate_entry(e.path)
        return pyfuse3.FUSEError(errno.ENOENT)
    if isinstance(e, OSError):
        return pyfuse3.FUSEError(e.errno or errno.EIO)
    log.exception("bug in %s", name)
    return pyfuse3.FUSEError(errno.EIO)


def fuse_errors(
    fn: Callable[Concatenate[S, P], Awaitable[R]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """Only FUSEError may leave a handler: OSError keeps its errno, a bug is EIO."""

    @functools.wraps(fn)
    async def wrapper(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            try:
                return await fn(self, *args, **kwargs)
            except Unopened as u:  # a crashed process's handle: opened again, once
                await self._reopen(u.fh)  # type: ignore[attr-defined]
                return await fn(self, *args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except Exception as e:
            raise _fuse_error(self, fn.__name__, e) from None

    return wrapper


def sync_handler(
    fn: Callable[Concatenate[S, P], R],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """``fuse_errors`` for a handler that never awaits, written as a plain function:
    one coroutine per request instead of two (lookup, getattr, mkdir, rmdir, write
    and read are most of a Triton put's and a warm read's requests)."""

    @functools.wraps(fn)
    async def wrapper(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            try:
                return fn(self, *args, **kwargs)
            except Unopened as u:  # a crashed process's handle: opened again, once
                await self._reopen(u.fh)  # type: ignore[attr-defined]
                return fn(self, *args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except Exception as e:
            raise _fuse_error(self, fn.__name__, e) from None

    return wrapper


class Unopened(Exception):
    """A handle a crashed process gave out (casfs.view.handleslots): not open here yet."""

    def __init__(self, fh: int) -> None:
        super().__init__(fh)
        self.fh = fh


class Miss(Exception):
    """A lower object failed to fetch: its path is now absent (ENOENT to the caller)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


# Unused presented memfds kept open: at most this many per view, and an eighth of
# RLIMIT_NOFILE for the process (its views, one per namespace served, share it).
MEMFD_IDLE_MAX = 1024
MEMFD_SHARES = EvenShares()


def memfd_idle_bound() -> int:
    """The process's bound on idle memfds: an eighth of RLIMIT_NOFILE (its views
    share it; each keeps at most MEMFD_IDLE_MAX)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:  # no limit: only the per-namespace cap applies
        return 1 << 30
    return max(0, soft // 8)


def err(code: int) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(code)


@dataclass(slots=True)
class Handle:
    fd: int
    ino: int
    path: str  # at open time; the inode table has the current one
    writable: bool
    digest: str | None  # set for a lower object: unpin on release
    shared: bool = False  # the fetcher's shared fd (open_cached): release_cached, no close
    presented: tuple[str, str] | None = None  # a shared presented memfd's (path, digest)


def _in_trio_thread(fn: Callable[..., object], *args: object) -> None:
    """Run ``fn`` in the trio (FUSE) thread when called from one of its worker threads."""
    try:
        trio.from_thread.run_sync(fn, *args)
    except RuntimeError:  # not a trio worker thread (tests, start-up): no loop to race
        fn(*args)


def link_key(node: Node) -> tuple[int, int] | None:
    """The upper file's identity when it has hard links (names of one inode share it)."""
    st = node.upper
    if st is None or st.st_nlink < 2 or stat.S_ISDIR(st.st_mode):
        return None
    return (st.st_dev, st.st_ino)


class Presenter(Protocol):
    """Lower files served with other bytes than stored (a family's path-bearing
    files, stored path-free): ``size`` must equal ``len(content(...))``."""

    def size(self, entry: Entry) -> int | None: ...

    def content(self, entry: Entry, stored: bytes) -> bytes | None: ...


class OpsBase(pyfuse3.Operations):
    # The kernel merges small writes (the linker writes .so files 1-16 KB at a
    # time) into page-sized batches and answers reads of just-written pages
    # itself. Safe because upper files change only through this mount.
    enable_writeback_cache = True

    def __init__(
        self,
        lower: LowerTree,
        fetcher: ObjectFetcher,
        upper_dir: Path,
        tracker: WriteTracker,
        counters: Counters,
        *,
        lower_timeout: float = 3600.0,
        upper_timeout: float = 3600.0,
        negative_timeout: float = 3600.0,
        fetch_timeout: float = 10.0,
        fetch_threads: int = 16,
        lower_dir_mode: int = 0o777,
        root_mode: int = 0o1777,
        share_bits: int = 0,
        replaced: Callable[[str], bool] | None = None,
        replaced_timeout: float = 1.0,
        presenter: Presenter | None = None,
        dir_nlink: bool = True,
        quota: NamespaceQuota | None = None,
        stable_names: bool = False,
    ) -> None:
        super().__init__()
        # A name once shown keeps its inode and stays shown (overlay mode's FUSE layer,
        # an overlayfs lower: overlayfs answers ESTALE, for the life of its dentry, when
        # a lower dentry it holds stops revalidating). A lower object that fails to
        # fetch then fails the open (ENOENT, a miss), not the lookup, and is not
        # invalidated or given a new inode; a retry within FailedPaths' window misses
        # at once, as a hidden path would.
        self.stable_names = stable_names
        if stable_names:
            # Read-only: no writes to cache. And the kernel must take a replaced path's
            # new size from getattr for the same inode (with the writeback cache it keeps
            # its own size for a cached inode: see replaced_changed).
            self.enable_writeback_cache = False
        # Directories' link count: 2 + subdirectories (exact), or 1 ("unknown", as
        # overlayfs shows a merged directory): overlay mode's FUSE layer, where
        # counting would list every child directory on the overlay's first listing.
        self.dir_nlink = dir_nlink
        # A shared tenant's cache (casfs.tenants): what one member creates, the
        # others may write too. 0o070: a group domain (group bits follow the
        # owner's, as with umask 002); 0o077: the cluster (everyone). So one
        # member's directory never makes another's cache writes fail.
        self.share_bits = share_bits
        self.layers = Layers(lower, Path(upper_dir), counters)
        self.layers.hide_failed = not stable_names
        # The tenant's bounds (casfs.view.quota): entries are charged by the layers,
        # bytes where they are written; None: nothing counted.
        self.quota = quota
        self.layers.quota = quota
        self.layers.is_open = self._upper_open
        self._open_upper: Counter[int] = Counter()  # inode -> handles of its upper file
        self.fetcher = fetcher
        self.tracker = tracker
        self.counters = counters
        self.lower_timeout = lower_timeout
        # Paths whose bytes may change on refresh (a family's replaced paths).
        self.replaced = replaced or (lambda path: False)
        self.replaced_timeout = replaced_timeout
        self.presenter = presenter
        self._presented: dict[tuple[str, str], bytes] = {}  # (path, digest): shown bytes
        # A sealed memfd per presented (path, digest), shared by its handles (reads
        # are preads): key -> [fd, handles]; unused ones kept (LRU) up to the bound.
        self._memfds: dict[tuple[str, str], list[int]] = {}
        self._memfd_idle: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._memfd_bound = memfd_idle_bound()  # the process's: this view keeps its share
        self._leave_memfd_shares = MEMFD_SHARES.join(self)
        self._lower_kinds: dict[str, tuple[str, bool, bool]] = {}  # see FileOps._open_node
        # inode -> (layers.state(), path, entry) of a lower file last opened warm
        self._warm: dict[int, tuple[tuple[int, int, int], str, Entry]] = {}
        self._lower_attr_cache: dict[int, tuple[LowerNode, tuple[int, int],
                                                pyfuse3.EntryAttributes]] = {}
        # Lower entries appear owned by this (uid, gid): the tenant's, so its jobs
        # may rewrite a replaced path they did not write (the daemon runs as root).
        self.lower_owner: tuple[int, int] | None = None
        self.upper_timeout = upper_timeout
        # Misses are cached by the kernel (Triton, Inductor and vLLM probe many names
        # that do not exist). Every negative answered is remembered by (parent inode,
        # name): names created through the mount replace the kernel's dentry
        # themselves, and ``lower_added`` invalidates those a refresh makes appear.
        self.negative_timeout = negative_timeout
        self._negative: dict[int, set[bytes]] = {}
        self._negative_n = 0
        self.fetch_timeout = fetch_timeout
        self.breaker = FetchBreaker()
        # Fetches get their own threads: stuck ones must not starve fsync or copy-up.
        self._fetch_limiter = trio.CapacityLimiter(fetch_threads)
        self.dir_mode = lower_dir_mode
        self.inodes = InodeTable()
        self._handles: dict[int, Handle] = {}  # by fh (casfs.view.handleslots)
        self.slots = HandleSlots()
        self._dirs: dict[int, tuple[str, list[str]]] = {}
        self._owner = (os.geteuid(), os.getegid())
        self._is_root = os.geteuid() == 0
        self._umask = os.umask(0o022)  # read it (and put it back)
        os.umask(self._umask)
        self._start_ns = time.time_ns()
        self._mounted = False  # kernel notifications only once a session exists
        os.fchmod(self.layers.fd, root_mode)  # any user may create entries, like /tmp
        # Called with (path, digest) on each open of a lower file (access profiles).
        self.on_lower_open: Callable[[str, str], None] | None = None
        # Called with (path, entry) when an open must fetch a lower object (read-ahead);
        # on the FUSE loop: it may only note it.
        self.on_lower_miss: Callable[[str, Entry], None] | None = None

    # --- lifecycle / refresh --------------------------------------------
    def init(self) -> None:
        self._mounted = True

    def set_lower(self, lower: LowerTree) -> None:
        """Serve another LowerTree (a test's; refresh grows the served one in place).

        Any name may appear: every negative dentry the kernel holds is dropped.
        Called on the trio thread (the invalidations are queued, not awaited).
        """
        self.layers.lower = lower
        for parent_ino, names in self._negative.items():
            for name in names:
                if self._mounted:
                    pyfuse3.invalidate_entry_async(parent_ino, name, ignore_enoent=True)
        self._negative.clear()
        self._negative_n = 0

    def lower_added(self, paths: Iterable[str]) -> None:
        """The served LowerTree grew in place with ``paths`` (refresh: a worker thread).

        Published paths never change bytes, so only names that were absent can
        change: the kernel forgets its negative dentry for each new path and for
        each new ancestor directory, before this returns (the caller has already
        raised the served generation, so the next lookup finds the entry). Lower
        directory link counts are recounted (the kernel's cached ones may lag
        until their attributes expire; find(1) trusts link counts only on
        filesystems it knows). Directory listings are never cached by the kernel.
        """
        self.layers.lower_version += 1
        if not self._mounted or not self._negative:
            return
        paths = list(paths)
        try:
            stale = trio.from_thread.run_sync(self._take_negatives, paths)
        except RuntimeError:  # not a trio worker thread (tests): no loop to race
            stale = self._take_negatives(paths)
        for parent_ino, name in stale:
            try:
                pyfuse3.invalidate_entry(parent_ino, name)
            except OSError as e:
                if e.errno != errno.ENOENT:  # ENOENT: the kernel dropped it already
                    log.warning("invalidating the negative entry %r: %s", name, e)
        if stale:
            self.counters.inc("negative_invalidated", len(stale))

    def _take_negatives(self, paths: Sequence[str]) -> list[tuple[int, bytes]]:
        """The remembered negative dentries on the way to ``paths`` (trio thread), forgotten."""
        out: list[tuple[int, bytes]] = []
        seen: set[str] = set()
        for path in paths:
            parent = ""
            for name in path.split("/"):
                here = join(parent, name)
                if here in seen:
                    parent = here
                    continue
                seen.add(here)
                parent_ino = self.inodes.find(parent)
                if parent_ino is None:
                    break  # the kernel knows no dentry there, so none below either
                names = self._negative.get(parent_ino)
                bname = os.fsencode(name)
                if names is not None and bname in names:
                    self._forget_negative(parent_ino, bname)
                    out.append((parent_ino, bname))
                    break  # nothing was looked up below a name that was absent
                parent = here
        return out

    def _negative_reply(self, parent_ino: int, name: bytes, path: str) -> pyfuse3.EntryAttributes:
        """Answer a miss so that the kernel caches it (ENOENT when it must ask again)."""
        if (self.negative_timeout <= 0 or self._negative_n >= NEGATIVE_MAX
                or path in self.layers.failed or name in (b".", b"..")):
            # A failed lower object is retried later: its path may come back.
            raise err(errno.ENOENT)
        names = self._negative.setdefault(parent_ino, set())
        if name not in names:
            names.add(name)
            self._negative_n += 1
        a = pyfuse3.EntryAttributes()
        a.st_ino = 0
        a.entry_timeout = self.negative_timeout
        return a

    def _forget_negative(self, parent_ino: int, name: bytes) -> None:
        """The kernel's dentry for ``name`` is positive now (or gone): stop tracking it."""
        names = self._negative.get(parent_ino)
        if names is not None and name in names:
            names.discard(name)
            self._negative_n -= 1
            if not names:
                del self._negative[parent_ino]

    def _forget_negatives_under(self, parent_ino: int) -> None:
        """The kernel forgot ``parent_ino``: its negative dentries went before it."""
        names = self._negative.pop(parent_ino, None)
        if names:
            self._negative_n -= len(names)


    def _path(self, ino: int) -> str:
        path = self.inodes.path(ino)
        if path is None:
            raise err(errno.ENOENT)
        return path

    def _child(self, parent_ino: int, name: bytes) -> str:
        """Path of an existing-or-not child (no name is reserved: see casfs.view.whiteout)."""
        parent = self._path(parent_ino)
        sname = name.decode(_FS_ENCODING, "surrogateescape")  # os.fsdecode, no checks
        if sname == ".":
            return parent
        if sname == "..":
            return split(parent)[0]
        return f"{parent}/{sname}" if parent else sname

    def _new_child(self, parent_ino: int, name: bytes) -> str:
        """Path of a child about to be created."""
        parent = self._path(parent_ino)
        sname = name.decode(_FS_ENCODING, "surrogateescape")
        return f"{parent}/{sname}" if parent else sname

    def _not_moved(self, *paths: str) -> None:
        """ENOENT if a directory above any of ``paths`` was replaced by a symlink while the
        handler awaited (a copy-up): root never acts through it (casfs.view.layers)."""
        for path in paths:
            if self.layers.moved_above(path):
                log.info("%r moved while it was copied up: ENOENT", path)
                raise err(errno.ENOENT)

    def _resolve(self, path: str) -> Node:
        node = self.layers.resolve(path)
        if node is None:
            raise err(errno.ENOENT)
        return node

    def _attrs(self, node: Node, ino: int) -> pyfuse3.EntryAttributes:
        if node.upper is not None:
            a = self._upper_attrs(node.upper, ino)
        else:
            assert node.lower is not None
            a = self._lower_attrs(node.lower, ino)
        if node.has_lower_dir:
            # A directory's link count is 2 + its subdirectories, lower ones included
            # (find(1) and rename tests rely on it); lower-only dirs are cached long.
            a.st_nlink = 2 + self.layers.subdir_count(node) if self.dir_nlink else 1
        return a

    def _upper_attrs(self, st: os.stat_result, ino: int) -> pyfuse3.EntryAttributes:
        # The root keeps short timeouts: stat of the mount point is how a dead
        # mount (ENOTCONN) is told from a live one, so it must reach the daemon.
        timeout = ROOT_TIMEOUT if ino == self.inodes.root else self.upper_timeout
        return upper_attrs(st, ino, timeout)

    def _lower_attrs(self, node: LowerNode, ino: int) -> pyfuse3.EntryAttributes:
        # A lower node's attributes depend on nothing else (its inode, the owner shown):
        # built once per inode, not on every lookup, getattr and directory entry.
        owner = self.lower_owner or self._owner
        hit = self._lower_attr_cache.get(ino)
        if hit is not None and hit[0] is node and hit[1] == owner:
            return hit[2]
        a = self._make_lower_attrs(node, ino, owner)
        if len(self._lower_attr_cache) >= 1 << 16:
            self._lower_attr_cache.clear()
        self._lower_attr_cache[ino] = (node, owner, a)
        return a

    def _make_lower_attrs(self, node: LowerNode, ino: int, owner: tuple[int, int]
                          ) -> pyfuse3.EntryAttributes:
        timeout = self.lower_timeout
        if isinstance(node, Entry):
            if self.replaced(node.path):
                timeout = self.replaced_timeout
            shown = self.presenter.size(node) if self.presenter is not None else None
            if shown is not None:
                node = dataclasses.replace(node, size=shown)
        return lower_attrs(
            node,
            ino,
            timeout,
            owner=owner,
            dir_mode=self.dir_mode,
            dir_time_ns=self._start_ns,
        )

    def replaced_changed(self, paths: Sequence[str]) -> None:
        """Newer versions of these replaced paths are served: the kernel forgets the old.

        A new version gets a new inode number: with the writeback cache the kernel
        keeps its own size for a cached inode and ignores the size getattr answers,
        so the old inode would show the old size over the new bytes (truncating a
        longer version). The old number stays valid for handles opened on it (they
        read the old version whole). The dentry is invalidated before this returns,
        so the next lookup, and every stat or open after a refresh, gets the new
        inode. Called from a worker thread, never a handler (the invalidations wait
        for the kernel).
        """
        if not self._mounted:
            return
        for path in paths:
            node = self.layers.resolve(path)
            if node is not None and node.upper is not None:
                continue  # this view's own copy shadows it: nothing it shows changed
            ino = self.inodes.find(path)
            if ino is None:
                continue  # the kernel never looked it up: nothing to forget
            if self.stable_names:
                # Same inode, new bytes: its attributes and pages are dropped (no
                # writeback cache here: the next getattr's size holds), its dentry kept.
                try:
                    pyfuse3.invalidate_inode(ino)
                except OSError as e:
                    if e.errno != errno.ENOENT:
                        log.warning("invalidating %r: %s", path, e)
                continue
            _in_trio_thread(self.inodes.detach, path)  # the table belongs to that thread
            try:
                pyfuse3.invalidate_inode(ino)
            except OSError as e:
                if e.errno != errno.ENOENT:
                    log.warning("invalidating %r: %s", path, e)
            parent, name = split(path)
            parent_ino = self.inodes.find(parent)
            if parent_ino is None:
                continue
            try:
                pyfuse3.invalidate_entry(parent_ino, os.fsencode(name))
            except OSError as e:
                if e.errno != errno.ENOENT:  # ENOENT: the kernel had no such dentry
                    log.warning("invalidating %r: %s", path, e)

    def upper_changed_elsewhere(self, paths: Sequence[str]) -> None:
        """A predecessor still draining (casfs.node.handover) changed these upper paths
        through its own mount (a job's cwd there): the kernel here forgets their
        dentries, attributes and pages (a new inode number for each, as for a replaced
        path), and the layers what they remembered. Else a file replaced there read
        here with the old size and bytes for the hour the timeouts allow (a review).
        Called from a worker thread: the invalidations wait for the kernel."""
        if not self._mounted:
            return
        _in_trio_thread(self.layers.changed_elsewhere)
        try:  # what the view remembers of misses on the way: forgotten with the kernel's
            trio.from_thread.run_sync(self._take_negatives, list(paths))
        except RuntimeError:  # not a trio worker thread (tests)
            self._take_negatives(list(paths))
        dentries: set[tuple[str, str]] = set()
        for path in paths:
            ino = self.inodes.find(path)
            if ino is not None:
                _in_trio_thread(self.inodes.detach, path)
                try:
                    pyfuse3.invalidate_inode(ino)
                except OSError as e:
                    if e.errno != errno.ENOENT:
                        log.warning("invalidating %r: %s", path, e)
            # The path's dentry, and the negative ones on the way (a directory made
            # there: the kernel here may hold "no such name" for it); the positive ones
            # on the way are right as they are.
            parent = ""
            for name in path.split("/"):
                here = join(parent, name)
                if here == path or self.inodes.find(here) is None:
                    dentries.add((parent, name))
                parent = here
        for parent, name in sorted(dentries, key=lambda d: -d[0].count("/")):
            parent_ino = self.inodes.find(parent)
            if parent_ino is None or not name:
                continue
            try:
                pyfuse3.invalidate_entry(parent_ino, os.fsencode(name))
            except OSError as e:
                if e.errno != errno.ENOENT:  # ENOENT: the kernel had no such dentry
                    log.warning("invalidating %r: %s", join(parent, name), e)

    def _invalidate_entry(self, path: str) -> None:
        """Make the kernel forget the dentry of ``path`` (asynchronously: no deadlock)."""
        if not self._mounted or not path:
            return
        parent, name = split(path)
        parent_ino = self.inodes.find(parent)
        if parent_ino is not None:
            pyfuse3.invalidate_entry_async(parent_ino, os.fsencode(name), ignore_enoent=True)


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


    def _initial_perm(self, ctx: pyfuse3.RequestContext, perm: int, private: int) -> int:
        """Permissions to create an entry with.

        An entry for another user is created private and opened up only after
        the chown, so nobody can use it in between; one for the daemon's own
        user gets its final permissions at once, and then needs no chmod.
        """
        if self._is_root and (ctx.uid, ctx.gid) != self._owner:
            return private
        return stat.S_IMODE(perm) & 0o777

    def _own(self, path: str, ctx: pyfuse3.RequestContext, mode: int, created: int,
             parent_st: os.stat_result | None = None) -> None:
        """New entries belong to the caller (the daemon runs as root); honour setgid dirs.

        ``created`` is the permission the entry was created with; only the
        syscalls that change something are made. ``parent_st``: the parent's stat
        taken just before (its group and setgid bit), else it is read here.
        """
        up = self.layers
        if self._is_root:
            gid = ctx.gid
            pst = parent_st if parent_st is not None else up.lstat(split(path)[0])
            created_gid = self._owner[1]
            if pst.st_mode & stat.S_ISGID:
                gid = created_gid = pst.st_gid  # the kernel already gave it the dir's group
                if stat.S_ISDIR(mode):
                    mode |= stat.S_ISGID
            if (ctx.uid, gid) != (self._owner[0], created_gid):
                up.lchown(path, ctx.uid, gid)
        perm = stat.S_IMODE(mode)
        if self.share_bits and not stat.S_ISLNK(mode):
            owner = perm & 0o700
            perm |= ((owner >> 3) | (owner >> 6)) & self.share_bits
        if not stat.S_ISLNK(mode) and (created & ~self._umask != perm):
            up.chmod(path, perm)  # exact mode: the daemon's umask must not apply

    def _prepare_new(self, path: str) -> os.stat_result | None:
        """Make room for a new entry: EEXIST if visible, else free the name of a whiteout.

        Returns the parent's upper stat when it existed already (see ``_own``)."""
        if self.layers.resolve(path) is not None:
            raise err(errno.EEXIST)
        parent_st = self.layers.ensure_upper_dir(split(path)[0], self.dir_mode)
        self.layers.remove_whiteout(path)
        return parent_st

    def _entry_reply(self, path: str) -> pyfuse3.EntryAttributes:
        node = self._resolve(path)
        return self._attrs(node, self.inodes.lookup(path, link_key(node)))


    def _upper_open(self, path: str) -> bool:
        ino = self.inodes.find(path)
        return ino is not None and self._open_upper[ino] > 0

    def _grow(self, fd: int | str, end: int) -> tuple[int, int]:
        """Charge the growth of the upper file ``fd`` (an fd, or an upper path) to
        ``end`` bytes: (its size before, bytes charged). EDQUOT/ENOSPC, nothing
        charged, when beyond the tenant's bound or the state filesystem's reserve."""
        q = self.quota
        if q is None:
            return 0, 0
        before = (os.fstat(fd) if isinstance(fd, int) else self.layers.lstat(fd)).st_size
        grow = round_up(end) - round_up(before) if end > before else 0
        if grow:
            q.take(grow)
        return before, grow

    def _settle(self, fd: int | str, before: int, charged: int) -> None:
        """Make the charge of the upper file ``fd`` (``charged`` for its growth from
        ``before``) what its size now says: a short or failed write, a shrink."""
        q = self.quota
        if q is None:
            return
        try:
            now = (os.fstat(fd) if isinstance(fd, int) else self.layers.lstat(fd)).st_size
        except OSError:
            now = before  # gone: its removal gave back what it counted
        delta = round_up(now) - round_up(before) - charged
        if delta:
            q.adjust(delta)

    def _handle(self, fh: int) -> Handle:
        h = self._handles.get(fh)
        if h is None:
            if fh in self.slots.held:
                raise Unopened(fh)
            raise err(errno.EBADF)
        return h

