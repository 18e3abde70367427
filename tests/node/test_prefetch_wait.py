"""Prefetcher.wait: a mount holding its readiness until warm-ready (overlay --wait-warm)
gets False while the hot set is still arriving, True once it is all local."""

from __future__ import annotations

import threading
from typing import Any

from casfs.node.prefetch import Prefetcher
from casfs.store.entry import Entry
from casfs.util.counters import Counters


class _Cache:
    def __init__(self) -> None:
        self.gate = threading.Event()
        self.fetched: list[str] = []

    def cached(self, e: Entry) -> None:
        return None

    def fetch(self, e: Entry) -> None:
        assert self.gate.wait(30), "the test never opened the gate"
        self.fetched.append(e.path)

    def unpin(self, digest: str) -> None:
        pass

    def bulk_planning(self) -> None:  # a whole-namespace plan's gate (LocalObjectCache)
        pass

    def bulk_planned(self) -> None:
        pass


class _Lower:
    def __init__(self, entries: list[Entry]) -> None:
        self.by_path = {e.path: e for e in entries}

    def lookup(self, path: str) -> Entry | None:
        return self.by_path.get(path)


def test_wait_is_false_until_the_hot_set_is_local() -> None:
    entries = [Entry(f"K{i}/k.bin", f"{i:064x}", 10, 0o644, 0) for i in range(4)]
    cache = _Cache()
    counters = Counters()
    # paced=False: a mount waiting for warm-ready runs no job, so no bandwidth bound
    # (10 bytes at 1 byte/s would otherwise take seconds per file)
    p = Prefetcher(cache, _Lower(entries), counters, bytes_per_s=1.0, paced=False)  # type: ignore[arg-type]
    p.start(lambda: [e.path for e in entries])
    assert p.wait(0.05) is False  # every fetch is held at the gate: not warm
    assert p.warm_ready_s is None
    cache.gate.set()
    assert p.wait(30) is True
    assert p.warm_ready_s is not None
    assert sorted(cache.fetched) == sorted(e.path for e in entries)
    assert counters.get("prefetched_files") == 4
    p.pace()  # the bound is back from now on: no debt from the unpaced burst
    p.stop()


def test_wait_ends_when_stopped() -> None:
    entries = [Entry("K/k.bin", "a" * 64, 10, 0o644, 0)]
    cache = _Cache()
    p = Prefetcher(cache, _Lower(entries), Counters(), paced=False)  # type: ignore[arg-type]
    p.start(lambda: ["K/k.bin"])
    stopper: Any = threading.Timer(0.05, lambda: (p.stop(timeout=0), cache.gate.set()))
    stopper.start()
    assert p.wait(30) is False  # stopped (an unmount while waiting): not warm, not stuck
    assert p.finished.is_set()
    stopper.join()
