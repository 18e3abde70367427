"""Which entries a published generation holds, by name: a node-local cache of its manifests.

A miss names its cause (casfs.cli.misscause) by looking the job's missed entries
up in the other namespaces of its family. Reading their manifests at every job
end would cost a manifest read per namespace and job; instead each namespace's
entry names (``CacheRules.entry_of`` of every path of its newest generation)
are kept here, one file per namespace, as sorted 64-bit hashes:

    <state>/entrynames/<store namespace>
    {"casfs_entrynames": 1, "namespace": ns, "rules": <family@casfs version>,
     "seq": <seq>, "parts": [<manifest digest>, ...], "count": N}\\n
    then N little-endian u64: blake2b-64 of each entry name, sorted, unique

A cached file is used as is while the namespace's newest generation is the
one it names; a newer one whose parts begin with the cached ones (deltas added)
costs only its new parts; any other (a new base, a drop) is read whole. The
file is rebuilt by anyone, any time: a damaged or foreign one is read over.
Lookups are a binary search per name; a 64-bit collision (about 1 in 10^10
for 4,096 names against 400,000) could count one miss as held elsewhere.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import sys
import threading
from array import array
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from casfs.store.generations import NS_RE, GenerationStore, Record
from casfs.util.atomic import write_atomic

log = logging.getLogger(__name__)

FORMAT = 1
MAX_NAMES = 2_000_000  # per namespace: 16 MB of hashes; the rest is not indexed
_HEADER_MAX = 1 << 20


def name_hash(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8", "surrogateescape"),
                                          digest_size=8).digest(), "little")


class EntryNames:
    """The entry names of one generation, as sorted hashes."""

    def __init__(self, hashes: array[int]) -> None:
        self.hashes = hashes

    def __len__(self) -> int:
        return len(self.hashes)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        h = name_hash(name)
        i = bisect.bisect_left(self.hashes, h)
        return i < len(self.hashes) and self.hashes[i] == h

    def holding(self, names: Iterable[str]) -> list[str]:
        """Those of ``names`` this generation holds, in their order."""
        return [n for n in names if n in self]


def _sorted_unique(values: Iterable[int]) -> array[int]:
    return array("Q", sorted(set(values)))


class EntryNameIndex:
    """Entry names of a family's namespaces, cached under ``cache_dir`` (None: in memory).

    ``rules_id`` names the ``entry_of`` rule (a cache made under another is rebuilt).
    """

    def __init__(self, cache_dir: Path | None, gens: GenerationStore, rules_id: str,
                 entry_of: Callable[[str], str | None]) -> None:
        self.cache_dir = cache_dir
        self.gens = gens
        self.rules_id = rules_id
        self.entry_of = entry_of
        self.parts_read = 0  # manifest parts read (the cost: none when the cache is current)
        self._count_lock = threading.Lock()  # namespaces are read several at a time

    def names(self, rec: Record) -> EntryNames:
        """The entry names of generation ``rec`` (raises CasfsError if unreadable)."""
        digests = [p.digest for p in rec.parts]
        cached = self._load(rec.namespace)
        if cached is not None:
            head, hashes = cached
            if head["seq"] == rec.seq and head["parts"] == digests:
                return EntryNames(hashes)
            known = head["parts"]
            if known and digests[:len(known)] == known:
                new = self._hashes(rec.parts[len(known):])
                return self._store(rec, digests, _sorted_unique([*hashes, *new]))
        return self._store(rec, digests, _sorted_unique(self._hashes(rec.parts)))

    def _hashes(self, parts: Iterable[Any]) -> list[int]:
        names: set[str] = set()
        for part in parts:
            with self._count_lock:
                self.parts_read += 1
            for e in self.gens.part_entries(part):
                entry = self.entry_of(e.path)
                if entry is not None and len(names) < MAX_NAMES:
                    names.add(entry)
        return [name_hash(n) for n in names]

    # --- the cache file ----------------------------------------------------------------
    def _path(self, ns: str) -> Path | None:
        # A name from the root: a file name only if it is a namespace's (no "/", no ".").
        return self.cache_dir / ns if self.cache_dir is not None and NS_RE.match(ns) else None

    def _load(self, ns: str) -> tuple[dict[str, Any], array[int]] | None:
        path = self._path(ns)
        if path is None:
            return None
        try:
            data = path.read_bytes()
        except OSError:
            return None
        line, sep, rest = data.partition(b"\n")
        try:
            head = json.loads(line) if sep and len(line) < _HEADER_MAX else None
        except (ValueError, UnicodeDecodeError, RecursionError):
            head = None
        if not (isinstance(head, dict) and head.get("casfs_entrynames") == FORMAT
                and head.get("namespace") == ns and head.get("rules") == self.rules_id
                and isinstance(head.get("seq"), int) and isinstance(head.get("parts"), list)
                and all(isinstance(d, str) for d in head["parts"])
                and head.get("count") == len(rest) // 8 and len(rest) % 8 == 0):
            return None
        hashes = array("Q")
        hashes.frombytes(rest)
        if sys.byteorder != "little":
            hashes.byteswap()
        return head, hashes

    def _store(self, rec: Record, digests: list[str], hashes: array[int]) -> EntryNames:
        path = self._path(rec.namespace)
        if path is not None:
            head = {"casfs_entrynames": FORMAT, "namespace": rec.namespace,
                    "rules": self.rules_id, "seq": rec.seq, "parts": digests,
                    "count": len(hashes)}
            out = array("Q", hashes)
            if sys.byteorder != "little":
                out.byteswap()
            try:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                write_atomic(path, json.dumps(head).encode() + b"\n" + out.tobytes())
            except OSError as e:  # a cache: the answer stands without it
                log.info("entry names of %s not cached: %s", rec.namespace, e)
        return EntryNames(hashes)
