"""call_bounded: a blocking call stops holding its caller, and adds no thread per retry."""

from __future__ import annotations

import threading
import time

import pytest

from casfs.util.bounded import StillBlocked, call_bounded


def test_result_error_and_a_blocked_call() -> None:
    assert call_bounded("k1", lambda: 7, 1.0) == 7
    with pytest.raises(ZeroDivisionError):
        call_bounded("k1", lambda: 1 // 0, 1.0)
    gate = threading.Event()
    with pytest.raises(StillBlocked):
        call_bounded("k2", gate.wait, 0.05)
    # the first attempt still blocks: a retry waits its bound for it, no second thread
    before = threading.active_count()
    with pytest.raises(StillBlocked, match="still blocked"):
        call_bounded("k2", lambda: 1, 0.05)
    assert threading.active_count() == before
    assert isinstance(StillBlocked("x"), OSError)  # callers treat it as a storage error
    gate.set()
    for t in threading.enumerate():
        if t.name == "bounded:k2":
            t.join(5)
    assert call_bounded("k2", lambda: 2, 1.0) == 2


def test_a_second_caller_waits_for_the_first_instead_of_failing() -> None:
    """Two namespaces opening one root at once: the second waits, then runs its own."""
    gate = threading.Event()
    results: list[object] = []

    def first() -> None:
        results.append(call_bounded("k3", lambda: (gate.wait(5), "first")[1], 5.0))

    t = threading.Thread(target=first)
    t.start()
    while threading.active_count() < 3:  # first's caller and its worker thread
        time.sleep(0.001)
    threading.Timer(0.1, gate.set).start()
    assert call_bounded("k3", lambda: "second", 5.0) == "second"
    t.join(5)
    assert results == ["first"]
