"""Thread-safe named counters (hits, misses, rejections, ...) for one mount or process,
and its latency histograms (casfs.util.histogram)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from casfs.util.histogram import Histogram


class Counters:
    """A bag of monotonically increasing integer counters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: Counter[str] = Counter()
        self._hists: dict[str, Histogram] = {}

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

    def observe(self, name: str, seconds: float) -> None:
        """One observation of the latency histogram ``name`` (fixed buckets)."""
        with self._lock:
            h = self._hists.get(name)
            if h is None:
                h = self._hists[name] = Histogram()
            h.observe(seconds)

    def histograms(self) -> dict[str, dict[str, Any]]:
        """Every histogram observed so far, serialised (Histogram.to_dict)."""
        with self._lock:
            return {k: h.to_dict() for k, h in self._hists.items()}
