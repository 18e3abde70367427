"""Which published entries a mount's jobs opened: retention by use and access profiles.

Every view mode feeds one ``UseLog``: the FUSE handlers (fuse mode, and the
FUSE layer of overlay mode) call ``opened`` on each lower open; overlay mode
adds the opens the kernel serves itself (fanotify, casfs.view.opens); dir mode
adds inotify's IN_OPEN events on its directory (casfs.view.dirmode.watch).
The log is flushed as read records (casfs.store.reads) by ``take``: at
publication and unmount (``final``), every ``flush_s`` when there is a path
not yet written, and at once when the epoch's set is full.

Cost and bounds: a path is recorded once per *epoch* (``epoch_s``, an hour):
after its first open in an epoch, ``recorded(path)`` is one dict lookup with
no lock, and overlay mode's fanotify stops the kernel from reporting that
file at all until the next epoch (an ignore mark). At each epoch the set
restarts, so files still in use are written again; a record's ``until`` is
its epoch's end (casfs.store.reads: a gc cut-off never misses an open after
it). Memory: the epoch's set, at most ``max_paths`` paths plus what arrives
before the next flush tick; reaching the bound ends the epoch early.

Records per node and namespace: one per epoch in steady use (24 a day), plus
one per ``flush_s`` in which a job opened something new, plus one per
publication/unmount. Thread-safe: the FUSE thread, the fanotify/inotify
thread and the flushing worker thread call it concurrently.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from casfs.store import reads

EPOCH_S = 3600.0
FLUSH_S = 60.0  # first opens reach the root within a minute (gc of live mounts)
assert EPOCH_S <= reads.MAX_EPOCH


@dataclass(frozen=True)
class Batch:
    paths: list[str]
    until: float  # the recorded paths may be opened again, unrecorded, until then


class UseLog:
    def __init__(self, *, epoch_s: float = EPOCH_S, flush_s: float = FLUSH_S,
                 max_paths: int = reads.MAX_PATHS,
                 clock: Callable[[], float] = time.time) -> None:
        self.epoch_s = min(epoch_s, reads.MAX_EPOCH)
        self.flush_s = flush_s
        self.max_paths = max_paths
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, None] = {}  # recorded this epoch (written or pending)
        self._pending: list[str] = []
        self._epoch = clock()
        self._flushed = self._epoch
        self.on_epoch: list[Callable[[], None]] = []  # e.g. drop fanotify ignore marks

    def recorded(self, path: str) -> bool:
        """True if ``path`` is recorded for this epoch already (no lock: the hot path)."""
        return path in self._seen

    def opened(self, path: str) -> None:
        """A job opened the published entry ``path``."""
        if path in self._seen:
            return
        with self._lock:
            if path not in self._seen:
                self._seen[path] = None
                self._pending.append(path)

    def opened_many(self, paths: list[str]) -> None:
        """``opened`` for each of ``paths`` (one lock for all: a batch of observed opens)."""
        with self._lock:
            seen, pending = self._seen, self._pending
            for p in paths:
                if p not in seen:
                    seen[p] = None
                    pending.append(p)

    def due(self) -> bool:
        """Whether ``take`` has something it should write now."""
        now = self.clock()
        if now - self._epoch >= self.epoch_s:
            return True
        return bool(self._pending) and (
            now - self._flushed >= self.flush_s or len(self._seen) >= self.max_paths)

    def take(self, force: bool = False, final: bool = False) -> Batch | None:
        """The paths to write as one read record now (None: nothing due), and start a
        new epoch when this one is over. ``force`` (publication): write whatever
        is pending. ``final`` (release, unmount): that too, and no open follows,
        so the record's coverage ends now."""
        now = self.clock()
        with self._lock:
            over = now - self._epoch >= self.epoch_s or len(self._seen) >= self.max_paths
            batch = None
            if self._pending and (force or final or over
                                  or now - self._flushed >= self.flush_s):
                until = now if final else max(now, self._epoch + self.epoch_s)
                batch = Batch(self._pending, until)
                self._pending = []
                self._flushed = now
            if over:
                self._seen = dict.fromkeys(self._pending)
                self._epoch = now
                hooks = list(self.on_epoch)
            else:
                hooks = []
        for hook in hooks:
            hook()
        return batch

    def put_back(self, batch: Batch) -> None:
        """Writing ``batch`` failed: its paths go into the next record."""
        with self._lock:
            pending = set(self._pending)
            self._pending[:0] = [p for p in batch.paths if p not in pending]
