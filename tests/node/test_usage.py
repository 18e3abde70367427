"""UseLog: a published entry is recorded once per epoch, flushed when due, bounded."""

from __future__ import annotations

from casfs.node.usage import UseLog


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_once_per_epoch_flushed_when_due_and_again_next_epoch() -> None:
    clock = Clock()
    resets: list[float] = []
    log = UseLog(epoch_s=3600, flush_s=300, clock=clock)
    log.on_epoch.append(lambda: resets.append(clock.t))
    for p in ["a", "b", "a", "a"]:
        log.opened(p)
    assert log.recorded("a") and not log.recorded("c")
    assert not log.due() and log.take() is None  # not yet: one record per flush period
    clock.t += 300
    assert log.due()
    batch = log.take()
    assert batch is not None and batch.paths == ["a", "b"]
    assert batch.until == 1000.0 + 3600  # reopened unrecorded until the epoch ends
    log.opened("a")  # still this epoch: nothing new
    clock.t += 300
    assert log.take() is None and not log.due()
    # A new epoch: the set restarts (and fanotify's ignore marks go), so a file
    # still in use is written again.
    clock.t = 1000.0 + 3600
    assert log.due() and log.take() is None and resets == [4600.0]
    assert not log.recorded("a")
    log.opened("a")
    final = log.take(final=True)
    assert final is not None and final.paths == ["a"] and final.until == clock.t


def test_forced_and_failed_writes_and_the_bound() -> None:
    clock = Clock()
    log = UseLog(max_paths=3, clock=clock)
    log.opened("a")
    batch = log.take(force=True)  # publication writes what is pending
    assert batch is not None and batch.paths == ["a"]
    log.put_back(batch)  # the write failed: it goes into the next record
    log.opened("b")
    log.opened("c")
    assert log.due()  # the epoch's set is full: written at once, and a new epoch
    batch = log.take()
    assert batch is not None and batch.paths == ["a", "b", "c"]
    assert not log.recorded("a")
    log.opened("a")
    assert log.recorded("a")


def test_a_batch_is_recorded_like_single_opens() -> None:
    clock = Clock()
    one, many = UseLog(clock=clock), UseLog(clock=clock)
    for p in ["a", "b", "a", "c"]:
        one.opened(p)
    many.opened("a")
    many.opened_many(["b", "a", "c", "b"])
    clock.t += 3600
    a, b = one.take(), many.take()
    assert a is not None and b is not None and a.paths == b.paths == ["a", "b", "c"]
