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

import itertools
import json
import re
from collections.abc import Iterable
from typing import Any

from casfs.errors import HostileManifestError, NewerFormatError, OverLimitError
from casfs.store.digests import DIGEST_RE
from casfs.store.entry import Entry, entries_of
from casfs.store.objects import ObjectStore
from casfs.util import jsonsafe
from casfs.util.envnum import env_int
from casfs.util.gcpause import gc_paused
from casfs.util.paths import all_plain, ancestor_dirs, check_relpath

MANIFEST_VERSION = 2
READABLE_VERSIONS = (1, 2)
# A manifest is buffered whole to be parsed, after its hash is verified; one
# larger than this is refused before a byte is read (about 400k entries).
# CASFS_MAX_MANIFEST_BYTES raises it for namespaces that need more.
DEFAULT_MAX_MANIFEST_BYTES = 64 << 20
_EXTRA_KEY = re.compile(r"^[a-z][a-z0-9_]{0,31}\Z")


def max_manifest_bytes() -> int:
    return env_int("CASFS_MAX_MANIFEST_BYTES", DEFAULT_MAX_MANIFEST_BYTES)


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
    try:
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        # A file name that is not UTF-8 (b"\xff") is a str holding surrogate
        # escapes (os.fsdecode), which UTF-8 cannot carry: write the whole
        # manifest ASCII-escaped ("\udcff"), which every reader parses back to
        # the same str and check_relpath accepts as a name's raw bytes.
        return json.dumps(doc, separators=(",", ":")).encode()


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
    with gc_paused():  # ~10 objects per row, none cyclic
        return _decode(data)


def _decode(data: bytes) -> tuple[str, list[Entry]]:
    # Every number a row holds is checked by type and range (casfs.store.entry); a row's
    # compile seconds (``cs``) that is no figure (NaN) is ignored, not damage.
    doc = jsonsafe.parse(data, "manifest", finite=False)
    version = check_version(doc, "casfs_manifest", READABLE_VERSIONS, "manifest")
    kind = doc.get("kind")
    if kind not in ("full", "delta"):
        raise HostileManifestError(f"unknown manifest kind {kind!r:.40}")
    rows = doc.get("entries")
    if not isinstance(rows, list):
        raise HostileManifestError("manifest entries are not a list")
    entries = _entries_fast(rows, version)
    if entries is None:  # something is off: row by row, to say which row and why
        entries = [_entry(r, version) for r in rows]
    check_tree(entries)
    return kind, entries


_HEX_DIGITS = b"0123456789abcdef"


def _entries_fast(rows: list[Any], version: int) -> list[Entry] | None:
    """The rows as entries, checked column by column (100,000s of rows per manifest);
    None if any check fails (``_entry`` then finds the first bad row).

    The same checks as ``_entry``: plain paths (all_plain), lowercase hex
    digests, int sizes/modes/mtimes in range (``type is int``: no bools),
    extras only in 6-element rows of version 2.
    """
    if not all(type(r) is list for r in rows):
        return None
    lens = set(map(len, rows))
    if not lens <= ({5, 6} if version >= 2 else {5}):
        return None
    paths = [r[0] for r in rows]
    digests = [r[1] for r in rows]
    sizes = [r[2] for r in rows]
    modes = [r[3] for r in rows]
    mtimes = [r[4] for r in rows]
    if not all_plain(paths):
        return None
    try:
        joined = "".join(digests)
    except TypeError:
        return None
    # Lowercase hex only: deleting every hex digit must leave nothing (a C-speed
    # pass; a regex over 6 MB of digests is 20x slower).
    # (non-ASCII, lone surrogates included, becomes "?": not a hex digit)
    if not set(map(len, digests)) <= {64} or joined.encode(
            "ascii", "replace").translate(None, _HEX_DIGITS):
        return None
    if not rows:
        return []
    if not {*map(type, sizes), *map(type, modes), *map(type, mtimes)} <= {int}:
        return None
    if (min(sizes) < 0 or max(sizes) >= 1 << 63 or min(modes) < 0 or max(modes) > 0o7777
            or min(mtimes) <= -(1 << 63) or max(mtimes) >= 1 << 63):
        return None
    if 6 not in lens:
        return entries_of(rows)
    try:
        return [Entry(r[0], r[1], r[2], r[3], r[4],
                      (_extras(r[5], r[0]) or None) if len(r) == 6 else None) for r in rows]
    except HostileManifestError:
        return None


def check_tree(entries: list[Entry]) -> None:
    """Entries must be sorted, unique, and no file may also be a directory."""
    ordered = [e.path for e in entries]
    if not all(a < b for a, b in itertools.pairwise(ordered)):
        prev = None
        for p in ordered:
            if prev is not None and p <= prev:
                raise HostileManifestError(f"manifest not sorted or has duplicates at {p!r:.120}")
            prev = p
    paths = set(ordered)
    both = ancestor_dirs(ordered) & paths
    if both:
        raise HostileManifestError(f"{min(both)!r:.120} is both a file and a directory")


def load(store: ObjectStore, digest: str, size: int) -> tuple[str, list[Entry]]:
    """Fetch, verify and decode one manifest object (memory bounded by max_manifest_bytes)."""
    limit = max_manifest_bytes()
    if size > limit:
        raise OverLimitError(
            f"manifest {digest} is too large ({size} bytes, limit {limit};"
            " raise CASFS_MAX_MANIFEST_BYTES if it is genuine)")
    return decode(store.get_bytes(digest, size))
