"""Pack objects: many small objects stored as one immutable blob (one request, one inode).

    packs/<2 hex>/<62 hex>     blake3 of the whole pack, which is:

    member 0 | member 1 | ... | index | footer
    member:  exactly what a loose object holds (casfs.store.objects: 16-byte
             header + raw or zstd payload), for one object
    index:   zstd(JSON) {"casfs_pack": 1, "members": [[digest, offset, length], ...]}
    footer:  8 bytes b"CASFPACK" + u64 little-endian offset of the index

A manifest row names where its packed object lives in its extras:
``"pack": [pack_digest, offset, length]`` (docs/format.md). A reader fetches
that byte range and decodes and verifies it exactly like a loose object (the
blake3 of the content must equal the entry's digest), so a pack can never
serve wrong bytes; a missing or damaged pack is a miss (or the loose object,
if one exists). The index lets gc, verify and du see a pack's members without
any manifest.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import blake3
import zstandard

from casfs.errors import CorruptObjectError
from casfs.store.entry import Entry
from casfs.store.objects import DIGEST_RE, ObjectStore, digest_bytes
from casfs.util import atomic

FOOTER = struct.Struct("<8sQ")
PACK_MAGIC = b"CASFPACK"
PACK_VERSION = 1
SMALL_OBJECT = 64 << 10  # objects up to this size go into packs
PACK_TARGET = 1 << 20  # a pack is written once its members reach this size (see below)
MAX_INDEX_BYTES = 64 << 20
# Why 1 MiB packs (python -m bench.s3_store, 700 Triton-like files on SeaweedFS):
# a ranged GET there costs about the pack's size, so first touch ran at 435
# files/s with 1 MiB packs, 289 with 4 MiB and 206 with 16 MiB, and promotion
# was no slower (28 vs 21 MB/s). Still one PUT per ~50 small objects.

Location = tuple[str, int, int]


def pack_key(digest: str) -> str:
    return f"packs/{digest[:2]}/{digest[2:]}"


def parse_location(value: object) -> Location | None:
    """A manifest row's ``pack`` extras as (pack digest, offset, length); None if malformed."""
    if not isinstance(value, list | tuple) or len(value) != 3:
        return None
    pack, off, length = value
    if not isinstance(pack, str) or not DIGEST_RE.match(pack):
        return None
    if type(off) is not int or type(length) is not int or off < 0 or length <= 0:
        return None
    return pack, off, length


class PackWriter:
    """Collect small objects and write them as packs; thread-safe.

    ``add`` returns at once; ``flush`` writes what is buffered and returns the
    location of every object added since the writer was made.
    """

    def __init__(self, store: ObjectStore, target: int = PACK_TARGET) -> None:
        self.store = store
        self.target = target
        self._buf: list[tuple[str, bytes]] = []
        self._size = 0
        self._seen: set[str] = set()
        self.locations: dict[str, Location] = {}
        self.packs_written = 0
        self._lock = threading.Lock()

    def add(self, data: bytes) -> str:
        digest = digest_bytes(data)
        member = self.store.encode(data)
        with self._lock:
            if digest in self._seen:
                return digest  # dedup inside the writer
            self._seen.add(digest)
            self._buf.append((digest, member))
            self._size += len(member)
            if self._size < self.target:
                return digest
            batch, self._buf, self._size = self._buf, [], 0
        self._write(batch)
        return digest

    def flush(self) -> dict[str, Location]:
        with self._lock:
            batch, self._buf, self._size = self._buf, [], 0
        if batch:
            self._write(batch)
        return dict(self.locations)

    def _write(self, batch: list[tuple[str, bytes]]) -> None:
        members: list[tuple[str, int, int]] = []
        off = 0
        for digest, member in batch:
            members.append((digest, off, len(member)))
            off += len(member)
        index = zstandard.ZstdCompressor(level=3).compress(json.dumps(
            {"casfs_pack": PACK_VERSION, "members": [list(m) for m in members]}).encode())
        h = blake3.blake3()
        backend = self.store.backend
        with atomic.staged_file(backend.staging_dir, "pack-", 0o444, sync=False) as (f, tmp):
            for _, member in batch:
                f.write(member)
                h.update(member)
            tail = index + FOOTER.pack(PACK_MAGIC, off)
            f.write(tail)
            h.update(tail)
        pack = h.hexdigest()
        backend.put_if_absent(pack_key(pack), tmp)  # the same bytes twice: same name
        with self._lock:
            for digest, o, length in members:
                self.locations[digest] = (pack, o, length)
            self.packs_written += 1
        self.store.counters.inc("packs_written")


@dataclass(frozen=True, slots=True)
class PackInfo:
    digest: str
    size: int
    members: dict[str, tuple[int, int]]  # digest -> (offset, length)


def read_pack(store: ObjectStore, digest: str) -> tuple[bytes, PackInfo]:
    """The whole pack, checked against its name, and its index (CorruptObjectError if bad)."""
    with store.backend.open(pack_key(digest)) as f:
        raw = f.read()
    if blake3.blake3(raw).hexdigest() != digest:
        raise CorruptObjectError(f"pack {digest}: content does not match its name")
    return raw, parse_index(raw, digest)


def parse_index(raw: bytes, digest: str) -> PackInfo:
    if len(raw) < FOOTER.size:
        raise CorruptObjectError(f"pack {digest}: truncated")
    magic, index_off = FOOTER.unpack(raw[-FOOTER.size:])
    if magic != PACK_MAGIC or index_off > len(raw) - FOOTER.size:
        raise CorruptObjectError(f"pack {digest}: bad footer")
    try:
        doc = json.loads(zstandard.ZstdDecompressor().decompress(
            raw[index_off:-FOOTER.size], max_output_size=MAX_INDEX_BYTES))
        if doc.get("casfs_pack") != PACK_VERSION:
            raise ValueError(f"unknown pack version {doc.get('casfs_pack')!r}")
        members = {}
        for d, off, length in doc["members"]:
            if not DIGEST_RE.match(d) or off < 0 or off + length > index_off:
                raise ValueError("member out of range")
            members[d] = (int(off), int(length))
    except (ValueError, KeyError, TypeError, zstandard.ZstdError) as e:
        raise CorruptObjectError(f"pack {digest}: bad index ({e})") from None
    return PackInfo(digest, len(raw), members)


def iter_packs(store: ObjectStore) -> Iterator[str]:
    """Every well-named pack in the store."""
    for fan in store.backend.list("packs"):
        if len(fan) != 2:
            continue
        for rest in store.backend.list(f"packs/{fan}"):
            if DIGEST_RE.match(fan + rest):
                yield fan + rest


def packs_of(entries: Iterable[Entry]) -> set[str]:
    """The packs that hold some of ``entries``."""
    out = set()
    for e in entries:
        loc = parse_location(e.extras.get("pack")) if e.extras else None
        if loc is not None:
            out.add(loc[0])
    return out


def rewrite_pack(store: ObjectStore, digest: str) -> bool:
    """Write a pack again with its verified bytes (a gc mark then spares it); False if none."""
    if store.backend.info(pack_key(digest)) is None:
        return False
    raw, _ = read_pack(store, digest)
    with atomic.staged_file(store.backend.staging_dir, "pack-", 0o444, sync=False) as (f, tmp):
        f.write(raw)
    store.backend.replace(pack_key(digest), tmp)
    store.counters.inc("packs_rewritten_for_gc")
    return True
