"""Which upper files are being written, and when each last changed.

The view reports every write-side event here; the promoter asks which files
are quiet. Paths are relative to the mount root. Thread-safe: the view calls
from the trio thread, the promoter from a worker thread.
"""

from __future__ import annotations

import threading
import time


class WriteTracker:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writers: dict[str, int] = {}
        self._dirty: dict[str, float] = {}

    # --- events from the view -------------------------------------------
    def opened_for_write(self, path: str) -> None:
        with self._lock:
            self._writers[path] = self._writers.get(path, 0) + 1
            self._dirty[path] = time.monotonic()

    def closed_for_write(self, path: str) -> None:
        with self._lock:
            n = self._writers.get(path, 0) - 1
            if n > 0:
                self._writers[path] = n
            else:
                self._writers.pop(path, None)
            self._dirty[path] = time.monotonic()

    def modified(self, path: str) -> None:
        """Content or metadata of ``path`` changed (write, truncate, chmod, utimens, create)."""
        with self._lock:
            self._dirty[path] = time.monotonic()

    def removed(self, path: str) -> None:
        """``path`` (file or directory, with everything under it) is gone."""
        with self._lock:
            prefix = path + "/"
            for p in [p for p in self._dirty if p == path or p.startswith(prefix)]:
                del self._dirty[p]

    def renamed(self, old: str, new: str) -> None:
        """``old`` (file or directory) is now ``new``; descendants move with it."""
        now = time.monotonic()
        with self._lock:
            self._dirty = {_moved(p, old, new): t for p, t in self._dirty.items()}
            self._writers = {_moved(p, old, new): n for p, n in self._writers.items()}
            for p in list(self._dirty):
                if p == new or p.startswith(new + "/"):
                    self._dirty[p] = now
            self._dirty[new] = now

    # --- queries from the promoter --------------------------------------
    def has_writers(self, path: str) -> bool:
        with self._lock:
            return path in self._writers

    def quiet(self, stable_after: float) -> list[str]:
        """Dirty paths with no open writer and no change for ``stable_after`` seconds."""
        cutoff = time.monotonic() - stable_after
        with self._lock:
            return sorted(
                p for p, t in self._dirty.items() if t <= cutoff and p not in self._writers
            )

    def forget(self, path: str, seen_at: float | None = None) -> None:
        """The promoter handled ``path``; drop it unless it changed after ``seen_at``."""
        with self._lock:
            t = self._dirty.get(path)
            if t is not None and (seen_at is None or t <= seen_at):
                del self._dirty[path]

    def pending(self) -> int:
        with self._lock:
            return len(self._dirty)


def _moved(path: str, old: str, new: str) -> str:
    if path == old:
        return new
    if path.startswith(old + "/"):
        return new + path[len(old):]
    return path
