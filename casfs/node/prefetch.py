"""Prefetch a namespace's hot set (its access profile) into the local object cache.

Runs in the background after mount-ready, in a few threads, below on-demand
fetches in priority (a prefetch thread waits while a job's own fetch is in
flight), bounded in bandwidth (``bytes_per_s``) and in cache bytes
(``max_bytes``), and cancelled at unmount. When the whole hot set is local
the mount is *warm-ready* (``warm_ready_s`` in stats, seconds from ``origin``:
the mount's start, the same origin as ``mount_ready_s``). ``wait`` lets a mount
hold its readiness until warm-ready (overlay mode's ``wait_warm``: the hot set
is then linked into the overlay and served by the kernel); while nothing else
runs the bandwidth bound is lifted (``paced=False``) and put back by ``pace``.
Counters: ``prefetched_files``/``prefetched_bytes``,
``prefetch_hits`` (an open of a prefetched object, once per object),
``prefetch_wasted_bytes`` (prefetched, never opened by the time of unmount).
A failing object is skipped (the job's own open will miss or fetch it).

**Whole namespace** (``budget``, the mount's ``prefetch_budget``): a namespace
whose files add up to at most ``budget`` bytes is fetched whole from
mount-ready, unpaced and not yielding to the job (the job waits on it): the hot
set first, then every other file in path order (the order a walk opens them),
in waves of at most ``WAVE_BYTES`` (``LocalObjectCache.fill_packs``: one
request to the fetch worker per wave, which reads each pack holding the wave's
files once, all packs at once, and installs the files in that order, each
verified by its digest). A job's open of a file of a wave in flight waits for
it instead of fetching it (at most ``objcache.BULK_WAIT``); read-ahead leaves
those packs alone. A namespace over the budget keeps the lazy behaviour above
(``prefetch_over_budget``). Counters: ``prefetch_waves``, and the ones above.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from casfs.errors import CasfsError
from casfs.index import tree
from casfs.index.objcache import LocalObjectCache
from casfs.index.tree import LowerTree
from casfs.store.entry import Entry
from casfs.util.counters import Counters

log = logging.getLogger(__name__)

_local = threading.local()
# A whole-namespace prefetch sends its files in waves of at most this many bytes (the
# fetch worker holds a wave's pack spans in memory while it installs them).
WAVE_BYTES = 128 << 20
DEFAULT_BUDGET = 128 << 20  # MountOptions.prefetch_budget's default


def not_on_node(cache: LocalObjectCache, entries: list[Entry]) -> list[Entry]:
    """``entries`` whose objects the node lacks, one per digest, in order. (What the node
    has already, a remount's, is verified by its first open, as before.)"""
    order: list[Entry] = []
    seen: set[str] = set()
    listed = cache.local_digests()  # (a fresh node: none, and no stat per file)
    for e in entries:
        if e.digest not in seen and not (
                (e.digest in listed or cache.trusted_digest(e.digest))
                and cache.on_node(e.digest, e.size)):
            seen.add(e.digest)
            order.append(e)
    return order


def waves(cache: LocalObjectCache, order: list[Entry]
          ) -> tuple[list[list[tuple[str, int]]], int]:
    """``order``'s objects as fill_packs waves of at most WAVE_BYTES, a pack's objects
    all in the wave of its first (each pack read once), and how many packs."""
    pack_bytes: dict[str, int] = {}
    locs = [cache.pack_of(e.digest) for e in order]
    for e, loc in zip(order, locs, strict=True):
        if loc is not None:
            pack_bytes[loc[0]] = pack_bytes.get(loc[0], 0) + e.size
    wave_of: dict[str, int] = {}  # pack (or a loose object's digest) -> its wave
    n, size = 0, 0
    for e, loc in zip(order, locs, strict=True):
        key = e.digest if loc is None else loc[0]
        if key in wave_of:
            continue
        cost = e.size if loc is None else pack_bytes[key]
        if size and size + cost > WAVE_BYTES:
            n, size = n + 1, 0
        size += cost
        wave_of[key] = n
    out: list[list[tuple[str, int]]] = [[] for _ in range(n + 1)] if order else []
    for e, loc in zip(order, locs, strict=True):
        out[wave_of[e.digest if loc is None else loc[0]]].append((e.digest, e.size))
    return out, len(pack_bytes)


def fill_whole(cache: LocalObjectCache, entries: list[Entry], counters: Counters,
               threads: int = 2) -> None:
    """Bring every object of ``entries`` onto the node in fill_packs waves (``threads``
    at once): dir mode copies a whole namespace into its directory, and one object
    after another was a round trip a file (1,200 files: 32 s at 20 ms RTT). Failures
    are left to the caller's own fetch of each (a miss there, as before)."""
    todo = waves(cache, not_on_node(cache, entries))[0]
    if not todo:
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(threads, len(todo)), thread_name_prefix="fill-whole") as pool:
        for filled, failed in pool.map(cache.fill_packs, todo):
            counters.inc("restore_bulk_filled", filled)
            if failed:
                counters.inc("restore_bulk_failed", failed)
    counters.inc("restore_bulk_waves", len(todo))


def in_prefetch_thread() -> bool:
    return bool(getattr(_local, "prefetch", False))


class Prefetcher:
    def __init__(
        self,
        cache: LocalObjectCache,
        lower: LowerTree,
        counters: Counters,
        *,
        ondemand_busy: Callable[[], bool] = lambda: False,
        threads: int = 2,
        max_bytes: int = 2 << 30,
        bytes_per_s: float = 200e6,
        origin: float | None = None,
        paced: bool = True,
        budget: int = 0,
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        self.cache = cache
        self.lower = lower
        self.counters = counters
        self.ondemand_busy = ondemand_busy
        self.threads = threads
        self.max_bytes = max_bytes
        self.bytes_per_s = bytes_per_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._todo: list[Entry] = []
        self._next = 0
        self._bytes = 0
        self._prefetched: dict[str, int] = {}  # digest -> size
        self._used: set[str] = set()
        self._workers: list[threading.Thread] = []
        self._origin = origin
        self._paced = paced
        self.budget = budget  # a namespace up to this many bytes is fetched whole (0: never)
        self._waves: list[list[tuple[str, int]]] = []
        self._reserved: list[Any] = []  # the first waves' reservations (objcache)
        self._pace_t0 = 0.0  # the bandwidth bound counts from here ...
        self._pace_bytes = 0  # ... these bytes
        self._running = 0
        self.finished = threading.Event()  # every worker ended: warm, bounded or stopped
        self.warm_ready_s: float | None = None
        # Called once when the prefetch no longer needs the node to itself: a lazy one
        # once planned, a whole-namespace one once ended (the mount's index rows wait).
        self._on_idle = on_idle

    def start(self, load_paths: Callable[[], list[str]]) -> None:
        """Read the hot set (``load_paths``, off the caller's thread) and fetch it."""
        self._pace_t0 = time.monotonic()
        if self._origin is None:
            self._origin = self._pace_t0
        if self.budget > 0:  # a job's first opens wait for the plan (at most BULK_WAIT)
            self.cache.bulk_planning()
        t = threading.Thread(target=self._plan, args=(load_paths,), name="casfs-prefetch",
                             daemon=True)
        self._workers.append(t)
        t.start()

    def _plan(self, load_paths: Callable[[], list[str]]) -> None:
        try:
            self._plan_and_start(load_paths)
        finally:
            self.cache.bulk_planned()
            if not self._waves or self._running == 0:  # lazy, or no worker started
                self._idle()

    def _idle(self) -> None:
        with self._lock:
            fn, self._on_idle = self._on_idle, None
        if fn is not None:
            fn()

    def _plan_and_start(self, load_paths: Callable[[], list[str]]) -> None:
        try:
            paths = load_paths()
        except Exception as e:  # a profile is a hint: never an error for the mount
            log.warning("prefetch: no usable profile: %s", e)
            paths = []
        seen: set[str] = set()
        for p in paths:
            node = self.lower.lookup(p)
            if isinstance(node, Entry) and node.digest not in seen:
                seen.add(node.digest)
                self._todo.append(node)
        try:
            whole = self.budget > 0 and self._plan_whole()
        except Exception as e:  # a hint: never an error for the mount (lazy as before)
            log.warning("prefetch: cannot plan the whole namespace: %s", e)
            whole = False
        if whole:  # the first waves are the fetches' now: a job's open waits for them
            self._reserved = [self.cache.reserve_packs(w) for w in self._waves[:self.threads]]
        work = self._work_waves if whole else self._work
        self.counters.inc("prefetch_planned", sum(map(len, self._waves)) if whole
                          else len(self._todo))
        self._running = self.threads
        for i in range(self.threads):
            t = threading.Thread(target=work, name=f"casfs-prefetch-{i}", daemon=True)
            self._workers.append(t)
            t.start()

    def _plan_whole(self) -> bool:
        """Plan the whole namespace in waves if it fits the budget: the hot set (in
        ``_todo``) first, then every other file in path order; a pack's files all go
        in the wave of the first of them (each pack is read once)."""
        rest: list[Entry] = []
        total = 0
        own_walk = getattr(self.lower, "walk", None)  # a staged tree walks its memory
        for e in own_walk("") if own_walk is not None else tree.walk(self.lower, ""):
            total += e.size
            if total > self.budget:
                self.counters.inc("prefetch_over_budget")
                log.info("prefetch: the namespace is over the prefetch budget (%d bytes):"
                         " lazy", self.budget)
                return False
            rest.append(e)  # (every walk yields depth first, in name order)
        order = not_on_node(self.cache, [*self._todo, *rest])
        self._todo = []
        self._waves, packs = waves(self.cache, order)
        with self._lock:
            self._bytes = sum(e.size for e in order)
        log.info("prefetch: the whole namespace, %d files, %d bytes, %d packs, in %d waves",
                 len(order), self._bytes, packs, len(self._waves))
        return True

    def _work_waves(self) -> None:
        _local.prefetch = True
        try:
            while not self._stop.is_set():
                with self._lock:
                    if self._next >= len(self._waves):
                        break
                    i = self._next
                    wave = self._waves[i]
                    self._next += 1
                self.counters.inc("prefetch_waves")
                # Cancelled at unmount: a short job's release does not wait for a
                # wave (4,800 files: ~2 s of installing) it no longer needs.
                filled, failed = (self.cache.fill_reserved(self._reserved[i], self._stop)
                                  if i < len(self._reserved)
                                  else self.cache.fill_packs(wave, self._stop))
                got = 0
                with self._lock:
                    for digest, size in wave:  # filled (or trusted) by now: counted as ours
                        if self.cache.trusted_digest(digest):
                            self._prefetched[digest] = size
                            got += size
                if filled:
                    self.counters.inc("prefetched_files", filled)
                    self.counters.inc("prefetched_bytes", got)
                if failed:
                    self.counters.inc("prefetch_errors", failed)
        finally:
            self._ended()

    def _take(self) -> Entry | None:
        with self._lock:
            if self._next >= len(self._todo) or self._stop.is_set():
                return None
            e = self._todo[self._next]
            self._next += 1
            return e

    def _work(self) -> None:
        _local.prefetch = True
        try:
            while (e := self._take()) is not None:
                self._one(e)
        finally:
            self._ended()

    def _ended(self) -> None:
        with self._lock:
            self._running -= 1
            last = self._running == 0
            done = last and not self._stop.is_set()
        if done:
            assert self._origin is not None
            self.warm_ready_s = round(time.monotonic() - self._origin, 3)
            log.info("prefetch: warm-ready %.2fs after the mount's start (%d files,"
                     " %d bytes)", self.warm_ready_s, len(self._prefetched), self._bytes)
        if last:
            self._idle()
            self.finished.set()

    def _one(self, e: Entry) -> None:
        local = self.cache.cached(e)
        if local is not None:
            self.cache.unpin(e.digest)
            return
        while self.ondemand_busy() and not self._stop.is_set():
            time.sleep(0.005)  # the job's own fetches go first
        with self._lock:
            if self._bytes + e.size > self.max_bytes:
                self._stop.set()  # the byte bound: the rest stays lazy
                self.counters.inc("prefetch_bounded")
                return
            self._bytes += e.size
            self._pace_bytes += e.size
            due = self._pace_t0 + self._pace_bytes / self.bytes_per_s if self._paced else 0.0
        delay = due - time.monotonic()
        if delay > 0 and self._stop.wait(delay):
            return
        try:
            self.cache.fetch(e)
        except (CasfsError, OSError) as err:
            self.counters.inc("prefetch_errors")
            log.debug("prefetch of %s failed: %s", e.path, err)
            return
        self.cache.unpin(e.digest)
        with self._lock:
            self._prefetched[e.digest] = e.size
        self.counters.inc("prefetched_files")
        self.counters.inc("prefetched_bytes", e.size)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the prefetch to end; True if warm-ready."""
        self.finished.wait(timeout)
        return self.warm_ready_s is not None

    def pace(self) -> None:
        """Put the bandwidth bound back (a job starts now), counting from now."""
        with self._lock:
            self._pace_t0 = time.monotonic()
            self._pace_bytes = 0
            self._paced = True

    def opened(self, digest: str) -> None:
        """A job opened ``digest``: a hit if it was prefetched (counted once)."""
        if digest in self._prefetched and digest not in self._used:
            with self._lock:
                if digest in self._used:
                    return
                self._used.add(digest)
            self.counters.inc("prefetch_hits")

    def opened_many(self, digests: list[str]) -> None:
        """``opened`` for each of ``digests`` (one lock for all)."""
        hits = [d for d in digests if d in self._prefetched and d not in self._used]
        if not hits:
            return
        with self._lock:
            new = set(hits) - self._used
            self._used |= new
        if new:
            self.counters.inc("prefetch_hits", len(new))

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel (unmount): wait briefly for fetches in flight; count what went unused."""
        self._stop.set()
        with self._lock:  # no wave is taken from now on
            taken, self._next = self._next, max(self._next, len(self._waves))
        for reserved in self._reserved[taken:]:  # reserved, never to be filled now
            self.cache.release_reserved(reserved)
        deadline = time.monotonic() + timeout
        for t in self._workers:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            wasted = sum(s for d, s in self._prefetched.items() if d not in self._used)
        if wasted:
            self.counters.inc("prefetch_wasted_bytes", wasted)
