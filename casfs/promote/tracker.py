"""Which upper files are being written, and when each last changed.

The view reports every write-side event here; the promoter asks which files
are quiet. Paths are relative to the mount root. Thread-safe: the view calls
from the trio thread, the promoter from a worker thread.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

from casfs.util.paths import parent_dirs

_V = TypeVar("_V")


class WriteTracker:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writers: dict[str, int] = {}
        self._dirty: dict[str, float] = {}
        # Dirty paths strictly below each directory: renames and removals of
        # plain files (the common case) then cost O(1), not a scan of _dirty.
        self._below: Counter[str] = Counter()
        # Windows of monotonic time ([since, until]): a path whose last change falls in
        # one is never promoted (a job killed then may have left it half-written).
        # Merged and sorted (starts in _hold_starts): a lookup is a binary search, as
        # every killed job of a namespace adds one for as long as it is served.
        self._holds: list[tuple[float, float]] = []
        self._hold_starts: list[float] = []
        # Paths held as they are (``hold_paths``): held while their last change is no
        # later than the hold; a change after it (written again) lifts it.
        self._path_holds: dict[str, float] = {}
        # Told (outside the lock, in the caller's thread) the paths a finished change
        # touched: a write handle's close, a rename, a removal, a change with no writer
        # open. A mount that handed over sets it: its successor drops what its kernel
        # caches of them (casfs.node.handover, "upper_changed").
        self.on_change: Callable[[list[str]], None] | None = None

    def _set_dirty(self, path: str, t: float) -> None:
        if path not in self._dirty:
            for d in parent_dirs(path):
                self._below[d] += 1
        self._dirty[path] = t

    def _drop_dirty(self, path: str) -> None:
        self._path_holds.pop(path, None)
        if self._dirty.pop(path, None) is not None:
            for d in parent_dirs(path):
                self._below[d] -= 1
                if not self._below[d]:
                    del self._below[d]

    def _subtree(self, table: dict[str, _V], path: str) -> list[str]:
        """Keys of ``table`` at or below ``path``."""
        if table is self._dirty and not self._below.get(path):
            return [path] if path in table else []
        prefix = path + "/"
        return [p for p in table if p == path or p.startswith(prefix)]

    # --- events from the view -------------------------------------------
    def opened_for_write(self, path: str) -> None:
        with self._lock:
            self._writers[path] = self._writers.get(path, 0) + 1
            self._set_dirty(path, time.monotonic())

    def closed_for_write(self, path: str) -> None:
        with self._lock:
            n = self._writers.get(path, 0) - 1
            if n > 0:
                self._writers[path] = n
            else:
                self._writers.pop(path, None)
            self._set_dirty(path, time.monotonic())
        self._told([path])

    def modified(self, path: str) -> None:
        """Content or metadata of ``path`` changed (write, truncate, chmod, utimens, create)."""
        with self._lock:
            self._set_dirty(path, time.monotonic())
            writing = path in self._writers
        if not writing:  # else its close tells
            self._told([path])

    def named(self, path: str) -> None:
        """A name made that holds nothing to promote (a directory, symlink, device or
        hard link): only ``on_change`` hears of it."""
        self._told([path])

    def _told(self, paths: list[str]) -> None:
        tell = self.on_change
        if tell is not None:
            tell(paths)

    def removed(self, path: str) -> None:
        """``path`` (file or directory, with everything under it) is gone."""
        with self._lock:
            for p in self._subtree(self._dirty, path):
                self._drop_dirty(p)
            for p in self._subtree(self._writers, path):
                del self._writers[p]  # a later release of the old file must not count
        self._told([path])

    def renamed(self, old: str, new: str) -> None:
        """``old`` (file or directory) is now ``new``; descendants move with it."""
        now = time.monotonic()
        with self._lock:
            for p in self._subtree(self._dirty, new):
                self._drop_dirty(p)  # whatever was at ``new`` is replaced
            for p in self._subtree(self._dirty, old):
                held = self._is_held(p, self._dirty[p]) and p in self._path_holds
                self._drop_dirty(p)
                self._set_dirty(new + p[len(old):], now)
                if held:  # a held file keeps its hold under its new name
                    self._path_holds[new + p[len(old):]] = now
            moved = {p: self._writers.pop(p) for p in self._subtree(self._writers, old)}
            for p, n in moved.items():
                q = new + p[len(old):]
                self._writers[q] = self._writers.get(q, 0) + n
            self._set_dirty(new, now)
        self._told([old, new])

    # --- queries from the promoter --------------------------------------
    def has_writers(self, path: str) -> bool:
        with self._lock:
            return path in self._writers

    def all_closed(self) -> None:
        """Every file is closed (the kernel ended the connection, whose last RELEASEs it
        may never send): what was open for writing is dirty, as at its close."""
        now = time.monotonic()
        with self._lock:
            for p in list(self._writers):
                self._set_dirty(p, now)
            self._writers.clear()

    def writing(self) -> list[str]:
        """Paths open for writing now (what a handover's successor must not promote)."""
        with self._lock:
            return sorted(self._writers)

    def quiet(self, stable_after: float, *, with_writers: bool = False) -> list[str]:
        """Dirty paths with no open writer and no change for ``stable_after`` seconds.

        ``with_writers``: also paths believed open for writing. Writers inferred from
        inotify lag behind (a close still queued), so at shutdown dir and overlay
        modes take every path and let their /proc check decide which are held."""
        cutoff = time.monotonic() - stable_after
        with self._lock:
            return sorted(
                p for p, t in self._dirty.items()
                if t <= cutoff and (with_writers or p not in self._writers)
                and not self._is_held(p, t)
            )

    # --- a job killed mid-write -------------------------------------------
    def hold(self, since: float, until: float) -> int:
        """Keep every path whose last change falls in [``since``, ``until``] (monotonic)
        out of promotion: what a job killed in that time may have left half-written.
        A later change (the file written again) lifts it. Returns how many are held.

        A window, not a set of paths: the kernel's RELEASE of a killed process's
        files can arrive after this call, and must not count as a new change.
        """
        with self._lock:
            merged: list[tuple[float, float]] = []
            for a, b in sorted([*self._holds, (since, until)]):
                if merged and a <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], b))
                else:
                    merged.append((a, b))
            self._holds = merged
            self._hold_starts = [a for a, _ in merged]
            return sum(1 for t in self._dirty.values() if since <= t <= until)

    def hold_paths(self, paths: set[str]) -> int:
        """Keep ``paths`` out of promotion as they are now (a writer that can no longer
        finish them left them): a later change lifts the hold. Returns how many."""
        now = time.monotonic()
        with self._lock:
            for p in paths:
                if p not in self._dirty:
                    self._set_dirty(p, now)
                self._path_holds[p] = now
        return len(paths)

    def holding(self) -> bool:
        """Whether a ``hold`` keeps any dirty path out of promotion."""
        with self._lock:
            return ((bool(self._holds) or bool(self._path_holds))
                    and any(self._is_held(p, t) for p, t in self._dirty.items()))

    def held(self) -> list[str]:
        """The dirty paths a ``hold`` keeps out of promotion."""
        with self._lock:
            return sorted(p for p, t in self._dirty.items() if self._is_held(p, t))

    def _is_held(self, path: str, t: float) -> bool:
        held_at = self._path_holds.get(path)
        return ((held_at is not None and t <= held_at)
                or (bool(self._holds) and self._in_hold(t)))

    def _in_hold(self, t: float) -> bool:
        i = bisect.bisect_right(self._hold_starts, t) - 1
        return i >= 0 and t <= self._holds[i][1]

    def forget(self, path: str, seen_at: float | None = None) -> None:
        """The promoter handled ``path``; drop it unless it changed after ``seen_at``."""
        with self._lock:
            t = self._dirty.get(path)
            if t is not None and (seen_at is None or t <= seen_at):
                self._drop_dirty(path)

    def pending(self) -> int:
        with self._lock:
            return len(self._dirty)

