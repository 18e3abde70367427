"""Generation records: the format of ``namespaces/<ns>/generations/<seq>`` and its names.

A generation record is a small JSON file ``namespaces/<ns>/generations/<seq>``
(seq zero-padded to 12 digits) naming the manifest objects that make up the
snapshot (docs/format.md, "Generation records"):

    {"casfs_generation": 2, "namespace": ns, "seq": N, "parent": N-1 | null,
     "base": {"digest", "size", "entries"} | null,
     "deltas": [{"digest", "size", "entries"}, ...],
     "entries": total files, "bytes": total logical bytes,
     "created": unix time, "node": node id, "casfs_version": "...",
     "fingerprint": {...} | null, "requires": [feature, ...] (optional),
     ...optional keys listed in docs/format.md}

Versions 1 and 2 are read. A record of a newer version, or one requiring a
feature this code lacks, is not damage (NewerFormatError): readers serve the
newest generation they can read and publishers refuse the namespace, since
building N+1 on an older snapshot would drop the newer entries for everyone.

An entry whose extras hold ``"replace": true`` (``is_replace``) is a version
of a *replaced* path: it overrides the same path in an earlier part, and a
record holding one ``requires`` the ``replace`` feature.

This module holds the format alone: ``Record``, ``Part``, ``parse_record``,
seq names and the namespace and pin name checks. Reading, merging and
publishing records is casfs.store.generations, above it.

Layering: above casfs.store.manifest (version checks), casfs.store.digests and
casfs.store.entry; below casfs.store.snapshot and casfs.store.generations.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from casfs.errors import HostileManifestError, NewerFormatError, UsageError
from casfs.store import manifest
from casfs.store.digests import DIGEST_RE
from casfs.store.entry import Entry
from casfs.util import jsonsafe

RECORD_VERSION = 2  # written when a record needs it (options, requires); else 1
READABLE_VERSIONS = (1, 2)
# Features a record may ``require`` that this code implements; a record requiring
# any other is treated as a newer format (a reader ignoring it would serve wrong
# bytes). Optional keys that are safe to ignore need no entry here.
SUPPORTED_FEATURES: frozenset[str] = frozenset({"replace", "pack"})
REPLACE = "replace"  # extras key and feature: a later version of the path overrides
RELOCATE = "relocate"  # extras key: a path-bearing file stored path-free, with N paths
_CORE_KEYS = frozenset({
    "casfs_generation", "namespace", "seq", "parent", "base", "deltas", "entries", "bytes",
    "created", "node", "casfs_version", "fingerprint", "requires",
})
SEQ_WIDTH = 12
MAX_RECORD_BYTES = 1 << 20
# A record's parts are decoded and merged whole: a record listing more deltas than
# a publisher ever leaves (it compacts at generations.COMPACT_DELTAS, 32), or parts
# adding up to more than this many of the largest manifest read, is damage.
MAX_DELTAS = 128
MAX_PARTS_FACTOR = 2
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}\Z")  # \Z: "$" lets "x\n" through
# A namespace on the root may carry its tenant: "<tenant>~<name>" (casfs.tenants).
NS_RE = re.compile(r"^(?:[a-z0-9][a-z0-9_-]{0,31}~)?[A-Za-z0-9_][A-Za-z0-9._-]{0,127}\Z")


def check_name(name: str, what: str = "namespace") -> str:
    if not isinstance(name, str) or not (NS_RE if what == "namespace" else NAME_RE).match(name):
        raise UsageError(f"invalid {what} name {name!r:.80}: use 1-128 of [A-Za-z0-9._-],"
                         " after an optional <tenant>~")
    return name


def seq_name(seq: int) -> str:
    return f"{seq:0{SEQ_WIDTH}d}"


@dataclass(frozen=True, slots=True)
class Part:
    """One manifest object of a generation."""

    digest: str
    size: int
    entries: int

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "size": self.size, "entries": self.entries}


@dataclass(frozen=True)
class Record:
    namespace: str
    seq: int
    parent: int | None
    base: Part | None
    deltas: tuple[Part, ...]
    entries: int
    logical_bytes: int
    created: float
    node: str
    casfs_version: str
    fingerprint: dict[str, Any] | None = None
    # Optional top-level keys (docs/format.md), passed through unchanged.
    options: dict[str, Any] = field(default_factory=dict)
    requires: tuple[str, ...] = ()

    @property
    def parts(self) -> list[Part]:
        return ([self.base] if self.base else []) + list(self.deltas)

    def to_json(self) -> bytes:
        doc: dict[str, Any] = dict(self.options)
        if self.requires:
            doc["requires"] = sorted(self.requires)
        doc |= {
            # The oldest version that holds this record: nodes still on the
            # previous release read v1 and would skip a v2 record as damaged.
            "casfs_generation": RECORD_VERSION if self.options or self.requires else 1,
            "namespace": self.namespace,
            "seq": self.seq,
            "parent": self.parent,
            "base": self.base.to_json() if self.base else None,
            "deltas": [d.to_json() for d in self.deltas],
            "entries": self.entries,
            "bytes": self.logical_bytes,
            "created": self.created,
            "node": self.node,
            "casfs_version": self.casfs_version,
            "fingerprint": self.fingerprint,
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"


def _int(doc: dict[str, Any], key: str, *, nullable: bool = False) -> Any:
    v = doc.get(key)
    if v is None and nullable:
        return None
    if type(v) is not int or not 0 <= v < 1 << 63:  # past any seq, size or count
        raise HostileManifestError(f"bad {key!r}")
    return v


def _part(obj: object) -> Part:
    if not isinstance(obj, dict):
        raise HostileManifestError("malformed manifest reference")
    digest = obj.get("digest")
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise HostileManifestError("bad manifest digest")
    return Part(digest, _int(obj, "size"), _int(obj, "entries"))


def parse_record(data: bytes, namespace: str, seq: int) -> Record:
    """Validate a record; its namespace and seq must match where it was found."""
    where = f"generation {namespace}@{seq}"
    doc = jsonsafe.parse(data, where)
    manifest.check_version(doc, "casfs_generation", READABLE_VERSIONS, where)
    requires = doc.get("requires", [])
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise HostileManifestError(f"{where}: bad 'requires'")
    missing = sorted(set(requires) - SUPPORTED_FEATURES)
    if missing:
        raise NewerFormatError(
            f"{where}: requires {', '.join(m[:40] for m in missing[:4])}, which this casfs"
            " does not implement; upgrade casfs on this node")
    if doc.get("namespace") != namespace or doc.get("seq") != seq:
        raise HostileManifestError(f"generation {namespace}@{seq}: record names another generation")
    deltas = doc.get("deltas")
    if not isinstance(deltas, list):
        raise HostileManifestError(f"generation {namespace}@{seq}: deltas is not a list")
    if len(deltas) > MAX_DELTAS:
        raise HostileManifestError(f"generation {namespace}@{seq}: {len(deltas)} delta"
                                   f" manifests (a publisher compacts long before {MAX_DELTAS})")
    created = jsonsafe.real(doc.get("created"))  # a 4300-digit int overflowed float()
    if created is None:
        raise HostileManifestError(f"generation {namespace}@{seq}: bad created time")
    fp = doc.get("fingerprint")
    try:
        parent = _int(doc, "parent", nullable=True)
        base = _part(doc["base"]) if doc.get("base") is not None else None
        parts = tuple(_part(d) for d in deltas)
        entries = _int(doc, "entries")
        logical_bytes = _int(doc, "bytes")
    except HostileManifestError as e:  # name the record: "bad 'bytes'" alone says nothing
        raise HostileManifestError(f"generation {namespace}@{seq}: {e.message}") from None
    # Each manifest is bounded (max_manifest_bytes), their sum must be too: every part is
    # decoded and merged in memory. A publisher compacts once its deltas reach a quarter
    # of the base, so a genuine record's parts add up to ~1.25 manifests at most.
    # (One part alone is the manifest bound's: refused unread where it is loaded.)
    every = ((base,) if base is not None else ()) + parts
    total = sum(p.size for p in every)
    if len(every) > 1 and total > MAX_PARTS_FACTOR * manifest.max_manifest_bytes():
        raise HostileManifestError(
            f"generation {namespace}@{seq}: its manifests add up to {total} bytes, over"
            f" {MAX_PARTS_FACTOR}x the largest one read (CASFS_MAX_MANIFEST_BYTES)")
    return Record(
        namespace=namespace,
        seq=seq,
        parent=parent,
        base=base,
        deltas=parts,
        entries=entries,
        logical_bytes=logical_bytes,
        created=created,
        node=str(doc.get("node", ""))[:128],
        casfs_version=str(doc.get("casfs_version", ""))[:64],
        fingerprint=fp if isinstance(fp, dict) else None,
        options={k: v for k, v in doc.items() if k not in _CORE_KEYS},
        requires=tuple(requires),
    )


def is_replace(e: Entry) -> bool:
    """Whether ``e`` is a version of a replaced path (it overrides earlier versions)."""
    return bool(e.extras and e.extras.get(REPLACE) is True)
