"""Background work as objects: a periodic task runs a blocking function in a thread.

A mount composes its tasks (promotion rounds, publication, refresh, counters,
read records) and so does the node's host, one set per namespace it serves.
A task that raises is logged with its traceback, counted
(``background_errors``, exported with the other counters) and runs again at
its next tick: background work never stops serving. The test suite fails any
test during which one raised (tests/logcheck.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from casfs.util.counters import Counters

log = logging.getLogger(__name__)


class Periodic:
    """Run ``fn`` every ``interval`` seconds, in a worker thread, until stopped."""

    def __init__(self, name: str, interval: float, fn: Callable[[], object],
                 counters: Counters, owner: str) -> None:
        self.name = name
        self.interval = interval
        self.fn = fn
        self.counters = counters
        self.owner = owner  # whose task, for the log: the mount's name
        self.runs = 0
        self.errors = 0
        self._scope: trio.CancelScope | None = None

    async def run(self) -> None:
        with trio.CancelScope() as self._scope:
            while True:
                await trio.sleep(self.interval)
                try:
                    # Abandonable: a stalled shared root must not hold up shutdown.
                    await trio.to_thread.run_sync(self.fn, abandon_on_cancel=True)
                except Exception:
                    self.errors += 1
                    self.counters.inc("background_errors")
                    log.exception("%s: background task %s failed", self.owner, self.name)
                self.runs += 1

    def stop(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
