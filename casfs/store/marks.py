"""gc marks: the objects one gc run found unreferenced (phase 1 of casfs.store.maintenance.gc).

    gc/marks/<created, 12 digits>-<32 hex>    zstd(JSON) {"casfs_gc_mark": 1, "created": t,
                                                         "digests": [hex, ...],
                                                         "packs": [hex, ...]}

A mark is created once (create-only) and deleted by the sweep that acts on
it. Its age is taken from the storage's own timestamp of the mark (the clock
that also stamps objects), not from the writer's clock. Publishers read
marks (``condemned``) to learn which re-used objects they must write again.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import zstandard

from casfs.store.backend import Backend, NotRegularFileError
from casfs.store.digests import DIGEST_RE

log = logging.getLogger(__name__)

PREFIX = "gc/marks"
NAME_RE = re.compile(r"^\d{12}-[0-9a-f]{32}\Z")
MAX_MARK_BYTES = 1 << 30
# Object stores stamp whole seconds: an object written in the mark's second may
# look older than the mark. Within this slack it counts as written after it (kept).
MTIME_SLACK = 2.0
# How often a publisher re-lists marks. gc's grace must exceed this plus the
# longest publication, so every publisher sees a mark before it is swept.
LIST_TTL = 30.0


@dataclass(frozen=True, slots=True)
class Mark:
    name: str
    created: float  # the storage's timestamp of the mark object
    digests: frozenset[str]
    packs: frozenset[str] = frozenset()  # pack objects (casfs.store.packs) it names

    def spares(self, mtime: float) -> bool:
        """Whether an object with this mtime was (possibly) written after the mark."""
        return mtime >= self.created - MTIME_SLACK


def write(backend: Backend, digests: Iterable[str], created: float,
          packs: Iterable[str] = ()) -> str:
    name = f"{int(created):012d}-{uuid.uuid4().hex}"
    doc = {"casfs_gc_mark": 1, "created": created, "digests": sorted(digests),
           "packs": sorted(packs)}
    data = zstandard.ZstdCompressor(level=3).compress(json.dumps(doc).encode())
    backend.create_exclusive(f"{PREFIX}/{name}", data)
    return name


def remove(backend: Backend, mark: Mark) -> None:
    backend.delete(f"{PREFIX}/{mark.name}")


def _read(backend: Backend, name: str) -> Mark | None:
    key = f"{PREFIX}/{name}"
    info = backend.info(key)
    if info is None:
        return None  # swept meanwhile
    try:
        with backend.open(key) as f:
            raw = f.read(MAX_MARK_BYTES)
        doc = json.loads(zstandard.ZstdDecompressor().decompress(raw,
                                                                 max_output_size=MAX_MARK_BYTES))
        digests = frozenset(d for d in doc["digests"] if isinstance(d, str) and DIGEST_RE.match(d))
        packs = frozenset(d for d in doc.get("packs", [])
                          if isinstance(d, str) and DIGEST_RE.match(d))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, RecursionError, NotRegularFileError,
            zstandard.ZstdError) as e:
        # A damaged mark (a FIFO or directory too) protects nothing and condemns
        # nothing: ignore it (logged).
        log.warning("ignoring damaged gc mark %s: %s", name, e)
        return None
    return Mark(name, info.mtime, digests, packs)


def load_all(backend: Backend) -> Iterator[Mark]:
    for name in backend.list(PREFIX):
        if NAME_RE.match(name):
            m = _read(backend, name)
            if m is not None:
                yield m


class Condemned:
    """The digests named by current marks, cached per mark (marks are immutable).

    Re-listed at most every ``ttl`` seconds: a LIST that lags by seconds is
    harmless, since a mark is acted on only ``grace`` (hours) after it is made.
    """

    def __init__(self, backend: Backend, ttl: float | None = None) -> None:
        self.backend = backend
        self.ttl = LIST_TTL if ttl is None else ttl
        self._marks: dict[str, frozenset[str]] = {}
        self._listed = 0.0
        self._lock = threading.Lock()

    def digests(self) -> set[str]:
        with self._lock:
            if time.monotonic() - self._listed >= self.ttl or not self._listed:
                names = {n for n in self.backend.list(PREFIX) if NAME_RE.match(n)}
                for n in list(self._marks):
                    if n not in names:
                        del self._marks[n]
                for n in names - set(self._marks):
                    m = _read(self.backend, n)
                    if m is not None:
                        self._marks[n] = m.digests | m.packs
                self._listed = time.monotonic()
            out: set[str] = set()
            for d in self._marks.values():
                out |= d
            return out
