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
(casfs.node.usage says when); deleted by ``casfs gc`` once older than the
cut-off it runs with (``--unused-for``). A bad record is ignored (it can only
make gc keep more).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable

from casfs.store.backend import Backend
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


def read_since(backend: Backend, ns: str, since: float) -> set[str]:
    """Every path a record names whose ``until`` is at or after ``since``."""
    out: set[str] = set()
    for name in backend.list(_dir(ns)):
        t = _time_of(name)
        if t is None or t + MAX_EPOCH < int(since):
            continue
        key = f"{_dir(ns)}/{name}"
        try:
            info = backend.info(key)
            if info is None or info.size > MAX_BYTES:
                continue
            doc = json.loads(backend.read_range(key, 0, info.size))
            paths = doc.get("paths") if isinstance(doc, dict) else None
            until = doc.get("until", doc.get("time", t))
        except (OSError, ValueError, RecursionError) as e:
            log.warning("ignoring read record %s: %s", key, e)
            continue
        if not isinstance(until, int | float) or until < since:
            continue  # the epoch it covers ended before the cut-off
        if isinstance(paths, list):
            out.update(p for p in paths if isinstance(p, str))
    return out


def expire(backend: Backend, ns: str, before: float, dry_run: bool = False) -> int:
    """Delete the read records that cover nothing at or after ``before``; how many."""
    n = 0
    for name in list(backend.list(_dir(ns))):
        t = _time_of(name)
        if t is not None and t + MAX_EPOCH < int(before):
            n += 1
            if not dry_run:
                backend.delete(f"{_dir(ns)}/{name}")
    return n
