"""Read-ahead on a miss: a job that opens one file of a directory reads its neighbours next.

A first touch on a fresh node costs a fetch per file (a request to the fetch
worker, a read of the shared root, a file created in the local object cache:
on this project's machines the create alone is 0.15-1.3 ms). A compiler cache
is read a directory at a time (a Triton kernel directory: its group file, then
its metadata and binaries), so when a job's open misses, the other files of
that directory are fetched in the background into the local object cache
while the job reads the first one: one request to the fetch worker per
directory (LocalObjectCache.fill_many; members of one pack come from one
range read), answered file by file, in name order (the order a walk opens
them). The job's next opens find them local and verified (the fetch worker
hashes while it writes) and are served inline. The packs holding the missed
object or its directory's files bring their other members too (each pack
once per mount, at most 2 per directory): they were promoted together (a
job's kernels), so they are read together; the
worker reads the pack whole (one GET, at most 4 MiB, checked against its
name) and verifies every member by its own digest (casfs.node.fetchworker).

Bounded: at most ``max_files`` files and ``max_bytes`` bytes per directory,
each directory once per mount, a queue of ``MAX_QUEUE`` directories (more
are dropped: read-ahead is a hint), never files over ``max_file``, ``threads``
directories at a time. Everything a fetch guarantees holds: each object
verified (blake3) before anyone reads it, one fill per object (a job's open
of a file being read ahead waits for it, and fetches it itself if the
read-ahead fails), pins and eviction. Packs a whole-namespace prefetch is
reading are left to it (casfs.node.prefetch). A failure is only counted
(``readahead_errors``): the job's own open of that file fetches it again and
misses if that fails too. Counters: ``readahead_dirs``, ``readahead_packs``,
``readahead_files``, ``readahead_errors``, ``readahead_dropped``; the worker's
``pack_span_reads`` and ``pack_whole_reads``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

from casfs.index.objcache import LocalObjectCache
from casfs.index.tree import LowerTree
from casfs.store.entry import Entry
from casfs.util.counters import Counters

log = logging.getLogger(__name__)

MAX_FILES = 64  # per directory
MAX_BYTES = 8 << 20  # per directory
MAX_FILE = 4 << 20  # a larger file is left to the job's own open
MAX_QUEUE = 64  # directories waiting; more are dropped
MAX_SEEN = 1 << 16  # directories remembered as read ahead (then forgotten, all at once)
THREADS = 4  # fetches in flight at once (the fetch worker runs them in parallel)
MAX_PACKS_PER_DIR = 2  # packs read whole for one directory's miss


class ReadAhead:
    def __init__(self, cache: LocalObjectCache, lower: LowerTree, counters: Counters, *,
                 pack_of: Callable[[str], tuple[str, int, int] | None] | None = None,
                 threads: int = THREADS, max_files: int = MAX_FILES,
                 max_bytes: int = MAX_BYTES, max_file: int = MAX_FILE) -> None:
        self.cache = cache
        self.lower = lower
        self.pack_of = pack_of  # digest -> its (pack, offset, length), if packed
        self.counters = counters
        self.threads = threads
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.max_file = max_file
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # (directory, the missed digest)
        self._jobs: collections.deque[tuple[str, str]] = collections.deque()
        self._packs: set[str] = set()  # packs read ahead
        self._seen: set[str] = set()
        self._stopped = False
        self._workers: list[threading.Thread] = []

    def missed(self, path: str, entry: Entry) -> None:
        """A job's open of ``path`` is fetching ``entry``: read its directory ahead (and
        the packs of its files: the other members, promoted together, read whole).

        Called on the FUSE loop: only notes the work (no I/O)."""
        parent = path.rpartition("/")[0]
        with self._lock:
            if self._stopped:
                return
            if len(self._seen) >= MAX_SEEN:
                self._seen.clear()
            if parent in self._seen:  # its directory (and its packs) read ahead already
                return
            self._seen.add(parent)
            if len(self._jobs) >= MAX_QUEUE:
                self.counters.inc("readahead_dropped")
                return
            self._jobs.append((parent, entry.digest))
            if not self._workers:
                for i in range(self.threads):
                    t = threading.Thread(target=self._work, name=f"casfs-readahead-{i}",
                                         daemon=True)
                    self._workers.append(t)
                    t.start()
            self._wake.notify()

    def _packs_of(self, digests: list[str]) -> list[str]:
        """The packs holding ``digests`` not read ahead yet (at most MAX_PACKS_PER_DIR):
        a directory's missed file may be loose (a Triton group file is) while the
        rest of it is packed."""
        if self.pack_of is None:
            return []
        out: list[str] = []
        for digest in digests:
            loc = self.pack_of(digest)
            if loc is None or self.cache.covers_pack(loc[0]):
                continue  # loose, or read whole by the prefetch now
            with self._lock:
                if loc[0] in self._packs:
                    continue
                if len(self._packs) >= MAX_SEEN:
                    self._packs.clear()
                self._packs.add(loc[0])
            out.append(loc[0])
            if len(out) >= MAX_PACKS_PER_DIR:
                break
        return out

    def _plan(self, parent: str, missed: str) -> list[Entry]:
        """The files of ``parent`` to fetch: in name order, within the bounds."""
        out: list[Entry] = []
        total = 0
        for _name, node in self.lower.children(parent):
            if not isinstance(node, Entry) or node.digest == missed:
                continue
            if node.size > self.max_file or total + node.size > self.max_bytes:
                continue
            out.append(node)
            total += node.size
            if len(out) >= self.max_files:
                break
        return out

    def _take(self) -> tuple[str, str] | None:
        with self._lock:
            while not self._stopped:
                if self._jobs:
                    return self._jobs.popleft()
                self._wake.wait()
        return None

    def _work(self) -> None:
        while (job := self._take()) is not None:
            parent, missed = job
            self.cache.wait_bulk_plan()  # a whole-namespace prefetch planning may cover it
            try:
                planned = self._plan(parent, missed)
                packs = self._packs_of([missed] + [e.digest for e in planned])
            except Exception as e:  # a hint only: never an error for the mount
                log.debug("read-ahead of %r: %s", parent, e)
                continue
            self.counters.inc("readahead_dirs")
            if packs:
                self.counters.inc("readahead_packs", len(packs))
            if not planned and not packs:
                continue
            # One request (the fetch worker answers each file as it is done): objects
            # local already or being fetched are skipped.
            filled, failed = self.cache.fill_many([(e.digest, e.size) for e in planned],
                                                  packs)
            if filled:
                self.counters.inc("readahead_files", filled)
            if failed:
                self.counters.inc("readahead_errors", failed)

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel (unmount): queued work is dropped, fetches in flight may finish."""
        with self._lock:
            self._stopped = True
            self._jobs.clear()
            self._wake.notify_all()
            workers = list(self._workers)
        deadline = time.monotonic() + timeout
        for t in workers:
            t.join(max(0.0, deadline - time.monotonic()))
