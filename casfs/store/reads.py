"""Per-node read records: which published files a node's jobs opened, and when.

Retention by use needs to know what is still read, and most reads happen on
nodes that publish nothing (a warm node only reads), so each mount writes
what its jobs opened since its last record as a small file of its own:

    namespaces/<ns>/reads/<12-digit unix time>-<node id>-<8 hex>
    {"casfs_reads": 1, "node": "<node id>", "time": 1796000000.1,
     "until": 1796003600.0, "paths": [...]}

``paths`` were opened at some time at or before ``time`` and may be opened
again, unrecorded, until ``until`` (the end of the writer's recording epoch,
casfs.node.usage: a path is recorded once per epoch; ``until`` = ``time`` when
absent, and in a mount's last record). So a path is *used since* a cut-off
when a record naming it has ``until`` >= the cut-off: no path opened after the
cut-off is missed (in flushed records), and one opened up to an epoch before
it may be kept. ``until`` - ``time`` is at most ``MAX_EPOCH``.

Written create-exclusive (the root is only ever added to) by every view mode
(casfs.node.usage says when). ``casfs gc --unused-for`` compacts them: it
replaces every record by a few holding each path still covered at its cut-off
with that path's latest ``until`` (``"untils"``, one per path; a reader that
ignores it takes the record's ``until``, the latest, and keeps more). A bad
record is ignored (it can only make gc keep more).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable

from casfs.errors import HostileManifestError
from casfs.store.backend import Backend
from casfs.util import jsonsafe
from casfs.util.paths import is_valid_relpath

log = logging.getLogger(__name__)

FORMAT = 1
MAX_PATHS = 100_000
MAX_BYTES = 32 << 20
MAX_EPOCH = 7200.0  # the longest a record's "until" may lie after its "time" (seconds)


def _dir(ns: str) -> str:
    return f"namespaces/{ns}/reads"


def record(backend: Backend, ns: str, node: str, paths: Iterable[str], now: float,
           until: float | None = None) -> str | None:
    """Write one read record (None if there was nothing to record)."""
    todo = [p for p in dict.fromkeys(paths) if is_valid_relpath(p)][:MAX_PATHS]
    if not todo:
        return None
    key = f"{_dir(ns)}/{int(now):012d}-{node}-{os.urandom(4).hex()}"
    doc: dict[str, object] = {"casfs_reads": FORMAT, "node": node, "time": now, "paths": todo}
    if until is not None and until > now:
        doc["until"] = min(until, now + MAX_EPOCH)
    backend.create_exclusive(key, json.dumps(doc, separators=(",", ":")).encode())
    return key


def _time_of(name: str) -> int | None:
    head = name.split("-", 1)[0]
    return int(head) if len(head) == 12 and head.isdigit() else None


def _uses(backend: Backend, key: str, t: int) -> list[tuple[str, float]]:
    """(path, until) of one record; [] if it is unreadable (logged)."""
    try:
        info = backend.info(key)
        if info is None or info.size > MAX_BYTES:
            return []
        doc = jsonsafe.parse(backend.read_range(key, 0, info.size), "read record")
    except (OSError, HostileManifestError) as e:
        log.warning("ignoring read record %s: %s", key, e)
        return []
    if not isinstance(doc, dict) or not isinstance(doc.get("paths"), list):
        return []
    paths = doc["paths"]
    # Times bounded (jsonsafe.real): a 401-digit "until" overflowed float() and
    # aborted gc --unused-for for the whole namespace.
    until = jsonsafe.real(doc.get("until", doc.get("time", t)))
    if until is None:
        return []
    untils: list[float | None] = [until] * len(paths)
    compacted = doc.get("untils")  # a compacted record: one per path
    if isinstance(compacted, list) and len(compacted) == len(paths):
        each = [jsonsafe.real(u) for u in compacted]
        if None not in each:
            untils = each
    return [(p, min(u, until)) for p, u in zip(paths, untils, strict=True)
            if isinstance(p, str) and u is not None]


def _covered(backend: Backend, ns: str, since: float) -> tuple[dict[str, float], list[str]]:
    """(path -> latest until, for untils at or after ``since``; every record name listed)."""
    out: dict[str, float] = {}
    names = list(backend.list(_dir(ns)))
    for name in names:
        t = _time_of(name)
        if t is None or t + MAX_EPOCH < int(since):
            continue  # every until in it is earlier
        for p, u in _uses(backend, f"{_dir(ns)}/{name}", t):
            if u >= since and u > out.get(p, -1.0):
                out[p] = u
    return out, names


def read_since(backend: Backend, ns: str, since: float) -> set[str]:
    """Every path a record names with an ``until`` at or after ``since``."""
    return set(_covered(backend, ns, since)[0])


def compact(backend: Backend, ns: str, node: str, since: float, now: float) -> int:
    """Replace every read record by a few compacted ones holding each path still
    covered at ``since`` with its latest ``until`` (``"untils"``, one per path,
    ``MAX_PATHS`` per record); how many records it replaced. Run by gc, so the
    next gc reads a handful of records instead of every node's hourly ones.
    Records written meanwhile are not touched; two gcs compacting at once only
    write the same summary twice."""
    cov, names = _covered(backend, ns, since)
    items = sorted(cov.items())
    for i in range(0, len(items), MAX_PATHS):
        chunk = items[i:i + MAX_PATHS]
        top = max(u for _, u in chunk)
        doc = {"casfs_reads": FORMAT, "node": node, "time": now, "until": top,
               "paths": [p for p, _ in chunk], "untils": [u for _, u in chunk]}
        # Named by its latest until: readers skip a record named MAX_EPOCH before a cut-off.
        key = f"{_dir(ns)}/{int(top):012d}-{node}-{os.urandom(4).hex()}"
        backend.create_exclusive(key, json.dumps(doc, separators=(",", ":")).encode())
    for name in names:
        if _time_of(name) is not None:
            backend.delete(f"{_dir(ns)}/{name}")
    return len(names)
