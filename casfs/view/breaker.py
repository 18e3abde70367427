"""The fetch breaker: a shared root that stops answering costs a job a few full waits.

Without it a job that opens 80 cold files of a root that takes requests and
never answers (or drips) waits ``fetch_timeout`` for each: 80 x 10 s. After
TRIP opens in a row waited the whole timeout and got nothing, the breaker is
open: a cold open still asks for its object (the fetch goes on in the
background, and is the probe), but waits at most BRIEF seconds for it, then
misses. The first fetch the root answers (an object, or a definite "missing"
or "corrupt") closes it, so a root that recovers is waited for in full again
from its first answer: no fixed hold-off that would turn a recovered root's
first reads into misses.

Thread-safe: fetches end on worker threads, waits start on the trio thread.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)

TRIP = 3  # full waits in a row without an answer before the breaker opens
BRIEF = 1.0  # seconds a cold open waits while it is open (a 20 ms RTT root answers in 0.1)


class FetchBreaker:
    def __init__(self, *, trip: int = TRIP, brief: float = BRIEF) -> None:
        self.trip = trip
        self.brief = brief
        self._lock = threading.Lock()
        self._unanswered = 0

    @property
    def open(self) -> bool:
        return self._unanswered >= self.trip

    def wait(self, timeout: float) -> float:
        """How long the next cold open waits for its object."""
        return min(timeout, self.brief) if self.open else timeout

    def answered(self) -> None:
        """The root answered a fetch (any fetch, even one nobody waits for any more)."""
        with self._lock:
            was_open, self._unanswered = self.open, 0
        if was_open:
            log.info("the shared root answers again: cold opens wait for it in full")

    def unanswered(self, timeout: float) -> None:
        """An open waited ``timeout`` (the full wait) and the root sent nothing."""
        with self._lock:
            self._unanswered += 1
            tripped = self._unanswered == self.trip
        if tripped:
            log.warning("the shared root answered none of the last %d fetches in %.0fs: cold"
                        " opens wait at most %.1fs for it (a miss after) until it answers",
                        self.trip, timeout, self.brief)
