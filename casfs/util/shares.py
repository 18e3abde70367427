"""A process-wide bound split evenly among the objects that keep fds under it.

A mount process serves one namespace per cache family (``casfs run``: all ten)
or many (the node's host), each with its own object cache and view, and each
of those keeps idle fds open up to a bound taken from RLIMIT_NOFILE. Bounds
per namespace added up past the process's limit: ten families at a limit of
256 kept up to 640 idle fds, the next ``accept`` of the control socket got
EMFILE and the mount died. Each holder now keeps its share of the bound: the
bound divided by the holders alive.

A holder that joined before others keeps its larger idle set until its next
release trims it, so for that while the process holds at most twice the bound
(the old shares plus the new ones, each summing to the bound).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable


class EvenShares:
    """Counts its holders; ``of(bound)`` is one holder's share of ``bound``."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def join(self, holder: object) -> Callable[[], None]:
        """Count ``holder`` until it is garbage or the returned ``leave()`` is called
        (once: later calls do nothing)."""
        with self._lock:
            self.count += 1
        leave: Callable[[], None] = weakref.finalize(holder, self._left)
        return leave

    def _left(self) -> None:
        with self._lock:
            self.count -= 1

    def of(self, bound: int) -> int:
        """One holder's share of ``bound`` (the hot path: no lock, an int read)."""
        n = self.count
        return bound // n if n > 1 else bound
