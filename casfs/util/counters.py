"""Thread-safe named counters (hits, misses, rejections, ...) for one mount or process."""

from __future__ import annotations

import threading
from collections import Counter


class Counters:
    """A bag of monotonically increasing integer counters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: Counter[str] = Counter()

    def inc(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._values[name] += n

    def get(self, name: str) -> int:
        with self._lock:
            return self._values[name]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)

    def merge(self, values: dict[str, int]) -> None:
        """Add ``values`` (e.g. counters persisted by an earlier run)."""
        with self._lock:
            for k, v in values.items():
                self._values[k] += int(v)
