"""Daily outcome records: hits, misses and compile time saved, per namespace, node and day.

Read records (casfs.store.reads) say which paths were opened, once per epoch,
and gc compacts them away; the cluster report (``casfs report``) needs what
happened each day, so mounts write these small records of their own:

    namespaces/<ns>/outcomes/<YYYYMMDD>-<node id>-<8 hex>
    {"casfs_outcomes": 1, "namespace": ns, "family": <family>,
     "rows": [[day "YYYY-MM-DD", node, hits, misses, saved_ms, untimed_hits], ...],
     "missed": [[entry, lookups], ...]}

A mount writes one record per namespace at release and at the first
publication of a new (UTC) day, with one row: what its jobs did since its
previous record (``hits``: entries opened from the cache, once per entry and
epoch; ``misses``: entries first missed; ``saved_ms``: compile time those hits
saved, casfs.node.compiletime), and its most-missed entries (at most 50). The
name's day is the newest row's; nothing is written when all is zero.

``casfs gc`` compacts them (``compact``): every record whose day is complete
(before yesterday) is merged, per month, into one record of one row per
(day, node), named by the month's newest day and by a digest of what it
merged (so two gcs merging the same records write one name, not twice the
counts), then the merged ones are deleted; rows older than the kept window
(``gc --keep-outcomes DAYS``, default 90) are dropped then, never earlier. A
record that is not of this form is ignored (it can only leave a figure out).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from casfs.errors import HostileManifestError
from casfs.store.backend import Backend
from casfs.util import jsonsafe

log = logging.getLogger(__name__)

FORMAT = 1
READ_THREADS = 16  # outcome records read at once (two requests each on S3)
MAX_BYTES = 4 << 20  # a record (a merged month of a busy namespace stays far below)
MISSED_MAX = 50  # most-missed entries per mount record
MERGED_MISSED_MAX = 200  # per merged record
KEEP_DAYS = 90
_NODE_MAX = 128


def _dir(ns: str) -> str:
    return f"namespaces/{ns}/outcomes"


def day_of(t: float) -> str:
    """The UTC day of ``t``, ``YYYY-MM-DD``."""
    return time.strftime("%Y-%m-%d", time.gmtime(t))


def _compact_day(day: str) -> str:
    return day.replace("-", "")


@dataclass
class Row:
    day: str
    node: str
    hits: int = 0
    misses: int = 0
    saved_ms: int = 0
    untimed: int = 0

    def to_json(self) -> list[Any]:
        return [self.day, self.node, self.hits, self.misses, self.saved_ms, self.untimed]


@dataclass
class Outcomes:
    """A namespace's rows and most-missed entries, as read."""

    namespace: str
    family: str | None = None
    rows: list[Row] = field(default_factory=list)
    missed: Counter[str] = field(default_factory=Counter)


def record(backend: Backend, ns: str, *, family: str, node: str, now: float, hits: int,
           misses: int, saved_ms: int, untimed: int = 0,
           missed: Iterable[tuple[str, int]] = (), day: str | None = None) -> str | None:
    """Write one mount's outcome record, its row for ``day`` (default: ``now``'s);
    None: nothing to say."""
    if not (hits or misses or saved_ms):
        return None
    day = day if day is not None and _name_day(day.replace("-", "")) == day else day_of(now)
    top = sorted(missed, key=lambda m: (-m[1], m[0]))[:MISSED_MAX]
    doc = {"casfs_outcomes": FORMAT, "namespace": ns, "family": family, "time": now,
           "rows": [Row(day, node, hits, misses, saved_ms, untimed).to_json()],
           "missed": [[e, n] for e, n in top]}
    key = f"{_dir(ns)}/{_compact_day(day)}-{node}-{os.urandom(4).hex()}"
    backend.create_exclusive(key, json.dumps(doc, separators=(",", ":")).encode())
    return key


def _name_day(name: str) -> str | None:
    head = name.split("-", 1)[0]
    if len(head) != 8 or not head.isdigit():
        return None
    return f"{head[:4]}-{head[4:6]}-{head[6:]}"


def _int(v: Any) -> int | None:
    return v if type(v) is int and 0 <= v < 1 << 53 else None


# A record is a tenant's file: a node name or path with control characters (a
# terminal's escape sequences, a newline forging a line of `casfs report`) is dropped.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _parse(data: bytes, ns: str) -> tuple[str | None, list[Row], list[tuple[str, int]]] | None:
    try:
        doc = jsonsafe.parse(data, "outcome record")
    except HostileManifestError:
        return None
    if not isinstance(doc, dict) or doc.get("casfs_outcomes") != FORMAT:
        return None
    if doc.get("namespace") != ns or not isinstance(doc.get("rows"), list):
        return None
    fam = doc.get("family")
    rows = []
    for r in doc["rows"]:
        if not (isinstance(r, list) and len(r) >= 6 and isinstance(r[0], str)
                and _name_day(r[0].replace("-", "")) == r[0] and isinstance(r[1], str)
                and 0 < len(r[1]) <= _NODE_MAX and not _CONTROL.search(r[1])):
            continue
        nums = [_int(v) for v in r[2:6]]
        if any(n is None for n in nums):
            continue
        rows.append(Row(r[0], r[1], *nums))  # type: ignore[arg-type]  # checked above
    missed = []
    for m in doc.get("missed") or []:
        if (isinstance(m, list) and len(m) == 2 and isinstance(m[0], str)
                and len(m[0]) <= 4096 and not _CONTROL.search(m[0])
                and _int(m[1]) is not None):
            missed.append((m[0], m[1]))
    return (fam if isinstance(fam, str) else None), rows, missed


def _records(backend: Backend, ns: str, since_day: str | None,
             until_day: str | None = None) -> Iterator[tuple[str, str, bytes]]:
    """(name, name's day, bytes) of each record whose day is in the range."""
    d = _dir(ns)
    todo = []
    for name in sorted(backend.list(d)):
        day = _name_day(name)
        if day is None or (since_day is not None and day < since_day) or (
                until_day is not None and day > until_day):
            continue
        todo.append((name, day))

    def fetch(key: str) -> bytes | None:
        try:
            info = backend.info(key)
            if info is None or info.size > MAX_BYTES:
                return None
            return backend.read_range(key, 0, info.size)
        except OSError as e:
            log.warning("ignoring outcome record %s: %s", key, e)
            return None

    # In parallel, in order: on an object store each record is two round trips (a
    # year of 4 nodes' daily records in sequence is minutes at 20 ms RTT).
    if len(todo) <= 1:
        got: Iterator[bytes | None] = (fetch(f"{d}/{n}") for n, _ in todo)
    else:
        pool = ThreadPoolExecutor(min(READ_THREADS, len(todo)), thread_name_prefix="outcomes")
        got = pool.map(fetch, [f"{d}/{n}" for n, _ in todo])
        pool.shutdown(wait=False)  # the threads end with the queue; map's results stay
    for (name, day), data in zip(todo, got, strict=True):
        if data is not None:
            yield name, day, data


def read(backend: Backend, ns: str, since: float | None = None) -> Outcomes:
    """Every row of ``ns`` whose day is at or after ``since``'s (all if None)."""
    since_day = day_of(since) if since is not None else None
    out = Outcomes(ns)
    for _, _, data in _records(backend, ns, since_day):
        parsed = _parse(data, ns)
        if parsed is None:
            continue
        fam, rows, missed = parsed
        out.family = out.family or fam
        out.rows.extend(r for r in rows if since_day is None or r.day >= since_day)
        for e, n in missed:
            out.missed[e] += n
    return out


@dataclass
class CompactResult:
    merged: int = 0  # records merged (deleted)
    written: int = 0  # merged records written
    dropped_rows: int = 0  # rows older than the kept window


def compact(backend: Backend, ns: str, *, now: float, keep_days: float = KEEP_DAYS,
            dry_run: bool = False) -> CompactResult:
    """Merge the complete days' records per month; drop rows older than ``keep_days``."""
    res = CompactResult()
    complete = day_of(now - 2 * 86400)  # days up to this one get no more writes
    cutoff = day_of(now - keep_days * 86400)  # rows before this day go
    months: dict[str, list[tuple[str, bytes]]] = {}
    for name, day, data in _records(backend, ns, None, complete):
        months.setdefault(day[:7], []).append((name, data))
    d = _dir(ns)
    for month, recs in sorted(months.items()):
        rows: dict[tuple[str, str], Row] = {}
        missed: Counter[str] = Counter()
        fam = None
        dropped = 0
        for _, data in recs:
            parsed = _parse(data, ns)
            if parsed is None:
                continue  # merged away with the rest: it held nothing readable
            f, rs, ms = parsed
            fam = fam or f
            for r in rs:
                if r.day < cutoff:
                    dropped += 1
                    continue
                have = rows.setdefault((r.day, r.node), Row(r.day, r.node))
                have.hits += r.hits
                have.misses += r.misses
                have.saved_ms += r.saved_ms
                have.untimed += r.untimed
            missed.update(dict(ms))
        res.dropped_rows += dropped
        if len(recs) == 1 and not dropped and _already_merged(recs[0][0]):
            continue  # a month merged before, nothing new
        if dry_run:
            res.merged += len(recs)
            continue
        if rows:
            newest = max(day for day, _ in rows)
            digest = hashlib.blake2b("\n".join(sorted(n for n, _ in recs)).encode(),
                                     digest_size=8).hexdigest()
            doc = {"casfs_outcomes": FORMAT, "namespace": ns, "family": fam, "time": now,
                   "rows": [r.to_json() for _, r in sorted(rows.items())],
                   "missed": [[e, n] for e, n in missed.most_common(MERGED_MISSED_MAX)]}
            key = f"{d}/{_compact_day(newest)}-gc.{month.replace('-', '')}-{digest}"
            if backend.create_exclusive(key, json.dumps(doc, separators=(",", ":")).encode()):
                res.written += 1
        for name, _ in recs:
            backend.delete(f"{d}/{name}")
            res.merged += 1
    return res


def _already_merged(name: str) -> bool:
    parts = name.split("-")
    return len(parts) >= 2 and parts[1].startswith("gc.")
