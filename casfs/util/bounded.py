"""Calls that may block on shared storage, bounded in time.

A hard NFS mount whose server died, or a FUSE root whose server is stopped,
blocks a syscall forever in uninterruptible sleep: no timeout inside the call
can end it. The call runs in a daemon thread instead and the caller stops
waiting after ``timeout``; the stuck thread is left behind. At most one call
per key is in flight: a second caller waits for the first to end (within its
own timeout) before starting its own, so repeated attempts against a dead root
add no threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_in_flight: dict[str, threading.Event] = {}
_lock = threading.Lock()


class StillBlocked(TimeoutError):
    """The call did not return in time (or an earlier one under its key still blocks)."""


def call_bounded(key: str, fn: Callable[[], T], timeout: float) -> T:
    """``fn()``'s result or exception; StillBlocked after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        with _lock:
            earlier = _in_flight.get(key)
            if earlier is None:
                done = _in_flight[key] = threading.Event()
                break
        if not earlier.wait(max(0.0, deadline - time.monotonic())):
            raise StillBlocked(f"{key}: an earlier attempt is still blocked")
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller
            box["error"] = e
        finally:
            with _lock:
                del _in_flight[key]
            done.set()

    threading.Thread(target=run, name=f"bounded:{key}", daemon=True).start()
    if not done.wait(max(0.0, deadline - time.monotonic())):
        raise StillBlocked(f"{key}: no answer within {timeout:g} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
