"""casfs.node.fetchproc: the first worker starts at once, its spare only once the worker
is quiet (a fresh node's first seconds are its busiest), and a death takes the spare."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from casfs.node import fetchproc
from casfs.util.counters import Counters

QUIET = 1.0


def _until(pred: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (v := pred()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return v


@pytest.fixture
def worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[fetchproc.FetchWorker]:
    monkeypatch.setattr(fetchproc, "SPARE_AFTER_QUIET", QUIET)
    (tmp_path / "objects").mkdir()
    w = fetchproc.FetchWorker(tmp_path / "objects", spare=True)
    try:
        yield w
    finally:
        w.close()


def test_the_first_worker_starts_before_the_watchdogs_first_tick(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetchproc, "TICK", 30.0)
    w = fetchproc.FetchWorker(tmp_path, spare=True)
    try:
        _until(lambda: w.pid, timeout=15.0)
    finally:
        w.close()


@pytest.mark.expect_log(r"fetch worker \d+: its connection closed: replacing it",
                        # the same kill, when the watchdog's poll sees it before the reader
                        r"fetch worker \d+ died \(exit status -9\)")
def test_the_spare_starts_when_the_worker_is_quiet(worker: fetchproc.FetchWorker) -> None:
    t0 = time.monotonic()
    first = _until(lambda: worker.pid)
    assert worker._spare is None  # not beside the worker's own start
    spare = _until(lambda: worker._spare)[0].pid
    assert time.monotonic() - t0 >= QUIET
    worker.stop_worker()  # SIGKILL: the spare, already started, takes over
    assert _until(lambda: worker.pid if worker.pid != first else None) == spare


def test_no_spare_while_requests_wait(worker: fetchproc.FetchWorker) -> None:
    _until(lambda: worker.pid)
    with worker._lock:  # a request in flight (never sent: the worker is not asked)
        worker._pending[-1] = fetchproc._Request({"op": "none"}, lambda: None, Counters(),
                                                 sent_to=worker._gen)
    time.sleep(3 * QUIET)
    assert worker._spare is None
    with worker._lock:
        del worker._pending[-1]
    _until(lambda: worker._spare)
