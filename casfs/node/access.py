"""Access recording: what a mount's jobs open, and fetching the hot set before they ask.

Every view mode reports opens of published (lower) entries here: the FUSE view
as it serves them, overlay mode through fanotify, dir mode through inotify.
Each first open per epoch feeds three consumers: the access profile published
with the next generation (casfs.store.profile), the read record that keeps
entries from retention (casfs.node.usage, casfs.store.reads), and prefetch,
which fetches the served generation's profile, hottest first, in the
background (casfs.node.prefetch); a job's own fetches go first (``ondemand``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from casfs.index.memtree import StagedLowerTree
from casfs.index.objcache import LocalObjectCache
from casfs.node import compiletime, prefetch, usage
from casfs.node.config import MountConfig
from casfs.node.rootlink import RootLink
from casfs.promote.publisher import profile_options
from casfs.store import profile, reads
from casfs.store.entry import Entry
from casfs.store.record import Record
from casfs.util.counters import Counters

log = logging.getLogger(__name__)


class Access:
    def __init__(self, cfg: MountConfig, lower: StagedLowerTree, link: RootLink,
                 counters: Counters, origin: float) -> None:
        self.cfg = cfg
        self.lower = lower
        self.link = link
        self.counters = counters
        self.origin = origin  # monotonic start of the mount (warm_ready_s counts from it)
        self.recorder = profile.Recorder()
        # Published entries jobs opened (retention by use): every view mode feeds it.
        self.uses = usage.UseLog()
        self._not_lower: set[str] = set()  # observed opens of other paths, this epoch
        self.uses.on_epoch.append(self._not_lower.clear)
        self.prefetcher: prefetch.Prefetcher | None = None
        self.ondemand_fetches = 0  # the job's own fetches in flight (see ondemand)
        self._ondemand_lock = threading.Lock()
        self.stopping = False
        # Compile time saved per entry hit (casfs.node.compiletime), once wired.
        self.savings: compiletime.Savings | None = None

    def count_savings(self, savings: compiletime.Savings) -> None:
        """Credit each entry's compile seconds when a job opens it (first open per epoch)."""
        self.savings = savings
        self.uses.on_epoch.append(savings.new_epoch)

    @contextlib.contextmanager
    def ondemand(self) -> Iterator[None]:
        """Count a fetch of the job's own (not the prefetcher's) while it runs: prefetch
        threads wait while any is in flight. Locked: fetch threads update it at once,
        and a lost update would leave prefetch waiting for good."""
        if prefetch.in_prefetch_thread():
            yield
            return
        with self._ondemand_lock:
            self.ondemand_fetches += 1
        try:
            yield
        finally:
            with self._ondemand_lock:
                self.ondemand_fetches -= 1

    # --- opens -----------------------------------------------------------------------
    def lower_opened(self, path: str, digest: str) -> None:
        if self.uses.recorded(path):
            return  # the profile, the read record and prefetch saw it this epoch
        self.recorder.opened(path)
        self.uses.opened(path)
        self.counters.inc("opens_recorded")
        if self.savings is not None:
            self.savings.hit(path)
        if self.prefetcher is not None:
            self.prefetcher.opened(digest)

    def observed_open(self, rel: str) -> bool:
        """An open the kernel served without casfs (overlay: fanotify; dir: inotify).

        Recorded if ``rel`` is a published entry. Returns True: no more events
        for this file are needed this epoch.
        """
        if self.uses.recorded(rel) or rel in self._not_lower:
            return True
        node = self.lower.lookup(rel)
        if isinstance(node, Entry):
            self.lower_opened(rel, node.digest)
        elif len(self._not_lower) < reads.MAX_PATHS:
            self._not_lower.add(rel)  # the job's own files, scratch: no lookup next time
        return True

    def observed_opens(self, rels: list[str]) -> None:
        """``observed_open`` for a batch (overlay's listener, dir mode's watch): one
        index read for all, one lock per log for all (this runs beside the job)."""
        seen, not_lower = self.uses.recorded, self._not_lower
        # once each: a file opened again before its ignore mark was set comes twice
        todo = list(dict.fromkeys(r for r in rels if not seen(r) and r not in not_lower))
        if not todo:
            return
        paths: list[str] = []
        digests: list[str] = []
        for rel, digest in zip(todo, self.lower.digests_many(todo), strict=True):
            if digest is not None:
                paths.append(rel)
                digests.append(digest)
            elif len(not_lower) < reads.MAX_PATHS:
                not_lower.add(rel)
        if not paths:
            return
        self.recorder.opened_many(paths)
        self.uses.opened_many(paths)
        self.counters.inc("opens_recorded", len(paths))
        if self.savings is not None:
            for rel in paths:
                self.savings.hit(rel)
        if self.prefetcher is not None:
            self.prefetcher.opened_many(digests)

    def profile_options(self, published: list[Entry], base: Record | None
                        ) -> dict[str, Any]:
        """The record's ``profile`` (casfs.promote.publisher.profile_options), for a
        publication in this process (no promotion worker)."""
        opened = self.recorder.paths()
        out = profile_options(self.link.gens(), self.cfg.namespace, opened, published,
                              self.counters, base)
        if out:
            self.recorder.mark_published(len(opened))
        return out

    # --- prefetch --------------------------------------------------------------------
    def hot_set(self, served_seq: int) -> list[str]:
        """The paths of the served generation's profile, hottest first ([] if none)."""
        root = self.link.root
        if root is None or not served_seq:
            return []
        rec = self.link.gens().record(self.cfg.namespace, served_seq, cached=True)
        digest = rec.options.get("profile")
        if not isinstance(digest, str):
            return []
        paths, _ = profile.decode(root.objects.get_bytes(digest))
        return [p for p, _ in paths]

    def start_prefetch(self, cache: LocalObjectCache, hot_set: Callable[[], list[str]],
                       paced: bool = True, on_idle: Callable[[], None] | None = None) -> None:
        cfg = self.cfg
        if not cfg.prefetch or self.prefetcher is not None or self.link.root is None:
            return
        self.prefetcher = prefetch.Prefetcher(
            cache, self.lower, self.counters,
            ondemand_busy=lambda: self.ondemand_fetches > 0,
            max_bytes=min(cfg.cache_max_bytes, 4 << 30) // 2,
            origin=self.origin, paced=paced,
            # never more than half the local cache: a larger namespace stays lazy
            budget=min(cfg.prefetch_budget, cfg.cache_max_bytes // 2), on_idle=on_idle)
        self.prefetcher.start(hot_set)

    def wait_warm(self, timeout: float) -> bool | None:
        """Wait until the hot set is local, at most ``timeout`` seconds; None when there
        is nothing to wait for (prefetch off, no shared root), else whether it was."""
        p = self.prefetcher
        if p is None:
            return None
        t0 = time.monotonic()
        warm = p.wait(timeout)
        p.pace()
        self.counters.inc("warm_waits")
        if not warm and not self.stopping:
            self.counters.inc("warm_wait_timeouts")
            log.warning("%s: not warm-ready after %.1fs: mounting with what is local",
                        self.cfg.name, time.monotonic() - t0)
        return warm

    @property
    def warm_ready_s(self) -> float | None:
        return self.prefetcher.warm_ready_s if self.prefetcher else None

    def stop_prefetch(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.stop()
