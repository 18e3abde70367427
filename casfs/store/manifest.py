"""Manifest objects: the entry lists that generations are made of.

A manifest is an ordinary object in the store (compressed, deduplicated,
verified like any other) holding UTF-8 JSON:

    {"casfs_manifest": 1, "kind": "full" | "delta",
     "entries": [[path, digest, size, mode, mtime_ns], ...]}

Entries are sorted by path, unique, and every path is re-validated on every
read (casfs.util.paths). A manifest that fails any check is rejected whole:
a half-trusted manifest could still point a job at the wrong bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from casfs.errors import HostileManifestError
from casfs.store.entry import Entry
from casfs.store.objects import DIGEST_RE, ObjectStore
from casfs.util.paths import check_relpath, parent_dirs

MANIFEST_VERSION = 1
# A manifest larger than this is refused before parsing (about 2.5M entries).
MAX_MANIFEST_BYTES = 512 << 20


def encode(entries: Iterable[Entry], kind: str) -> bytes:
    rows = sorted([e.path, e.digest, e.size, e.mode, e.mtime_ns] for e in entries)
    doc = {"casfs_manifest": MANIFEST_VERSION, "kind": kind, "entries": rows}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _entry(row: object) -> Entry:
    if not isinstance(row, list) or len(row) != 5:
        raise HostileManifestError(f"malformed manifest entry: {row!r:.120}")
    path, digest, size, mode, mtime = row
    check_relpath(path)
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise HostileManifestError(f"bad digest for {path!r}")
    if type(size) is not int or size < 0 or size >= 1 << 63:
        raise HostileManifestError(f"bad size for {path!r}")
    if type(mode) is not int or not 0 <= mode <= 0o7777:
        raise HostileManifestError(f"bad mode for {path!r}")
    if type(mtime) is not int or abs(mtime) >= 1 << 63:
        raise HostileManifestError(f"bad mtime for {path!r}")
    return Entry(path, digest, size, mode, mtime)


def decode(data: bytes) -> tuple[str, list[Entry]]:
    """Parse and validate a manifest; returns (kind, entries sorted by path)."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise HostileManifestError(f"manifest is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("casfs_manifest") != MANIFEST_VERSION:
        raise HostileManifestError("not a casfs manifest (or an unknown manifest version)")
    kind = doc.get("kind")
    if kind not in ("full", "delta"):
        raise HostileManifestError(f"unknown manifest kind {kind!r:.40}")
    rows = doc.get("entries")
    if not isinstance(rows, list):
        raise HostileManifestError("manifest entries are not a list")
    entries = [_entry(r) for r in rows]
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
    """Fetch, verify and decode one manifest object."""
    if size > MAX_MANIFEST_BYTES:
        raise HostileManifestError(f"manifest {digest} is too large ({size} bytes)")
    return decode(store.get_bytes(digest, size))
