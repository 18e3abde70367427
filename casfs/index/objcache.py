"""The local object cache: verified, decompressed, read-only files named by digest.

A FUSE read of a lower file is a ``pread`` on one of these files, and the
overlay/dir view modes hard-link them. Layout: ``<dir>/<ab>/<62 more hex>``,
mode 0444, plus ``.tmp-*`` files while filling.

* Fill: the source streams verified bytes into a temp file in the target's
  directory; the size is checked and the file renamed into place. No fsync:
  after a crash a torn file has the wrong size, which is treated as absent
  and refetched.
* Concurrency: fills of one digest in this process are coalesced (one fill,
  the others wait and share its result or error; an error is not remembered,
  the next call tries again). Across processes the rename makes a race
  harmless: both fill, the last rename wins, both files hold the same bytes.
* Pins: ``fetch`` pins the digest until ``unpin``; eviction never removes a
  file pinned in this process. Pins are checked and files unlinked under one
  lock, so a fetch never returns a path eviction is about to remove.
* Shared fds: ``open_cached`` hands out one fd per object, shared by the
  mount's handles (reads are preads) and kept open after the last
  ``release_cached`` (idle, LRU) up to a quarter of RLIMIT_NOFILE, shared
  evenly by the process's caches (one per namespace served); eviction
  closes an object's idle fd before unlinking it.
* LRU: sizes and last-access times live in the node index (shared with other
  processes). Hits are batched in memory and written every few seconds (one
  LMDB commit per hit would cost an fsync on the FUSE open path); fills are
  recorded at once. After a fill that leaves the cache over its cap, eviction
  removes least-recently-used unpinned objects down to ``LOW_WATER`` of the cap
  so that it does not run after every fill.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import mmap
import os
import re
import resource
import shutil
import stat
import threading
import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Protocol

import blake3

from casfs.errors import CasfsError, CorruptObjectError, ObjectMissingError
from casfs.index import cachedb
from casfs.index.node_index import NodeIndex
from casfs.store.entry import Entry
from casfs.util import diskroom
from casfs.util.atomic import temp_name
from casfs.util.counters import Counters
from casfs.util.shares import EvenShares

log = logging.getLogger(__name__)

LOW_WATER = 0.9
TOUCH_FLUSH_INTERVAL = 5.0  # seconds between LRU writes for cache hits
TOUCH_FLUSH_MAX = 256  # ... or this many distinct hits, whichever comes first
# With ``flushed_elsewhere`` (a mount's periodic task flushes): the batch's bound.
TOUCH_BATCH_MAX = 1 << 16
_DIGEST = re.compile(r"[0-9a-f]{64}")
# hash_file uses threads only above this size. Measured (2 busy cores, mmap): one
# thread hashes 1 MiB in 0.2 ms and 64 MiB in 30 ms; threads saved 12% at 64 MiB
# and cost 50% at 16 MiB.
THREADS_ABOVE = 32 << 20
# ... and maps the file only above this size: a read costs less than mmap's set-up and
# page faults for the few-KB files most caches hold (16 KB: 12 vs 22 us hashed).
MAP_ABOVE = 1 << 20
# A cache file up to this size is hashed inline on its first open (blake3: ~60 us
# for 256 KiB), cheaper than handing the open to a thread; larger ones in the
# fetch thread. (bench/readpath "remount": 991 files/s when every first open
# went to a thread, against 1,916 without hashing.)
INLINE_VERIFY_MAX = 256 << 10
# A job's open waits this long for an object a whole-namespace prefetch (fill_packs) has
# planned, then fetches it itself: the prefetch installs in its own order.
BULK_WAIT = 2.0
_TMP_SEQ = itertools.count()
# A cache file is opened never following a link and never blocking (a FIFO put there).
_OPEN_CACHED = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
# Idle shared fds kept open (``open_cached``): at most this many per cache, and at
# most a quarter of the process's RLIMIT_NOFILE soft limit for all its caches.
SHARED_IDLE_MAX = 8192
# ... and of at most this many bytes of objects: another process may evict (unlink)
# an object an idle fd holds, and its space stays in use until the fd is closed.
SHARED_IDLE_BYTES = 256 << 20
# The fd bound and the bytes bound are the process's: its caches (one per namespace
# it serves) share them evenly.
_IDLE_SHARES = EvenShares()


def idle_fd_bound() -> int:
    """How many idle object fds a process may keep: a quarter of RLIMIT_NOFILE (its
    caches share it; each keeps at most SHARED_IDLE_MAX)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:  # no limit: only the per-namespace cap applies
        return 1 << 30
    return max(0, soft // 4)


def discard_cache_dir(directory: Path) -> None:
    """Drop a whole local object cache whose accounting is lost (the node index was
    damaged and started afresh): moved aside at once, deleted in the background.
    Its objects are fetched again when used; kept, they would fill the disk outside
    the cap, since nothing knows of them any more."""
    aside = directory.with_name(f"{directory.name}.stale-{time.time_ns()}")
    try:
        os.rename(directory, aside)
    except FileNotFoundError:
        return
    except OSError as e:
        log.warning("cannot set aside the object cache %s: %s", directory, e)
        return
    log.warning("the object cache %s was dropped with the damaged index (%s)", directory, aside)
    threading.Thread(target=shutil.rmtree, args=(aside,), kwargs={"ignore_errors": True},
                     name="casfs-drop-stale-cache", daemon=True).start()


class ObjectSource(Protocol):
    """Where objects come from (casfs.store.objects.ObjectStore satisfies it)."""

    def get_into(self, digest: str, expected_size: int | None, out: BinaryIO) -> int:
        """Write the verified, decompressed bytes of ``digest`` to ``out``; return the count.

        Raises CorruptObjectError or ObjectMissingError.
        """
        ...


class _Reserved:
    """A prefetch wave's objects registered as being filled (LocalObjectCache.reserve_packs)."""

    def __init__(self, items: list[tuple[str, int]], mine: dict[str, tuple[int, _Fill]],
                 packs: set[str]) -> None:
        self.items = items
        self.mine = mine
        self.packs = packs


class _Done:
    """A one-shot event whose threading.Event is made by its first waiter: a
    whole-namespace prefetch reserves thousands of fills that nobody waits for (an
    Event each was ~5 us, 25 ms of a 4,800-file plan a job's start waits on)."""

    __slots__ = ("_event", "_flag")
    _lock = threading.Lock()  # shared: held only to read or set the two fields

    def __init__(self) -> None:
        self._flag = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with _Done._lock:
            self._flag = True
            event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        with _Done._lock:
            if self._flag:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)


class _Fill:
    """One in-flight fill; waiters block on ``done`` and then read ``error``."""

    def __init__(self, speculative: bool = False, bulk: bool = False) -> None:
        self.done = _Done()
        self.error: BaseException | None = None
        self.waiters = 0
        self.started = self.progressed = time.monotonic()  # progressed: last bytes written
        # A read-ahead's (fill_many): when it fails, a waiter fills the object itself.
        self.speculative = speculative or bulk
        # A whole-namespace prefetch's (fill_packs): a waiter waits at most BULK_WAIT for
        # it, then fills the object itself (the job reads in another order).
        self.bulk = bulk


def _rewrap(error: BaseException) -> BaseException:
    """A fresh exception for a waiter (one object must not be raised in many threads)."""
    if isinstance(error, CasfsError):
        new: BaseException = type(error)(error.message)
    else:
        new = CasfsError(f"filling the local object cache failed: {error}")
    new.__cause__ = error
    return new


class CacheFiller(Protocol):
    """Fills the cache from another process (casfs.node.fetchproc satisfies it)."""

    def fill_cache(self, digest: str, size: int, progressed: Callable[[], None]
                   ) -> tuple[int, int, int] | None:
        """Make ``digest``'s verified file (``size`` bytes) present in the cache directory.

        Blocks until done; calls ``progressed`` whenever bytes arrive. Returns
        the (inode, mtime_ns, size) of the file it wrote, if known (so the
        caller need not hash it again). Raises CasfsError (CorruptObjectError
        for bad content, ObjectMissingError) when it cannot.
        """
        ...


class _Progress:
    """A file wrapper noting when bytes last arrived (a slow fetch is not a dead one)."""

    def __init__(self, f: BinaryIO, progressed: Callable[[], None]) -> None:
        self._f = f
        self._progressed = progressed

    def write(self, data: bytes) -> int:
        self._progressed()
        return self._f.write(data)

    # a rejected object read again (casfs.store.objects, a site cache's bytes) starts over
    def tell(self) -> int:
        return self._f.tell()

    def seek(self, pos: int) -> int:
        return self._f.seek(pos)

    def truncate(self, size: int | None = None) -> int:
        return self._f.truncate(size)


def hash_file(path: Path | str) -> tuple[str, os.stat_result]:
    """blake3 hex digest of a local regular file, and the stat of what was hashed.

    Opened like every store file (never following a link, never blocking), so
    the identity returned is the one of the bytes hashed.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        h = blake3.blake3(max_threads=blake3.blake3.AUTO if st.st_size >= THREADS_ABOVE else 1)
        if st.st_size > MAP_ABOVE:
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as m:
                h.update(m)
        else:  # a small file (most cache files): read, not mapped (12 vs 22 us a 16 KB file)
            while chunk := os.read(fd, MAP_ABOVE + 1):
                h.update(chunk)
        return h.hexdigest(), st
    finally:
        os.close(fd)


def object_path(directory: Path | str, digest: str) -> Path:
    return Path(directory) / digest[:2] / digest[2:]


def fill_file(directory: Path, source: ObjectSource, digest: str, size: int,
              progressed: Callable[[], None] = lambda: None) -> int:
    """Stream ``digest`` from ``source`` into the cache at ``directory``: temp file, rename.

    The one way a cache file is written, in a mount process or in its fetch
    worker (casfs.node.fetchworker). Returns the bytes written. Refused (a miss)
    when it would leave less than the state filesystem's reserve free
    (casfs.util.diskroom): the cache evicts to its cap, and never fills the disk
    the node index commits to.
    """
    try:
        diskroom.check_room(directory, size)
    except OSError as e:
        raise CasfsError(f"local object cache {directory}: {e}") from e
    path = object_path(directory, digest)
    tmp = temp_name(path.parent, "fill-")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    renamed = False
    try:
        try:
            fd = os.open(tmp, flags, 0o600)
        except FileNotFoundError:  # first object of its fan-out dir
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, flags, 0o600)
    except OSError as e:
        raise CasfsError(f"local object cache {directory}: {e}") from e
    try:
        with os.fdopen(fd, "wb") as f:
            n = source.get_into(digest, size, _Progress(f, progressed))  # type: ignore[arg-type]
            f.flush()
            actual = os.fstat(f.fileno()).st_size
        if n != size or actual != size:
            raise CorruptObjectError(
                f"object {digest}: got {n} bytes ({actual} written), expected {size}"
            )
        os.chmod(tmp, 0o444)
        os.rename(tmp, path)
        renamed = True
    except OSError as e:
        raise CasfsError(f"local object cache {directory}: {e}") from e
    finally:
        if not renamed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return n


def install_file(directory: str, digest: str, data: bytes | memoryview) -> os.stat_result:
    """Write verified bytes as the cache file of ``digest``: a temp file created 0444,
    written, renamed into place; returns its fstat (identity: inode, mtime, size).

    fill_file's lean twin for objects decoded in memory (the whole-namespace
    fetch installs thousands of few-KB pack members): no stream, no chmod, a temp
    name from a counter; the caller checks the disk's room once for a batch."""
    fan = f"{directory}/{digest[:2]}"
    tmp = f"{fan}/.tmp-fill-{os.getpid()}-{next(_TMP_SEQ)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        try:
            fd = os.open(tmp, flags, 0o444)
        except FileNotFoundError:  # first object of its fan-out dir
            os.makedirs(fan, exist_ok=True)
            fd = os.open(tmp, flags, 0o444)
    except OSError as e:
        raise CasfsError(f"local object cache {directory}: {e}") from e
    renamed = False
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            st = os.fstat(fd)
            if stat.S_IMODE(st.st_mode) != 0o444:  # a umask took bits away
                os.fchmod(fd, 0o444)
                st = os.fstat(fd)
        finally:
            os.close(fd)
        if st.st_size != len(data):
            raise CorruptObjectError(f"object {digest}: {st.st_size} bytes written,"
                                     f" expected {len(data)}")
        os.rename(tmp, f"{fan}/{digest[2:]}")
        renamed = True
    except OSError as e:
        raise CasfsError(f"local object cache {directory}: {e}") from e
    finally:
        if not renamed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return st


class LocalObjectCache:
    """Satisfies casfs.index.tree.ObjectFetcher."""

    def __init__(
        self, directory: Path, index: NodeIndex, source: ObjectSource, cap_bytes: int,
        filler: CacheFiller | None = None, counters: Counters | None = None,
        verify_first_open: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._dir = str(self.directory)  # warm opens build paths as strings (no pathlib)
        # Warm opens resolve "ab/cdef..." from here (not the whole path each time).
        self._dir_fd = os.open(self._dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        weakref.finalize(self, os.close, self._dir_fd)
        self.cap_bytes = cap_bytes
        self._index = index
        self._source = source
        self._filler = filler
        self._counters = counters
        self.verify_first_open = verify_first_open
        self._verified: dict[str, tuple[int, int, int]] = {}  # digest -> trusted identity
        # Told the digests each fill installs (a prefetch wave's answer, a read-ahead's,
        # a fetch), outside the lock: overlay mode's warm wait links them while the rest
        # arrives (casfs.view.overlay.EarlyLinks).
        self.installed_hook: Callable[[list[str]], None] | None = None
        self._lock = threading.Lock()  # guards pins, fills, touches; held for eviction unlinks
        self._evict_lock = threading.Lock()
        self._pins: Counter[str] = Counter()
        self._fills: dict[str, _Fill] = {}
        # Packs a whole-namespace prefetch is reading now (read-ahead leaves them to it).
        self._bulk_packs: set[str] = set()
        # Set while a whole-namespace prefetch plans (until its first waves are reserved):
        # a job's first opens wait for it instead of fetching what it will fetch.
        self._bulk_gate: threading.Event | None = None
        self._touches: dict[str, tuple[int, int]] = {}
        self._last_flush = time.monotonic()
        # Shared fds of trusted objects (``open_cached``), see ``_shared`` below. One
        # with no handle stays open (idle, LRU order) up to ``idle_fds`` and
        # SHARED_IDLE_BYTES: a warm open of it needs no openat/fstat and its release
        # no close. Reads are preads, so handles can share one fd. An idle fd is
        # closed when its object is evicted here, when over a bound, and when an
        # open meets EMFILE.
        self._shared: dict[str, list[int]] = {}  # digest -> [fd, handles, size]
        self._idle: OrderedDict[str, int] = OrderedDict()  # digest -> object size
        self._idle_bytes = 0  # bytes of the idle fds' objects (bounded: see SHARED_IDLE_BYTES)
        self.idle_fds = idle_fd_bound()  # the process's bound: this cache keeps its share
        self._leave_shares = _IDLE_SHARES.join(self)
        # Set by a mount that calls flush_touches every few seconds from a worker thread:
        # a warm open (the FUSE loop) then only notes the hit, no LMDB write inline.
        self.flushed_elsewhere = False

    def path_of(self, digest: str) -> Path:
        return object_path(self.directory, digest)

    def file_of(self, digest: str) -> str:
        """``path_of`` as a string, without pathlib (per file of a fresh node's links)."""
        return f"{self._dir}/{digest[:2]}/{digest[2:]}"

    # --- ObjectFetcher ------------------------------------------------------

    def fetch(self, entry: Entry) -> str:
        """Path of a local file holding the entry's bytes, pinned until ``unpin``."""
        return self.ensure_file(entry.digest, entry.size)

    def cached(self, entry: Entry) -> str | None:
        """A pinned local path if the object is already cached (local stat only), else None."""
        digest = entry.digest
        path = f"{self._dir}/{digest[:2]}/{digest[2:]}"
        with self._lock:
            if digest in self._fills:
                return None  # being filled: let fetch wait for it
            self._pins[digest] += 1
        st = self._stat_ok(path, entry.size)
        if st is not None and (self._trusted(digest, st) or (
                entry.size <= INLINE_VERIFY_MAX and self._verify(digest, path, st))):
            self._touch(digest, entry.size)
            return path
        self.unpin(digest)
        return None  # absent, damaged, or large and not yet verified here: fetch hashes it

    def open_cached(self, entry: Entry) -> int | None:
        """An open read-only fd of the cached object, pinned, if it is local and trusted
        already; else None (call ``cached``/``fetch``). Give it back with
        ``release_cached`` (never close it: other handles may share it).

        The warm open of a mount: the object's shared fd when one is open (held by
        another handle or idle since a recent release: one fstat, to check that its
        file still has the identity verified here, no open and no close), else
        one open and one fstat relative to the cache directory's fd, no lstat of the
        whole path first. Anything unusual (absent, not a regular file, wrong size,
        not verified in this process yet, being filled) is left to the slow path,
        which repairs it.
        """
        digest = entry.digest
        if digest in self._shared:
            shared = self._take_shared(digest, entry.size)
            if shared is not None:
                self._touch(digest, entry.size)
                self._count("open_shared")
                return shared
        with self._lock:
            if digest in self._fills:
                return None
            self._pins[digest] += 1
        try:
            fd = os.open(f"{digest[:2]}/{digest[2:]}", _OPEN_CACHED, dir_fd=self._dir_fd)
        except OSError as e:
            if e.errno != errno.EMFILE or not self._close_idle(len(self._idle) // 2 + 1):
                self.unpin(digest)
                return None
            try:  # idle fds closed: once more
                fd = os.open(f"{digest[:2]}/{digest[2:]}", _OPEN_CACHED, dir_fd=self._dir_fd)
            except OSError:
                self.unpin(digest)
                return None
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_size != entry.size
                or (self.verify_first_open
                    and self._verified.get(digest) != (st.st_ino, st.st_mtime_ns, st.st_size))):
            os.close(fd)
            self.unpin(digest)
            return None
        with self._lock:
            # Else a shared fd no longer trusted is still used, or another thread
            # shared one meanwhile: this fd stays the caller's own (release_cached
            # closes it).
            if digest not in self._shared:
                self._shared[digest] = [fd, 1, st.st_size]
        self._touch(digest, entry.size)
        return fd

    def _take_shared(self, digest: str, size: int) -> int | None:
        """The object's shared fd, pinned and counted, if its file still has the
        identity verified here (one fstat: an edit in place or a replaced verification
        is noticed as with an open); else None, and an idle one is closed. Under the
        lock: eviction and the idle bound close fds from other threads, so the fd is
        checked and taken while none of them can close it (or reuse its number)."""
        with self._lock:
            slot = self._shared.get(digest)
            if slot is None:
                return None
            fd = slot[0]
            try:
                st = os.fstat(fd)
            except OSError:
                st = None
            if st is not None and st.st_size == size and (
                    not self.verify_first_open
                    or self._verified.get(digest) == (st.st_ino, st.st_mtime_ns, st.st_size)):
                if not slot[1]:
                    self._idle_bytes -= self._idle.pop(digest)
                slot[1] += 1
                self._pins[digest] += 1
                return fd
            if not slot[1]:  # no longer trusted and unused: closed (a used one: its handles')
                self._idle_bytes -= self._idle.pop(digest)
                del self._shared[digest]
                os.close(fd)
            return None

    def release_cached(self, digest: str, fd: int) -> None:
        """A handle of ``open_cached``'s fd is closed: unpin; the fd stays open (idle)
        while the bound allows."""
        with self._lock:
            slot = self._shared.get(digest)
            if slot is None or slot[0] != fd:  # the caller's own fd (see open_cached)
                os.close(fd)
            else:
                slot[1] -= 1
                if not slot[1]:
                    self._idle[digest] = slot[2]
                    self._idle_bytes += slot[2]
                    max_fds = min(SHARED_IDLE_MAX, _IDLE_SHARES.of(self.idle_fds))
                    max_bytes = _IDLE_SHARES.of(SHARED_IDLE_BYTES)
                    while self._idle and (len(self._idle) > max_fds
                                          or self._idle_bytes > max_bytes):
                        old, size = self._idle.popitem(last=False)
                        self._idle_bytes -= size
                        os.close(self._shared.pop(old)[0])
            if self._pins[digest] <= 1:
                self._pins.pop(digest, None)
            else:
                self._pins[digest] -= 1

    def _close_idle(self, n: int) -> int:
        """Close the ``n`` oldest idle shared fds; how many were closed."""
        closed = 0
        with self._lock:
            while closed < n and self._idle:
                old, size = self._idle.popitem(last=False)
                self._idle_bytes -= size
                os.close(self._shared.pop(old)[0])
                closed += 1
        return closed

    def shared_fds(self) -> tuple[int, int]:
        """(shared fds open, of which idle): for tests and metrics."""
        with self._lock:
            return len(self._shared), len(self._idle)

    def unpin(self, digest: str) -> None:
        with self._lock:
            if self._pins[digest] <= 1:
                self._pins.pop(digest, None)
            else:
                self._pins[digest] -= 1

    # --- other callers -------------------------------------------------------

    def ensure_file(self, digest: str, size: int) -> str:
        """Like ``fetch`` for a bare digest and size: a pinned local path (call ``unpin``).

        Raises CasfsError (CorruptObjectError, ObjectMissingError, ...) when the
        object cannot be provided: callers treat it as a miss.
        """
        if not _DIGEST.fullmatch(digest):
            raise CorruptObjectError(f"not a blake3-256 hex digest: {digest!r:.80}")
        path = self.path_of(digest)
        self.wait_bulk_plan()
        with self._lock:
            self._pins[digest] += 1  # before looking, so eviction cannot race the check
            # Being filled (a read-ahead): its file may be in place, not yet trusted. Wait
            # for the fill instead of hashing the file meanwhile.
            filling = digest in self._fills
        try:
            filled = filling or not self._usable(digest, path, size)
            if filled:
                self._fill_coalesced(digest, size, path)
            self._touch(digest, size)
        except BaseException:
            self.unpin(digest)
            raise
        if filled:
            self._installed([digest])
        return str(path)

    def pinned(self, digest: str) -> int:
        with self._lock:
            return self._pins[digest]

    def hardlink_or_copy(self, digest: str, dest: str | os.PathLike[str]) -> bool:
        """Put the cached file of ``digest`` at ``dest``: a hard link if possible, else a copy.

        Returns True for a link. A link shares the cache's inode (mode 0444):
        callers that need other permission bits must copy. The object must be
        in the cache (``ensure_file`` first).
        """
        src = self.path_of(digest)
        try:
            os.link(src, dest)
            return True
        except FileNotFoundError as e:
            if not src.exists():
                raise ObjectMissingError(f"object {digest} is not in the local cache") from e
            raise
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise
        shutil.copyfile(src, dest)
        return False

    # --- filling ---------------------------------------------------------------

    def _present(self, path: Path | str, size: int) -> bool:
        return self._stat_ok(path, size) is not None

    def _stat_ok(self, path: Path | str, size: int) -> os.stat_result | None:
        """The cache file's stat if it is a regular file of ``size`` bytes, else None."""
        try:
            st = os.lstat(path)  # never follow: a symlink here could point anywhere
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            # Not ours (fills only ever rename regular files here): remove it so
            # the fill's rename can take its place, and never open it.
            log.warning("cached object %s is not a regular file: removing, refetching", path)
            with contextlib.suppress(OSError):
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
            return None
        actual = st.st_size
        if actual != size:
            # A torn or damaged local copy: the fill's rename replaces it.
            log.warning(
                "cached object %s has %d bytes, expected %d: refetching", path, actual, size
            )
            return None
        return st

    # --- verification on first open ----------------------------------------------
    # A cache file is trusted by this process only once its bytes were hashed here
    # (or written by a fill, which hashes while streaming), and only while its
    # identity (inode, mtime, size) is the one seen then: a bit flip on disk, a
    # file replaced by another process or edited in place is hashed again.

    def _trusted(self, digest: str, st: os.stat_result) -> bool:
        if not self.verify_first_open:
            return True
        with self._lock:
            return self._verified.get(digest) == (st.st_ino, st.st_mtime_ns, st.st_size)

    def _installed(self, digests: list[str]) -> None:
        hook = self.installed_hook
        if hook is not None:
            hook(digests)

    def _remember(self, digest: str, ident: tuple[int, int, int] | None = None) -> None:
        if ident is None:
            try:
                st = os.lstat(self.path_of(digest))
            except OSError:
                return
            ident = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            self._verified[digest] = ident

    def _usable(self, digest: str, path: Path, size: int) -> bool:
        """Present with the right bytes: trusted already, or hashed now (a mismatch is removed)."""
        st = self._stat_ok(path, size)
        if st is None:
            return False
        return self._trusted(digest, st) or self._verify(digest, path, st)

    def _verify(self, digest: str, path: Path | str, st: os.stat_result) -> bool:
        """Hash the cache file: trusted from now on if it matches, removed if not."""
        try:
            actual, hashed = hash_file(path)
        except OSError as e:
            log.warning("cannot read cached object %s: %s: refetching", path, e)
            return False
        self._count("cache_verified")
        if actual != digest:
            self._count("cache_damaged")
            log.warning("cached object %s does not hash to its name: removing, refetching",
                        path)
            with contextlib.suppress(OSError):
                os.unlink(path)
            return False
        self._remember(digest, (hashed.st_ino, hashed.st_mtime_ns, hashed.st_size))
        return (hashed.st_ino, hashed.st_mtime_ns, hashed.st_size) == (
            st.st_ino, st.st_mtime_ns, st.st_size)  # else replaced meanwhile: look again

    def _count(self, name: str) -> None:
        if self._counters is not None:
            self._counters.inc(name)

    def _fill_coalesced(self, digest: str, size: int, path: Path) -> None:
        while True:
            with self._lock:
                fill = self._fills.get(digest)
                owner = fill is None
                if fill is None:
                    fill = self._fills[digest] = _Fill()
                else:
                    fill.waiters += 1
            if owner:
                break
            if fill.bulk:
                self._count("prefetch_waits")  # a job's open waited for the prefetch
                if not fill.done.wait(BULK_WAIT):
                    # Planned but not there yet (the job reads in another order): our own
                    # fill, beside it (both write the same verified bytes).
                    self._count("prefetch_overtaken")
                    self._fill(digest, size, path)
                    self._after_fill()
                    return
            elif fill.speculative:
                self._count("readahead_waits")  # a job's open waited for a read-ahead
            fill.done.wait()
            if fill.speculative and (fill.error is not None
                                     or not self._usable(digest, path, size)):
                continue  # a read-ahead failed (or had another size): fill it ourselves
            if fill.error is not None:
                raise _rewrap(fill.error)
            if not self._usable(digest, path, size):  # the filler was asked for another size
                raise CorruptObjectError(f"object {digest} does not have the expected {size} bytes")
            return
        try:
            if not self._usable(digest, path, size):  # a fill that just finished left it
                self._fill(digest, size, path, fill)
        except BaseException as e:
            fill.error = e
            raise
        finally:
            with self._lock:
                del self._fills[digest]
            fill.done.set()
        self._after_fill()

    def fill_many(self, items: list[tuple[str, int]], packs: list[str] | None = None
                  ) -> tuple[int, int]:
        """Fill several objects (read-ahead) with one request to the filler, each
        verified like any fill; those local already or being filled are skipped.
        A job's open of one of them meanwhile waits for it (and fills it itself if
        it fails). ``packs``: the filler also adds the other members of these packs
        (its identity of each file is trusted like a fill's). Errors are not raised:
        returns (filled, failed)."""
        mine: dict[str, tuple[int, _Fill]] = {}
        with self._lock:
            for digest, size in items:
                if digest not in self._fills and digest not in mine:
                    mine[digest] = (size, _Fill(speculative=True))
                    self._fills[digest] = mine[digest][1]
        todo = []
        for digest, (size, fill) in mine.items():
            try:
                local = self._usable(digest, self.path_of(digest), size)
            except OSError:
                local = False
            if local:
                self._end_fill(digest, fill, None)
            else:
                todo.append((digest, size))
        filled: dict[str, tuple[int, int]] = {}
        failed = 0

        def done(digest: str, ident: tuple[int, int, int] | None,
                 error: BaseException | None) -> None:
            nonlocal failed
            size, fill = mine.get(digest, (0, None))
            if fill is None or fill.done.is_set():
                return  # not ours, or answered already (a request sent twice)
            if error is None:
                st = self._stat_ok(self.path_of(digest), size)
                if st is None or (ident != (st.st_ino, st.st_mtime_ns, st.st_size)
                                  and not self._trusted(digest, st)
                                  and not self._verify(digest, self.path_of(digest), st)):
                    error = CorruptObjectError(f"object {digest}: no verified file of {size}"
                                               " bytes after the fetch worker's fill")
                else:
                    self._remember(digest, (st.st_ino, st.st_mtime_ns, st.st_size))
                    filled[digest] = (size, time.time_ns())
            if error is not None:
                failed += 1
            self._end_fill(digest, fill, error)
            if error is None:
                self._installed([digest])

        def progressed() -> None:
            now = time.monotonic()
            for _, fill in mine.values():
                fill.progressed = now

        def adopt(digest: str, size: int, ident: tuple[int, int, int]) -> bool:
            """A file the filler added (a pack member): trusted if it is still that file.
            True if adopted (what the read-ahead brought), False if passed over."""
            if not _DIGEST.fullmatch(digest) or digest in mine:
                return False
            with self._lock:
                if digest in self._fills:
                    return False  # a fill of it runs here (a job's open): that one decides
            st = self._stat_ok(self.path_of(digest), size)
            if st is not None and ident == (st.st_ino, st.st_mtime_ns, st.st_size):
                self._remember(digest, ident)
                filled[digest] = (size, time.time_ns())
                self._installed([digest])
                return True
            return False

        # The filler's fill_many(items, progressed, done), if it has one (the fetch
        # worker's: one request): done(digest, ident, error) once per object answered.
        batch = getattr(self._filler, "fill_many", None)
        try:
            if batch is not None and (todo or packs):
                if packs:
                    batch(todo, progressed, done, packs, adopt)
                else:
                    batch(todo, progressed, done)
            else:
                for digest, size in todo:  # no batch filler: one by one, in this thread
                    try:
                        self._fill(digest, size, self.path_of(digest))
                        done(digest, None, None)
                    except (CasfsError, OSError) as e:
                        done(digest, None, e)
        except Exception as e:  # the request as a whole: a hint lost, never the job's error
            log.debug("read-ahead of %d objects failed: %s", len(todo), e)
        finally:
            for digest, _ in todo:  # not answered (the request failed): failed
                done(digest, None, CasfsError("read-ahead: no answer"))
        if filled and not self._index.readonly:
            with self._lock:
                for digest in filled:
                    self._touches.pop(digest, None)
            cachedb.record(self._index.env, filled)
            self._after_fill()
        return len(filled), failed

    def pack_of(self, digest: str) -> tuple[str, int, int] | None:
        """Where a pack holds ``digest``, if the filler knows (None: loose, or no filler)."""
        fn = getattr(self._filler, "pack_of", None)
        return fn(digest) if fn is not None else None

    def bulk_planning(self) -> None:
        """A whole-namespace prefetch is planning: fetches wait (at most BULK_WAIT)."""
        self._bulk_gate = threading.Event()

    def bulk_planned(self) -> None:
        """Its first waves are reserved (or it gave up): fetches go on."""
        gate = self._bulk_gate
        if gate is not None:
            gate.set()

    def wait_bulk_plan(self) -> None:
        gate = self._bulk_gate
        if gate is not None and not gate.is_set():
            gate.wait(BULK_WAIT)

    def covers_pack(self, pack: str) -> bool:
        """Whether a whole-namespace prefetch is reading ``pack`` now."""
        return pack in self._bulk_packs

    def on_node(self, digest: str, size: int) -> bool:
        """Whether a cache file of ``digest`` with ``size`` bytes is here (one lstat, no
        hash: the prefetch leaves it to the first open, which verifies it)."""
        if digest in self._verified:
            return True
        try:
            st = os.lstat(f"{self._dir}/{digest[:2]}/{digest[2:]}")
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == size

    def local_digests(self) -> set[str]:
        """Digests of every object in the local cache: one listing of its fan-out dirs,
        not a stat per object (a fresh node's cache is empty: one failed listing)."""
        out: set[str] = set()
        try:
            fans = list(os.scandir(self._dir))
        except FileNotFoundError:
            return out
        for fan in fans:
            if len(fan.name) == 2 and fan.is_dir(follow_symlinks=False):
                with os.scandir(fan.path) as it:
                    out.update(fan.name + f.name for f in it if len(f.name) == 62)
        return out

    def trusted_digest(self, digest: str) -> bool:
        """Whether this process verified a file of ``digest`` already (no I/O: the
        prefetch plans without the objects it has; an open still checks the file)."""
        return digest in self._verified

    def fill_packs(self, items: list[tuple[str, int]],
                   stop: threading.Event | None = None) -> tuple[int, int]:
        return self.fill_reserved(self.reserve_packs(items), stop)

    def reserve_packs(self, items: list[tuple[str, int]]) -> _Reserved:
        """Register ``items`` as being filled by a prefetch (a job's open of one waits
        for it); ``fill_reserved`` fills them."""
        mine: dict[str, tuple[int, _Fill]] = {}
        with self._lock:
            for digest, size in items:
                if (digest not in self._fills and digest not in mine
                        and digest not in self._verified):
                    mine[digest] = (size, _Fill(bulk=True))
                    self._fills[digest] = mine[digest][1]
        pack_of = getattr(self._filler, "pack_of", None)
        packs = {loc[0] for d in mine
                 if pack_of is not None and (loc := pack_of(d)) is not None}
        with self._lock:
            packs -= self._bulk_packs  # another wave's: that one removes them
            self._bulk_packs |= packs
        return _Reserved(items, mine, packs)

    def release_reserved(self, reserved: _Reserved) -> None:
        """Give up a reservation never filled (the prefetch stopped): waiters fill."""
        with self._lock:
            self._bulk_packs -= reserved.packs
        for digest, (_, fill) in reserved.mine.items():
            if not fill.done.is_set():
                self._end_fill(digest, fill, CasfsError("prefetch: stopped"))

    def fill_reserved(self, reserved: _Reserved,
                      stop: threading.Event | None = None) -> tuple[int, int]:
        """Fill many objects (a whole-namespace prefetch's wave) with one request to the
        filler, which reads each pack holding some of them once (all at once) and
        installs the objects in the order given, each verified by its digest. Objects
        local and trusted, or being filled, are skipped. A job's open of one of them
        meanwhile waits for it (at most BULK_WAIT, then fetches it itself). One index
        write for the wave. ``stop`` set: the filler installs no more of it (the
        namespace goes; what it did not install is not filled). Errors are not raised:
        returns (filled, failed)."""
        batch = getattr(self._filler, "fill_packs", None)
        mine, packs = reserved.mine, reserved.packs
        if batch is None:  # no fetch worker (debugging): read-ahead's way, one by one
            with self._lock:
                self._bulk_packs -= packs
            for digest, (_, fill) in mine.items():
                self._end_fill(digest, fill, CasfsError("prefetch: no fetch worker"))
            return self.fill_many(reserved.items)
        todo = [(d, n) for d, (n, _) in mine.items()]
        filled: dict[str, tuple[int, int]] = {}
        failed = 0

        def done(ok: list[tuple[str, tuple[int, int, int]]],
                 bad: list[tuple[str, BaseException]]) -> None:
            nonlocal failed
            now = time.time_ns()
            got: list[str] = []
            with self._lock:
                for digest, ident in ok:
                    size, fill = mine.get(digest, (0, None))
                    if fill is None or fill.done.is_set() or ident[2] != size:
                        continue  # not ours, answered already, or not the size asked
                    # The worker verified the bytes it wrote: trusted while the file has
                    # that identity (an open checks it with its fstat).
                    self._verified[digest] = ident
                    filled[digest] = (size, now)
                    got.append(digest)
                    if self._fills.get(digest) is fill:
                        del self._fills[digest]
                    fill.done.set()
                for digest, error in bad:
                    _, fill = mine.get(digest, (0, None))
                    if fill is None or fill.done.is_set():
                        continue
                    failed += 1
                    if self._fills.get(digest) is fill:
                        del self._fills[digest]
                    fill.error = error
                    fill.done.set()
            if got:
                self._installed(got)

        def progressed() -> None:
            now = time.monotonic()
            for _, fill in mine.values():
                fill.progressed = now

        try:
            if todo:
                batch(todo, progressed, done, stop)
        except Exception as e:  # the request as a whole: a hint lost, never the job's error
            log.debug("prefetch of %d objects failed: %s", len(todo), e)
        finally:
            with self._lock:
                self._bulk_packs -= packs
            stopped = stop is not None and stop.is_set()
            for digest, (_, fill) in mine.items():  # not answered (failed, or stopped)
                if not fill.done.is_set():
                    failed += 0 if stopped else 1  # (stopped: not wanted, not failed)
                    self._end_fill(digest, fill, CasfsError(
                        "prefetch: stopped" if stopped else "prefetch: no answer"))
        if filled and not self._index.readonly:
            with self._lock:
                for digest in filled:
                    self._touches.pop(digest, None)
            cachedb.record(self._index.env, filled)
            self._after_fill()
        return len(filled), failed

    def _end_fill(self, digest: str, fill: _Fill, error: BaseException | None) -> None:
        with self._lock:
            if self._fills.get(digest) is fill:
                del self._fills[digest]
            fill.error = error
            fill.done.set()

    def fill_progress(self, digest: str) -> float | None:
        """Seconds since the in-flight fill of ``digest`` last received bytes.

        None when no fill is in flight or none of its bytes arrived yet (stalled).
        """
        with self._lock:
            fill = self._fills.get(digest)
        if fill is None or fill.progressed == fill.started:
            return None
        return time.monotonic() - fill.progressed

    def _fill(self, digest: str, size: int, path: Path, fill: _Fill | None = None) -> None:
        def progressed() -> None:
            if fill is not None:
                fill.progressed = time.monotonic()

        if self._filler is not None:
            # Another process (casfs.node.fetchproc) reads the shared root and
            # writes the file; a crash or hang there costs this process a miss.
            ident = self._filler.fill_cache(digest, size, progressed)
            st = self._stat_ok(path, size)
            if st is None:
                raise CorruptObjectError(
                    f"object {digest}: the fetch worker left no file of {size} bytes")
            if ident != (st.st_ino, st.st_mtime_ns, st.st_size) and not self._usable(
                    digest, path, size):  # not the file the worker wrote: hash it here
                raise CorruptObjectError(f"object {digest}: the fetch worker's file is damaged")
            self._remember(digest, (st.st_ino, st.st_mtime_ns, st.st_size))
        else:
            fill_file(self.directory, self._source, digest, size, progressed)
            self._remember(digest)
        log.debug("filled %s (%d bytes)", digest, size)
        if not self._index.readonly:
            with self._lock:
                self._touches.pop(digest, None)
            cachedb.record(self._index.env, {digest: (size, time.time_ns())})

    def _after_fill(self) -> None:
        if self._index.readonly or self._index.cache_bytes() <= self.cap_bytes:
            return
        if self._evict_lock.acquire(blocking=False):  # one evictor at a time is enough
            try:
                self._evict_locked(int(self.cap_bytes * LOW_WATER))
            finally:
                self._evict_lock.release()

    # --- LRU accounting and eviction -------------------------------------------

    def _touch(self, digest: str, size: int) -> None:
        if self._index.readonly:
            return
        with self._lock:
            self._touches[digest] = (size, time.time_ns())
            if self.flushed_elsewhere:  # a periodic task writes them: never on this path
                due = len(self._touches) >= TOUCH_BATCH_MAX
            else:
                due = (
                    len(self._touches) >= TOUCH_FLUSH_MAX
                    or time.monotonic() - self._last_flush >= TOUCH_FLUSH_INTERVAL
                )
        if due:
            self.flush_touches()

    def flush_touches(self) -> None:
        """Write batched cache hits to the index (also called by eviction and close)."""
        if self._index.readonly:
            return
        with self._lock:
            touches, self._touches = self._touches, {}
            self._last_flush = time.monotonic()
        cachedb.record(self._index.env, touches)

    def evict(self, target_bytes: int) -> int:
        """Remove least-recently-used unpinned objects until at most ``target_bytes`` remain.

        Returns the bytes freed.
        """
        with self._evict_lock:
            return self._evict_locked(target_bytes)

    def _evict_locked(self, target_bytes: int) -> int:
        self.flush_touches()
        env = self._index.env
        total = cachedb.total_bytes(env)
        freed = 0
        after: bytes | None = None
        while total > target_bytes:
            batch = cachedb.oldest(env, 256, after)
            if not batch:
                break
            for _key, digest, ts in batch:
                if total <= target_bytes:
                    break
                if not self._unlink_unpinned(digest):
                    continue
                size = cachedb.remove(env, digest, if_last_access=ts)
                if size is not None:
                    total -= size
                    freed += size
            after = batch[-1][0]
        if total > target_bytes:
            log.info("object cache still %d bytes over target: the rest is pinned", total)
        else:
            log.debug("evicted %d bytes from the object cache", freed)
        return freed

    def _unlink_unpinned(self, digest: str) -> bool:
        """Unlink the file of ``digest`` unless this process uses it; True if gone."""
        with self._lock:
            if self._pins[digest] or digest in self._fills:
                return False
            if digest in self._idle:  # its idle fd would keep the space in use
                self._idle_bytes -= self._idle.pop(digest)
                os.close(self._shared.pop(digest)[0])
            try:
                os.unlink(self.path_of(digest))
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("cannot evict %s: %s", self.path_of(digest), e)
                return False
        return True

    def close(self) -> None:
        """Close the idle fds and leave the process's shares. A handle still open
        (a job's file across its namespace's release) closes its fd at release."""
        self.flush_touches()
        self.idle_fds = 0  # a later release_cached keeps nothing idle
        self._close_idle(len(self._idle))
        self._leave_shares()
