"""Manifest objects: the entry lists that generations are made of.

A manifest is an ordinary object in the store (compressed, deduplicated,
verified like any other) holding UTF-8 JSON:

    {"casfs_manifest": 2, "kind": "full" | "delta",
     "entries": [[path, digest, size, mode, mtime_ns], ...]}

A version 2 row may carry a 6th element, a dict of per-entry extras whose
keys are listed in docs/format.md (readers keep unknown keys and pass them
through; a key that changes what a reader must do needs a record
``requires`` feature instead). Version 1 rows have exactly 5 elements.
Readers accept versions 1 and 2; a newer version raises NewerFormatError,
which is not damage.

Entries are sorted by path, unique, and every path is re-validated on every
read (casfs.util.paths). A manifest that fails any check is rejected whole:
a half-trusted manifest could still point a job at the wrong bytes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from typing import Any

from casfs.errors import HostileManifestError, NewerFormatError, OverLimitError
from casfs.store.entry import Entry
from casfs.store.objects import DIGEST_RE, ObjectStore
from casfs.util import jsonsafe
from casfs.util.paths import check_relpath, parent_dirs

MANIFEST_VERSION = 2
READABLE_VERSIONS = (1, 2)
# A manifest is buffered whole to be parsed, after its hash is verified; one
# larger than this is refused before a byte is read (about 400k entries).
# CASFS_MAX_MANIFEST_BYTES raises it for namespaces that need more.
DEFAULT_MAX_MANIFEST_BYTES = 64 << 20
_EXTRA_KEY = re.compile(r"^[a-z][a-z0-9_]{0,31}\Z")


def max_manifest_bytes() -> int:
    env = os.environ.get("CASFS_MAX_MANIFEST_BYTES", "")
    return int(env) if env.isdigit() else DEFAULT_MAX_MANIFEST_BYTES


def _row(e: Entry) -> list[Any]:
    row: list[Any] = [e.path, e.digest, e.size, e.mode, e.mtime_ns]
    if e.extras:
        row.append(e.extras)
    return row


def encode(entries: Iterable[Entry], kind: str) -> bytes:
    rows = sorted((_row(e) for e in entries), key=lambda r: r[0])
    # The oldest version that holds these rows: the previous release reads v1 only.
    version = MANIFEST_VERSION if any(len(r) > 5 for r in rows) else 1
    doc = {"casfs_manifest": version, "kind": kind, "entries": rows}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _extras(obj: object, path: str) -> dict[str, Any]:
    if not isinstance(obj, dict) or not all(isinstance(k, str) and _EXTRA_KEY.match(k)
                                            for k in obj):
        raise HostileManifestError(f"bad extras for {path!r:.120}")
    return obj


def _entry(row: object, version: int) -> Entry:
    if not isinstance(row, list) or not (len(row) == 5 or (version >= 2 and len(row) == 6)):
        raise HostileManifestError(f"malformed manifest entry: {row!r:.120}")
    path, digest, size, mode, mtime = row[:5]
    check_relpath(path)
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise HostileManifestError(f"bad digest for {path!r}")
    if type(size) is not int or size < 0 or size >= 1 << 63:
        raise HostileManifestError(f"bad size for {path!r}")
    if type(mode) is not int or not 0 <= mode <= 0o7777:
        raise HostileManifestError(f"bad mode for {path!r}")
    if type(mtime) is not int or abs(mtime) >= 1 << 63:
        raise HostileManifestError(f"bad mtime for {path!r}")
    extras = (_extras(row[5], path) or None) if len(row) == 6 else None
    return Entry(path, digest, size, mode, mtime, extras)


def check_version(doc: object, key: str, readable: tuple[int, ...], what: str) -> int:
    """The format version of a parsed record/manifest: newer is not damage, garbage is."""
    v = doc.get(key) if isinstance(doc, dict) else None
    if type(v) is not int or v < 1:
        raise HostileManifestError(f"{what}: not a casfs {key.removeprefix('casfs_')}")
    if v > max(readable):
        raise NewerFormatError(
            f"{what}: format version {v} is newer than this casfs reads"
            f" ({max(readable)}); upgrade casfs on this node")
    if v not in readable:
        raise HostileManifestError(f"{what}: unknown format version {v}")
    return v


def decode(data: bytes) -> tuple[str, list[Entry]]:
    """Parse and validate a manifest; returns (kind, entries sorted by path)."""
    doc = jsonsafe.parse(data, "manifest")
    version = check_version(doc, "casfs_manifest", READABLE_VERSIONS, "manifest")
    kind = doc.get("kind")
    if kind not in ("full", "delta"):
        raise HostileManifestError(f"unknown manifest kind {kind!r:.40}")
    rows = doc.get("entries")
    if not isinstance(rows, list):
        raise HostileManifestError("manifest entries are not a list")
    entries = [_entry(r, version) for r in rows]
    check_tree(entries)
    return kind, entries


def check_tree(entries: list[Entry]) -> None:
    """Entries must be sorted, unique, and no file may also be a directory."""
    paths = set()
    prev = None
    for e in entries:
        if prev is not None and e.path <= prev:
            raise HostileManifestError(f"manifest not sorted or has duplicates at {e.path!r:.120}")
        prev = e.path
        paths.add(e.path)
    for e in entries:
        for d in parent_dirs(e.path):
            if d in paths:
                raise HostileManifestError(f"{d!r:.120} is both a file and a directory")


def load(store: ObjectStore, digest: str, size: int) -> tuple[str, list[Entry]]:
    """Fetch, verify and decode one manifest object (memory bounded by max_manifest_bytes)."""
    limit = max_manifest_bytes()
    if size > limit:
        raise OverLimitError(
            f"manifest {digest} is too large ({size} bytes, limit {limit};"
            " raise CASFS_MAX_MANIFEST_BYTES if it is genuine)")
    return decode(store.get_bytes(digest, size))
