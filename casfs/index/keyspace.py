"""The LMDB keyspace of the node index: the one reference for its on-disk schema.

One LMDB environment per node state dir, at ``<state_dir>/index``. Strings are
encoded UTF-8 with ``surrogateescape`` (file names that are not UTF-8 survive).
Integers are little-endian unless marked BE (big-endian where key order must
be numeric order). LMDB keys are at most 511 bytes, so namespace and mount
names are limited to ``NAME_MAX_BYTES`` and long paths inside keys are replaced
by a hash (``encode_path``); the full path is always recoverable.

Named databases
---------------

``meta``
    ``format_version`` -> ASCII decimal. Checked on every open: a missing
    version in a non-empty environment, or any version not in
    ``READABLE_VERSIONS``, is refused. Version 1 (no ``packed`` database) is
    upgraded to 2 by the first read-write open (the database is created
    empty: nothing else changed); a read-only open reads it as it is. A
    version 1 casfs refuses a version 2 index (it would not see the pack
    locations of pending promotions).
    ``node_id`` -> ASCII uuid4 hex, created on the first read-write open.
    ``objcache_bytes`` -> u64: sum of ``size`` over all ``objects`` records.

``lower``  (the read-only lower tree of every namespace ingested on this node)
    key   ``ns \\0 encode_path(parent_dir) \\0 name``; top-level entries have
          parent_dir ''. The root '' itself is implicit (always a directory).
    value ``LOWER_NODE``: kind u8 (1 file, 2 dir), digest 32 raw bytes (zero for
          dirs), size u64, mode u32, mtime_ns i64, seq_added u64. ``mode``'s
          low 16 bits are the permission bits; its high 16 bits hold the
          manifest row's ``relocate`` count (a path-bearing file stored
          path-free: how many paths the view writes back), 0 for others.
    Invariants: every file's ancestor directories exist as kind-2 nodes; a
    path holds one node (first writer wins: a later different file, or a
    file where a directory is, is ignored); a directory's seq_added is the
    smallest seq_added of the nodes added through it, so a tree filtered by
    ``seq_added <= max_seq`` is closed under "parent of". Lookup is one get;
    listing a directory is one prefix range scan, independent of tree size.

``nsstate``
    key ``ns`` -> JSON object: what has been ingested into ``lower`` for the
    namespace (generation seq, manifest object digests, entry counts). Owned
    by the ingesting code; the index does not interpret it.

``mounts``  (reserved: always empty)
    Created by every read-write open, never written or read (it was meant
    for per-mount state, which nothing ever used). It stays in ``ALL_DBS``:
    a read-only open needs every database listed there, so an index without
    it would be refused ("incomplete") by releases that list it.

``promoted``  (promotion state of upper files, per namespace)
    key   ``ns \\0 encode_path(path, PROMOTED_PATH_INLINE_MAX)``
    value ``PROMOTED`` header: state u8 (1 pending, 2 published), digest 32
          raw bytes, size u64, mode u32, mtime_ns i64, published_seq u64 (0
          while pending); followed by the full path (UTF-8).

``pending``  (the promoted records not yet published: what publication reads)
    key   the same key as in ``promoted`` -> empty. Present exactly while the
          ``promoted`` record's state is pending, so publication and status
          cost O(pending), not O(everything ever promoted).

``packed``  (version 2: where promoted objects live inside pack objects, node-wide)
    key   root tag 8 bytes (blake3 of the shared root's id: a node moved to
          another root must not name the first root's packs) + digest 32 raw
          bytes -> ``PACKED``: pack digest 32 raw bytes, offset
          u64, length u64 (the member's stored bytes in ``packs/<pack>``,
          casfs.store.packs). Written in the promotion round that wrote the
          pack (after the pack is in the root) or that found the object
          already packed. A pending ``promoted`` record whose digest is here is
          published with the ``"pack"`` extras; dedup and lazy fetch read it
          too. An entry whose pack is gone (gc) is deleted by the publisher, and
          so is one whose record was published (the manifest row holds it):
          the table holds about what is pending.

``counters``
    key ``mount \\0 counter name`` -> i64. Only ever changed by increments
    inside a write transaction, so concurrent processes never lose counts.

``objects``  (the local object cache, for LRU eviction under a byte cap)
    key digest 32 raw bytes -> ``OBJECT``: size u64, last_access_ns u64.

``objlru``
    key last_access_ns u64 BE + digest 32 raw bytes -> empty. Exactly one key
    per ``objects`` record (same last_access_ns), so a cursor walk from the
    start visits objects least recently used first.
"""

from __future__ import annotations

import functools
import json
import struct
from typing import Any

from blake3 import blake3

from casfs.errors import IndexError_

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: before ``packed``; upgraded at a read-write open

DB_META = b"meta"
DB_LOWER = b"lower"
DB_NSSTATE = b"nsstate"
DB_MOUNTS = b"mounts"  # reserved, always empty (see above); kept for older releases
DB_PROMOTED = b"promoted"
DB_PENDING = b"pending"
DB_COUNTERS = b"counters"
DB_OBJECTS = b"objects"
DB_OBJLRU = b"objlru"
DB_PACKED = b"packed"
ALL_DBS = (
    DB_META, DB_LOWER, DB_NSSTATE, DB_MOUNTS, DB_PROMOTED, DB_PENDING, DB_COUNTERS, DB_OBJECTS,
    DB_OBJLRU, DB_PACKED,
)  # fmt: skip
NEW_IN = {DB_PACKED: 2}  # databases a version-1 index lacks

META_FORMAT_VERSION = b"format_version"
META_NODE_ID = b"node_id"
META_OBJCACHE_BYTES = b"objcache_bytes"

NAME_MAX_BYTES = 128  # namespace, mount and counter names
PARENT_INLINE_MAX = 120  # 128 + 1 + 120 + 1 + 255 (NAME_MAX) <= 511
PROMOTED_PATH_INLINE_MAX = 380  # 128 + 1 + 380 <= 511
_HASHED = b"\x01"  # cannot start a valid path (control characters are refused)

RELOCATE_SHIFT = 16  # mode bits above this: the relocate count (see ``lower``)
RELOCATE_MAX = 0xFFFF
KIND_FILE = 1
KIND_DIR = 2
STATE_PENDING = 1
STATE_PUBLISHED = 2

LOWER_NODE = struct.Struct("<B32sQIqQ")
PROMOTED = struct.Struct("<B32sQIqQ")
OBJECT = struct.Struct("<QQ")
PACKED = struct.Struct("<32sQQ")
U64 = struct.Struct("<Q")
I64 = struct.Struct("<q")
U64_BE = struct.Struct(">Q")
ZERO_DIGEST = bytes(32)


def enc(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


def dec(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def check_name(name: str, what: str = "name") -> bytes:
    """Encode a namespace/mount/counter name, refusing what cannot be a key part."""
    b = enc(name)
    if not b or b"\0" in b or len(b) > NAME_MAX_BYTES:
        raise IndexError_(f"invalid {what} {name!r:.80}: must be 1-{NAME_MAX_BYTES} bytes, no NUL")
    return b


def encode_path(path: str, inline_max: int = PARENT_INLINE_MAX) -> bytes:
    """A path as a key part: itself if short, else a marker byte and a 16-byte blake3 hash."""
    b = enc(path)
    if len(b) <= inline_max:
        return b
    return _HASHED + blake3(b).digest()[:16]


def digest_to_raw(digest: str) -> bytes:
    try:
        raw = bytes.fromhex(digest)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise IndexError_(f"not a blake3-256 hex digest: {digest!r:.80}")
    return raw


def raw_to_digest(raw: bytes) -> str:
    return raw.hex()


# --- lower ---------------------------------------------------------------


def lower_dir_prefix(ns: bytes, dirpath: str) -> bytes:
    """Prefix of the keys of the direct children of ``dirpath`` ('' is the root)."""
    return ns + b"\0" + encode_path(dirpath) + b"\0"


def lower_key(ns: bytes, path: str) -> bytes:
    parent, _, name = path.rpartition("/")
    return lower_dir_prefix(ns, parent) + enc(name)


def pack_lower(
    kind: int, digest: bytes, size: int, mode: int, mtime_ns: int, seq_added: int
) -> bytes:
    return LOWER_NODE.pack(kind, digest, size, mode, mtime_ns, seq_added)


def unpack_lower(value: bytes) -> tuple[int, bytes, int, int, int, int]:
    """(kind, raw digest, size, mode, mtime_ns, seq_added)."""
    kind, digest, size, mode, mtime_ns, seq = LOWER_NODE.unpack(value)
    return kind, digest, size, mode, mtime_ns, seq


# --- promoted ------------------------------------------------------------


def promoted_prefix(ns: bytes) -> bytes:
    return ns + b"\0"


def promoted_key(ns: bytes, path: str) -> bytes:
    return promoted_prefix(ns) + encode_path(path, PROMOTED_PATH_INLINE_MAX)


def pack_promoted(
    state: int, digest: bytes, size: int, mode: int, mtime_ns: int, seq: int, path: str
) -> bytes:
    return PROMOTED.pack(state, digest, size, mode, mtime_ns, seq) + enc(path)


def unpack_promoted(value: bytes) -> tuple[int, bytes, int, int, int, int, str]:
    """(state, raw digest, size, mode, mtime_ns, published_seq, path)."""
    state, digest, size, mode, mtime_ns, seq = PROMOTED.unpack_from(value)
    return state, digest, size, mode, mtime_ns, seq, dec(value[PROMOTED.size :])


# --- packed --------------------------------------------------------------


def packed_key(root_id: str, digest: str) -> bytes:
    return _root_tag(root_id) + digest_to_raw(digest)


@functools.lru_cache(maxsize=64)
def _root_tag(root_id: str) -> bytes:
    return blake3(enc(root_id)).digest()[:8]  # once per root, not once per object


def pack_packed(pack: str, offset: int, length: int) -> bytes:
    return PACKED.pack(digest_to_raw(pack), offset, length)


def unpack_packed(value: bytes) -> tuple[str, int, int]:
    """(pack digest hex, offset, length)."""
    pack, off, length = PACKED.unpack(value)
    return raw_to_digest(pack), off, length


# --- counters ------------------------------------------------------------


def counter_prefix(mount: bytes) -> bytes:
    return mount + b"\0"


def counter_key(mount: bytes, name: str) -> bytes:
    return counter_prefix(mount) + check_name(name, "counter name")


# --- objects / objlru ----------------------------------------------------


def lru_key(last_access_ns: int, raw_digest: bytes) -> bytes:
    return U64_BE.pack(last_access_ns) + raw_digest


def unpack_lru_key(key: bytes) -> tuple[int, bytes]:
    return U64_BE.unpack_from(key)[0], key[8:]


# --- JSON values ---------------------------------------------------------


def pack_json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def unpack_json(value: bytes) -> dict[str, Any]:
    obj = json.loads(value)
    if not isinstance(obj, dict):
        raise IndexError_("index holds a JSON value that is not an object")
    return obj
