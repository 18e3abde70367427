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

Layering: above casfs.store.objects (packs are written and read through an
ObjectStore) and casfs.store.packloc (pack and forward keys, row locations and
forward records read, re-exported here: the object store needs them too).
"""

from __future__ import annotations

import json
import logging
import struct
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import blake3
import zstandard

from casfs.errors import CorruptObjectError, HostileManifestError
from casfs.store.backend import NotRegularFileError
from casfs.store.digests import DIGEST_RE, digest_bytes
from casfs.store.entry import Entry
from casfs.store.objects import ObjectStore
from casfs.store.packloc import (
    FORWARD_PREFIX,
    MAX_FORWARD_BYTES,
    Location,
    forward_key,
    load_forward,
    pack_key,
    parse_location,
)
from casfs.util import atomic, jsonsafe
from casfs.util.crashpoint import crashpoint

log = logging.getLogger(__name__)

FOOTER = struct.Struct("<8sQ")
PACK_MAGIC = b"CASFPACK"
PACK_VERSION = 1
SMALL_OBJECT = 64 << 10  # objects up to this size go into packs
PACK_TARGET = 1 << 20  # a pack is written once its members reach this size (see below)
MAX_INDEX_BYTES = 64 << 20
# zstd level of pack members (loose objects: the store's, 3). On few-KB to 64 KiB
# inputs level 1 compresses ~30-45% faster; stored bytes: real PTX in 32 KB pieces
# -2.2%, the synthetic Triton tree +2.6%, Python source and ELF .so +4-5%.
PACK_LEVEL = 1
# Why 1 MiB packs (python -m bench.s3_store, 700 Triton-like files on SeaweedFS):
# a ranged GET there costs about the pack's size, so first touch ran at 435
# files/s with 1 MiB packs, 289 with 4 MiB and 206 with 16 MiB, and promotion
# was no slower (28 vs 21 MB/s). Still one PUT per ~50 small objects.


class PackWriter:
    """Collect small objects and write them as packs; thread-safe.

    ``add`` returns at once; ``flush`` writes what is buffered and returns the
    location of every object added since the writer was made.
    """

    def __init__(self, store: ObjectStore, target: int = PACK_TARGET, *,
                 fallback: bool = True) -> None:
        self.store = store
        self.target = target
        # A pack that cannot be written (packs/ not writable: a root made before packs
        # by another user) goes out as loose objects instead, so publication never waits
        # on it; False: its members are lost to the caller (``added`` minus the others).
        self.fallback = fallback
        self._buf: list[tuple[str, bytes]] = []
        self._size = 0
        self._seen: set[str] = set()
        self.added: set[str] = set()  # every digest given to ``add`` (written or not)
        self.locations: dict[str, Location] = {}
        self.loose: set[str] = set()  # added, then written loose (the pack failed)
        self.packs_written = 0
        self._lock = threading.Lock()

    def add(self, data: bytes, digest: str | None = None) -> str:
        """Buffer ``data`` (whose blake3 is ``digest``, if the caller has it) for a pack.

        Writes a pack when the buffer reaches the target: an OSError then loses
        that pack's members, which ``flush``'s result lacks (callers check it).
        """
        digest = digest or digest_bytes(data)
        member = self.store.encode(data, PACK_LEVEL)
        with self._lock:
            if digest in self._seen:
                return digest  # dedup inside the writer
            self._seen.add(digest)
            self.added.add(digest)
            self._buf.append((digest, member))
            self._size += len(member)
            if self._size < self.target:
                return digest
            batch, self._buf, self._size = self._buf, [], 0
        self._write(batch)
        return digest

    def add_many(self, items: list[tuple[str, bytes]], threads: int = 1) -> None:
        """``add`` for many (digest, data) at once, compressed in ``threads`` native threads
        (ObjectStore.encode_many); writes each pack as it fills, like ``add``."""
        with self._lock:
            fresh = []
            for digest, data in items:
                if digest not in self._seen:  # dedup inside the writer
                    self._seen.add(digest)
                    self.added.add(digest)
                    fresh.append((digest, data))
        members = self.store.encode_many([d for _, d in fresh], threads, PACK_LEVEL)
        full = []  # packs to write: the lock taken once, not once a member
        with self._lock:
            for (digest, _), member in zip(fresh, members, strict=True):
                self._buf.append((digest, member))
                self._size += len(member)
                if self._size >= self.target:
                    full.append(self._buf)
                    self._buf, self._size = [], 0
        for batch in full:
            self._write(batch)

    def flush(self) -> dict[str, Location]:
        with self._lock:
            batch, self._buf, self._size = self._buf, [], 0
        if batch:
            self._write(batch)
        return dict(self.locations)

    def _write(self, batch: list[tuple[str, bytes]]) -> None:
        try:
            locations = write_pack(self.store, batch)
        except OSError as e:
            if not self.fallback:
                raise
            self._write_loose(batch, e)
            return
        with self._lock:
            self.locations.update(locations)
            self.packs_written += 1

    def _write_loose(self, batch: list[tuple[str, bytes]], why: OSError) -> None:
        """Store a pack's members as loose objects (a member is a loose object's bytes)."""
        global _fallback_logged
        self.store.counters.inc("packs_fallback_loose")
        if not _fallback_logged:
            _fallback_logged = True
            log.warning("cannot write a pack (%s): storing its objects loose instead", why)
        for digest, member in batch:
            self.store.put_stored(digest, member)  # an OSError here: the caller's, as before
            with self._lock:
                self.loose.add(digest)


_fallback_logged = False  # the pack fallback is logged once per process (then counted)


def write_pack(store: ObjectStore, batch: list[tuple[str, bytes]]) -> dict[str, Location]:
    """Write ``batch`` ((digest, member bytes) in order) as one pack; each member's location."""
    members: list[tuple[str, int, int]] = []
    off = 0
    for digest, member in batch:
        members.append((digest, off, len(member)))
        off += len(member)
    index = zstandard.ZstdCompressor(level=3).compress(json.dumps(
        {"casfs_pack": PACK_VERSION, "members": [list(m) for m in members]}).encode())
    body = b"".join(member for _, member in batch)  # one write and one hash, not one a member
    tail = index + FOOTER.pack(PACK_MAGIC, off)
    # Threaded hashing releases the GIL (single-threaded blake3 holds it: the promotion
    # round's reading thread would wait on this packing thread's hash).
    h = blake3.blake3(body, max_threads=blake3.blake3.AUTO)
    h.update(tail)
    backend = store.backend
    with atomic.staged_file(backend.staging_dir, "pack-", 0o444, sync=False) as (f, tmp):
        f.write(body)
        f.write(tail)
    pack = h.hexdigest()
    crashpoint("pack-staged")
    # Create-only under the digest of its whole content: a name never holds a
    # partial pack (staged, then linked or PUT). Durable like objects: the
    # publisher syncs the backend before a record names it.
    if not backend.put_if_absent(pack_key(pack), tmp) and not _sound(store, pack):
        # The same bytes were packed before, and that pack is damaged: as for a loose
        # object, verified bytes under a content-addressed name are a repair, never a
        # change (a re-import of the same files is how an operator heals a root).
        put_pack_bytes(store, pack, body + tail, replace=True)
        store.counters.inc("packs_repaired")
        log.warning("repaired damaged pack %s", pack)
    store.stored(pack_key(pack))
    store.counters.inc("packs_written")
    return {digest: (pack, o, length) for digest, o, length in members}


def _sound(store: ObjectStore, digest: str) -> bool:
    """Whether the pack ``digest`` is there and hashes to its name."""
    try:
        read_pack(store, digest)
    except (CorruptObjectError, OSError):  # damaged, not a regular file, or gone
        return False
    return True


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
    index_off = _footer(raw[-FOOTER.size:], len(raw), digest)
    return _parse_index(raw[index_off:-FOOTER.size], index_off, len(raw), digest)


def read_index(store: ObjectStore, digest: str) -> PackInfo:
    """A pack's index alone (two ranged reads, not the whole pack); CorruptObjectError."""
    key = pack_key(digest)
    info = store.backend.info(key)
    if info is None:
        raise FileNotFoundError(key)
    if info.size < FOOTER.size:
        raise CorruptObjectError(f"pack {digest}: truncated")
    index_off = _footer(store.backend.read_range(key, info.size - FOOTER.size, FOOTER.size),
                        info.size, digest)
    if info.size - FOOTER.size - index_off > MAX_INDEX_BYTES:
        raise CorruptObjectError(f"pack {digest}: index too large")
    index = store.backend.read_range(key, index_off, info.size - FOOTER.size - index_off)
    return _parse_index(index, index_off, info.size, digest)


def _footer(footer: bytes, size: int, digest: str) -> int:
    if len(footer) != FOOTER.size:
        raise CorruptObjectError(f"pack {digest}: truncated")
    magic, index_off = FOOTER.unpack(footer)
    if magic != PACK_MAGIC or index_off > size - FOOTER.size:
        raise CorruptObjectError(f"pack {digest}: bad footer")
    return int(index_off)


def _parse_index(index: bytes, index_off: int, size: int, digest: str) -> PackInfo:
    try:
        doc = jsonsafe.parse(zstandard.ZstdDecompressor().decompress(
            index, max_output_size=MAX_INDEX_BYTES), "index")
        if doc.get("casfs_pack") != PACK_VERSION:
            raise ValueError(f"unknown pack version {doc.get('casfs_pack')!r}")
        members = {}
        for d, off, length in doc["members"]:
            # ints only: int() of -Infinity (Python's json reads it) overflowed
            if (not DIGEST_RE.match(d) or type(off) is not int or type(length) is not int
                    or off < 0 or length < 0 or off + length > index_off):
                raise ValueError("member out of range")
            members[d] = (int(off), int(length))
    except (ValueError, KeyError, TypeError, AttributeError, HostileManifestError,
            zstandard.ZstdError) as e:  # AttributeError: valid JSON, not an object
        raise CorruptObjectError(f"pack {digest}: bad index ({e})") from None
    return PackInfo(digest, size, members)


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


def rewrite_pack(store: ObjectStore, digest: str) -> bytes | None:
    """Write a pack again with its verified bytes (a gc mark then spares it); its bytes,
    None if there is no such pack."""
    if store.backend.info(pack_key(digest)) is None:
        return None
    raw, _ = read_pack(store, digest)
    put_pack_bytes(store, digest, raw, replace=True)
    store.counters.inc("packs_rewritten_for_gc")
    return raw


def put_pack_bytes(store: ObjectStore, digest: str, raw: bytes, *, replace: bool) -> None:
    """Store ``raw`` (a whole pack, verified by the caller) under its digest."""
    with atomic.staged_file(store.backend.staging_dir, "pack-", 0o444, sync=False) as (f, tmp):
        f.write(raw)
    if replace:
        store.backend.replace(pack_key(digest), tmp)
    else:
        store.backend.put_if_absent(pack_key(digest), tmp)


# --- repacking (gc) ----------------------------------------------------------
#
#     repacked/<2 hex>/<62 hex>   zstd(JSON) {"casfs_repacked": 1, "pack": old pack digest,
#                                             "members": {digest: [new pack, offset, length]}}
#
# gc rewrites a pack most of whose bytes no kept entry uses: the live members
# go into a new pack and this forward record says where. Manifests are
# immutable, so rows keep naming the old pack; a reader that finds it gone
# follows the forward (each hop verified like any read: the member's blake3 must
# equal the row's digest, so a forward can only cause a miss, never wrong bytes).

REPACK_BELOW = 0.5  # repack when less than this share of a pack's member bytes is live


def write_forward(store: ObjectStore, pack: str, moved: dict[str, Location]) -> bool:
    """Create the forward record of ``pack`` (create-only); False if it exists."""
    doc = {"casfs_repacked": 1, "pack": pack,
           "members": {d: list(loc) for d, loc in sorted(moved.items())}}
    data = zstandard.ZstdCompressor(level=3).compress(json.dumps(doc).encode())
    return store.backend.create_exclusive(forward_key(pack), data)


def read_forward(store: ObjectStore, pack: str) -> dict[str, Location] | None:
    """digest -> new location of ``pack``'s moved members; None if there is no (sound) forward."""
    return load_forward(store.backend, pack)


def forwarded(store: ObjectStore, pack: str, digest: str) -> Location | None:
    """Where ``digest`` went when gc repacked ``pack`` (cached per pack), or None."""
    return store.forwarded(pack, digest)


def iter_forwards(store: ObjectStore) -> Iterator[str]:
    """The digest of every pack that has a forward record."""
    for fan in store.backend.list(FORWARD_PREFIX):
        if len(fan) != 2:
            continue
        for rest in store.backend.list(f"{FORWARD_PREFIX}/{fan}"):
            if DIGEST_RE.match(fan + rest):
                yield fan + rest


def rewrite_forward(store: ObjectStore, pack: str) -> bool:
    """Write a forward record again with the same bytes (a gc mark then spares it)."""
    key = forward_key(pack)
    try:
        with store.backend.open(key) as f:
            raw = f.read(MAX_FORWARD_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError, NotRegularFileError):
        return False
    with atomic.staged_file(store.backend.staging_dir, "fwd-", 0o444, sync=False) as (f, tmp):
        f.write(raw)
    store.backend.replace(key, tmp)
    return True


def repack(store: ObjectStore, pack: str, keep: set[str]) -> dict[str, Location]:
    """Copy ``pack``'s members in ``keep`` (verified) into a new pack, then create its
    forward record; the moved members' new locations (the existing forward's, if another
    gc made one first). The old pack stays until gc's two phases remove it."""
    raw, info = read_pack(store, pack)  # the whole pack, checked against its name
    batch = []
    for d, (off, length) in sorted(info.members.items(), key=lambda kv: kv[1][0]):
        if d in keep:
            member = raw[off:off + length]
            store.verify_stored(d, member)  # a damaged member is not carried forward
            batch.append((d, member))
    moved = write_pack(store, batch) if batch else {}
    if not write_forward(store, pack, moved):
        return read_forward(store, pack) or {}
    store.forwards[pack] = moved
    store.counters.inc("packs_repacked")
    return moved
