"""Access profiles: which lower files jobs open, in order, so a fresh node can prefetch them.

A profile is an object in the store (named, compressed and verified like any
other), named by a generation record's optional key ``"profile"``. Its bytes::

    {"casfs_profile": 1, "runs": 5, "paths": [[path, hits], ...]}

``paths`` is ordered hottest first: by ``hits`` (how many recorded runs opened
the path), then by first-open order of the newest run. It holds at most
``MAX_PATHS`` paths (the coldest are dropped) and only valid relative paths.
A mount records the lower files its jobs open (first open only, in order);
at publication the node merges its recording into the profile of the record
it publishes on top of, so profiles accumulate across nodes and runs. A
profile is a hint: a bad or missing one is ignored (logged), never an error.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from typing import Any

from casfs.errors import HostileManifestError
from casfs.util import jsonsafe
from casfs.util.paths import is_valid_relpath

log = logging.getLogger(__name__)

FORMAT = 1
MAX_PATHS = 50_000
MAX_BYTES = 16 << 20  # a profile object larger than this is ignored
# The paths one recording or profile holds, in bytes of JSON: 50,000 paths of 4 KiB
# (PATH_MAX) made a 200 MB profile no reader takes, and a publish request over the
# promotion worker's message bound (a review: the worker replaced in a loop).
MAX_PATH_BYTES = 8 << 20


def path_bytes(p: str) -> int:
    """What ``p`` adds to a profile's JSON (or a request's), hits and separators too."""
    return len(p) + 12 if p.isascii() else len(json.dumps(p)) + 10


def encode(paths: list[tuple[str, int]], runs: int) -> bytes:
    doc = {"casfs_profile": FORMAT, "runs": runs, "paths": [[p, h] for p, h in paths]}
    return json.dumps(doc, separators=(",", ":")).encode()


def decode(data: bytes) -> tuple[list[tuple[str, int]], int]:
    """(paths hottest first, runs); ValueError if ``data`` is not a profile."""
    if len(data) > MAX_BYTES:
        raise ValueError("profile too large")
    try:
        doc: Any = jsonsafe.parse(data, "profile")
    except HostileManifestError as e:  # 200 KB of "[" is under MAX_BYTES, NaN, ...
        raise ValueError(str(e)) from None
    if not isinstance(doc, dict) or doc.get("casfs_profile") != FORMAT:
        raise ValueError("not a casfs profile (format 1)")
    # Counts bounded: a 4300-digit one, plus the merge's 1, is past what json.dumps
    # writes (int_max_str_digits), and every publisher building on it failed.
    runs = jsonsafe.count(doc.get("runs"))
    raw = doc.get("paths")
    if runs is None or not isinstance(raw, list):
        raise ValueError("bad profile")
    out: list[tuple[str, int]] = []
    for item in raw[:MAX_PATHS]:
        if (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and jsonsafe.count(item[1]) is not None and is_valid_relpath(item[0])):
            out.append((item[0], item[1]))
    return out, runs


def merge(older: list[tuple[str, int]], older_runs: int, newest: Iterable[str]
          ) -> tuple[list[tuple[str, int]], int]:
    """``older`` plus one run that opened ``newest`` (in order); bounded, hottest first."""
    hits = dict(older)
    order: dict[str, int] = {}
    for i, p in enumerate(newest):
        if p not in order:
            order[p] = i
            hits[p] = hits.get(p, 0) + 1
    old_pos = {p: i for i, (p, _) in enumerate(older)}
    n = len(order)
    ranked = sorted(hits, key=lambda p: (-hits[p], order.get(p, n + old_pos.get(p, 0))))
    out, size = [], 0
    for p in ranked[:MAX_PATHS]:
        size += path_bytes(p)
        if size > MAX_PATH_BYTES:
            break
        out.append((p, hits[p]))
    return out, older_runs + 1


class Recorder:
    """The lower files a mount's jobs opened, first open only, in order (thread-safe)."""

    def __init__(self, limit: int = MAX_PATHS, max_bytes: int = MAX_PATH_BYTES) -> None:
        self._seen: dict[str, None] = {}
        self._limit = limit
        self._room = max_bytes  # bytes of paths left (path_bytes)
        self._lock = threading.Lock()
        self._published = 0  # how many of _seen went into a published profile

    def opened(self, path: str) -> None:
        if path in self._seen or len(self._seen) >= self._limit or self._room <= 0:
            return
        self.opened_many([path])

    def opened_many(self, paths: list[str]) -> None:
        """``opened`` for each of ``paths``, in order (one lock for all)."""
        with self._lock:
            seen, room = self._seen, self._limit - len(self._seen)
            for p in paths:
                if room <= 0 or self._room <= 0:
                    return
                if p not in seen:
                    cost = path_bytes(p)
                    if cost > self._room:
                        self._room = 0
                        return
                    seen[p] = None
                    room -= 1
                    self._room -= cost

    def __len__(self) -> int:
        return len(self._seen)

    def unpublished(self) -> bool:
        return len(self._seen) > self._published

    def paths(self) -> list[str]:
        with self._lock:
            return list(self._seen)

    def mark_published(self, n: int) -> None:
        self._published = max(self._published, n)
