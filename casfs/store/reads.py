"""Per-node read records: which published files a node's jobs opened, and when.

Retention by use needs to know what is still read, and most reads happen on
nodes that publish nothing (a warm node only reads), so each mount writes
what its jobs opened since its last record as a small file of its own:

    namespaces/<ns>/reads/<12-digit unix time>-<node id>-<8 hex>
    {"casfs_reads": 1, "node": "<node id>", "time": 1796000000.1, "paths": [...]}

Written create-exclusive (the root is only ever added to), at most every
``RECORD_EVERY`` seconds per mount and at release; deleted by ``casfs gc``
once older than the longest retention anyone asks for (``--unused-for``).
A bad record is ignored (it can only make gc keep more).
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


def _dir(ns: str) -> str:
    return f"namespaces/{ns}/reads"


def record(backend: Backend, ns: str, node: str, paths: Iterable[str], now: float) -> str | None:
    """Write one read record (None if there was nothing to record)."""
    todo = [p for p in dict.fromkeys(paths) if is_valid_relpath(p)][:MAX_PATHS]
    if not todo:
        return None
    key = f"{_dir(ns)}/{int(now):012d}-{node}-{os.urandom(4).hex()}"
    doc = {"casfs_reads": FORMAT, "node": node, "time": now, "paths": todo}
    backend.create_exclusive(key, json.dumps(doc, separators=(",", ":")).encode())
    return key


def _time_of(name: str) -> int | None:
    head = name.split("-", 1)[0]
    return int(head) if len(head) == 12 and head.isdigit() else None


def read_since(backend: Backend, ns: str, since: float) -> set[str]:
    """Every path a node recorded opening at or after ``since``."""
    out: set[str] = set()
    for name in backend.list(_dir(ns)):
        t = _time_of(name)
        if t is None or t < int(since):
            continue
        key = f"{_dir(ns)}/{name}"
        try:
            info = backend.info(key)
            if info is None or info.size > MAX_BYTES:
                continue
            doc = json.loads(backend.read_range(key, 0, info.size))
            paths = doc.get("paths") if isinstance(doc, dict) else None
        except (OSError, ValueError, RecursionError) as e:
            log.warning("ignoring read record %s: %s", key, e)
            continue
        if isinstance(paths, list):
            out.update(p for p in paths if isinstance(p, str))
    return out


def expire(backend: Backend, ns: str, before: float, dry_run: bool = False) -> int:
    """Delete the read records older than ``before``; how many."""
    n = 0
    for name in list(backend.list(_dir(ns))):
        t = _time_of(name)
        if t is not None and t < int(before):
            n += 1
            if not dry_run:
                backend.delete(f"{_dir(ns)}/{name}")
    return n
