"""Promotion state of upper files, per namespace (keys in casfs.index.keyspace).

A promoted file is recorded ``pending`` with the digest it was promoted as;
publication marks it ``published`` with the generation seq that contains it.
Promoting the same path again (its content changed) makes it pending again.

Small promoted objects live inside pack objects (casfs.store.packs): where,
is kept node-wide by digest (``packed``), written in the same transaction as
the promoted records of the round, and attached to pending entries as their
``"pack"`` extras so publication names the pack.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import lmdb

from casfs.index import keyspace as ks
from casfs.index.lmdbenv import IndexEnv, scan_prefix, txn_get
from casfs.store.entry import Entry

_BATCH = 1024

Location = tuple[str, int, int]  # pack digest, offset, length (casfs.store.packs)

PromotionState = Literal["pending", "published"]


@dataclass(frozen=True, slots=True)
class PromotedRecord:
    entry: Entry
    state: PromotionState
    published_seq: int | None  # None while pending


def _record(value: bytes) -> PromotedRecord:
    state, raw, size, mode, mtime_ns, seq, path = ks.unpack_promoted(value)
    published = state == ks.STATE_PUBLISHED
    return PromotedRecord(
        Entry(path, raw.hex(), size, mode, mtime_ns),
        "published" if published else "pending",
        seq if published else None,
    )


def add_promoted(env: IndexEnv, ns: str, entries: Iterable[Entry],
                 locations: Mapping[str, Location] | None = None, root: str = "") -> None:
    """Record ``entries`` as promoted and pending, and where ``locations`` (digest ->
    pack location in shared root ``root``) put their objects, in one transaction."""
    nsb = ks.check_name(ns, "namespace")
    items = [
        (ks.promoted_key(nsb, e.path), ks.pack_promoted(
            ks.STATE_PENDING, ks.digest_to_raw(e.digest), e.size, e.mode, e.mtime_ns, 0, e.path,
        ))
        for e in entries
    ]  # fmt: skip
    packed = [(ks.packed_key(root, d), ks.pack_packed(*loc))
              for d, loc in (locations or {}).items()]
    db, pend = env.dbs[ks.DB_PROMOTED], env.dbs[ks.DB_PENDING]
    pdb = env.dbs.get(ks.DB_PACKED)

    def txn_fn(txn: lmdb.Transaction) -> None:
        for key, value in items:
            txn.put(key, value, db=db)
            txn.put(key, b"", db=pend)
        for key, value in packed:
            txn.put(key, value, db=pdb)

    if items or packed:
        env.write(txn_fn)


def pack_location(env: IndexEnv, root: str, digest: str) -> Location | None:
    """Where this node's promotion stored ``digest`` inside a pack of ``root``, if it did."""
    pdb = env.dbs.get(ks.DB_PACKED)
    if pdb is None:
        return None
    key = ks.packed_key(root, digest)
    value = env.read(lambda txn: txn_get(txn, key, pdb))
    return ks.unpack_packed(value) if value is not None else None


def pack_locations(env: IndexEnv, root: str, digests: Iterable[str]) -> dict[str, Location]:
    """``pack_location`` of many digests in one read transaction per batch: the found ones."""
    pdb = env.dbs.get(ks.DB_PACKED)
    if pdb is None:
        return {}
    found = _read_batched(env, pdb, [(d, ks.packed_key(root, d)) for d in digests])
    return {d: ks.unpack_packed(v) for d, v in found.items()}


def _read_batched(env: IndexEnv, db: Any, keys: list[tuple[str, bytes]]) -> dict[str, bytes]:
    """The values of ``keys`` ((name, key) pairs) in ``db``, one read transaction per
    batch (a long transaction would pin old pages): name -> value, the found ones."""
    out: dict[str, bytes] = {}
    for i in range(0, len(keys), _BATCH):

        def txn_fn(txn: lmdb.Transaction, part: list[tuple[str, bytes]] = keys[i:i + _BATCH],
                   ) -> None:
            for name, key in part:
                value = txn.get(key, db=db)
                if value is not None:
                    out[name] = bytes(value)

        env.read(txn_fn)
    return out


def forget_pack_locations(env: IndexEnv, root: str, digests: Iterable[str]) -> int:
    """Drop the pack locations of ``digests`` (their pack is gone); returns how many."""
    pdb = env.dbs.get(ks.DB_PACKED)
    keys = [ks.packed_key(root, d) for d in digests]
    if pdb is None or not keys:
        return 0
    return env.write(lambda txn: sum(bool(txn.delete(k, db=pdb)) for k in keys))


def get_promoted(env: IndexEnv, ns: str, path: str) -> PromotedRecord | None:
    key = ks.promoted_key(ks.check_name(ns, "namespace"), path)
    db = env.dbs[ks.DB_PROMOTED]
    value = env.read(lambda txn: txn_get(txn, key, db))
    if value is None:
        return None
    rec = _record(value)
    return rec if rec.entry.path == path else None  # a long path's key is a hash


def get_promoted_many(env: IndexEnv, ns: str, paths: Iterable[str],
                      ) -> dict[str, PromotedRecord]:
    """``get_promoted`` of many paths, one read transaction per batch: the found ones."""
    nsb = ks.check_name(ns, "namespace")
    found = _read_batched(env, env.dbs[ks.DB_PROMOTED],
                          [(p, ks.promoted_key(nsb, p)) for p in paths])
    out: dict[str, PromotedRecord] = {}
    for path, value in found.items():
        rec = _record(value)
        if rec.entry.path == path:  # a long path's key is a hash
            out[path] = rec
    return out


def forget_promoted(env: IndexEnv, ns: str, path: str) -> bool:
    key = ks.promoted_key(ks.check_name(ns, "namespace"), path)
    db, pend = env.dbs[ks.DB_PROMOTED], env.dbs[ks.DB_PENDING]

    def txn_fn(txn: lmdb.Transaction) -> bool:
        txn.delete(key, db=pend)
        return bool(txn.delete(key, db=db))

    return env.write(txn_fn)


def iter_promoted(env: IndexEnv, ns: str) -> Iterator[PromotedRecord]:
    """All records of ``ns`` in key order, read in short batches."""
    prefix = ks.promoted_prefix(ks.check_name(ns, "namespace"))
    db = env.dbs[ks.DB_PROMOTED]

    def read_batch(after: bytes | None) -> list[tuple[bytes, bytes]]:
        return env.read(lambda txn: scan_prefix(txn, db, prefix, after, _BATCH))

    after: bytes | None = None
    while True:
        batch = read_batch(after)
        for _, value in batch:
            yield _record(value)
        if len(batch) < _BATCH:
            return
        after = batch[-1][0]


def pending(env: IndexEnv, ns: str, root: str = "") -> Iterator[Entry]:
    """The entries of ``ns`` promoted but not yet published (reads only those), with
    their ``"pack"`` extras where promotion put their object in a pack of ``root``."""
    prefix = ks.promoted_prefix(ks.check_name(ns, "namespace"))
    db, pend = env.dbs[ks.DB_PROMOTED], env.dbs[ks.DB_PENDING]
    pdb = env.dbs.get(ks.DB_PACKED)
    tag = ks.packed_key(root, "0" * 64)[:8]
    Row = tuple[bytes, bytes | None, bytes | None]

    def read_batch(after: bytes | None) -> list[Row]:
        def txn_fn(txn: lmdb.Transaction) -> list[Row]:
            keys = [k for k, _ in scan_prefix(txn, pend, prefix, after, _BATCH)]
            out: list[Row] = []
            for k in keys:
                value = txn_get(txn, k, db)
                loc = (txn_get(txn, tag + value[1:1 + 32], pdb)
                       if value is not None and pdb is not None else None)
                out.append((k, value, loc))
            return out

        return env.read(txn_fn)

    after: bytes | None = None
    while batch := read_batch(after):
        for _, value, loc in batch:
            if value is not None:
                state, raw, size, mode, mtime_ns, _, path = ks.unpack_promoted(value)
                if state != ks.STATE_PUBLISHED:  # built at once: no copy per packed entry
                    extras = {"pack": list(ks.unpack_packed(loc))} if loc is not None else None
                    yield Entry(path, raw.hex(), size, mode, mtime_ns, extras)
        after = batch[-1][0]


def count_pending(env: IndexEnv, ns: str) -> int:
    prefix = ks.promoted_prefix(ks.check_name(ns, "namespace"))
    pend = env.dbs[ks.DB_PENDING]

    def txn_fn(txn: lmdb.Transaction) -> int:
        n = 0
        cur = txn.cursor(db=pend)
        if cur.set_range(prefix):
            for key in cur.iternext(values=False):
                if not bytes(key).startswith(prefix):
                    break
                n += 1
        return n

    return env.read(txn_fn)


def mark_published(env: IndexEnv, ns: str, items: Iterable[str | Entry], seq: int,
                   root: str | None = None) -> int:
    """Mark pending records published in generation ``seq``; returns how many changed.

    Given an Entry, the record changes only if it still holds that digest: a
    file re-promoted with new content while a publication ran stays pending.
    Given a bare path, the record changes whatever its digest. With ``root``,
    the pack locations of published Entries with ``"pack"`` extras are dropped
    from ``packed``: the published rows hold them now, so the table stays as
    small as what is pending. A location another pending record still names
    (the same bytes promoted by another namespace of the node meanwhile) is
    kept: without it that record's object looked lost at its publication, and
    at a namespace's final publication nothing promoted it again.
    """
    nsb = ks.check_name(ns, "namespace")
    todo = list(items)
    db, pend = env.dbs[ks.DB_PROMOTED], env.dbs[ks.DB_PENDING]
    pdb = env.dbs.get(ks.DB_PACKED)

    def txn_fn(txn: lmdb.Transaction) -> int:
        n = 0
        drop: set[bytes] = set()  # raw digests whose pack locations may go
        for item in todo:
            path = item if isinstance(item, str) else item.path
            key = ks.promoted_key(nsb, path)
            value = txn_get(txn, key, db)
            if value is None:
                continue
            state, raw, size, mode, mtime_ns, _, rpath = ks.unpack_promoted(value)
            if state != ks.STATE_PENDING or rpath != path:
                continue
            if isinstance(item, Entry) and raw != ks.digest_to_raw(item.digest):
                continue
            new = ks.pack_promoted(ks.STATE_PUBLISHED, raw, size, mode, mtime_ns, seq, rpath)
            txn.put(key, new, db=db)
            txn.delete(key, db=pend)
            n += 1
            if (root is not None and pdb is not None and isinstance(item, Entry)
                    and item.extras and "pack" in item.extras):
                drop.add(raw)
        if drop and root is not None and pdb is not None:
            # The records still pending (this namespace's others, other namespaces'):
            # one scan, only when a location is to go.
            for pkey in txn.cursor(db=pend).iternext(values=False):
                value = txn_get(txn, bytes(pkey), db)
                held = value[1:33] if value is not None else b""
                if held in drop:
                    drop.discard(held)
                    if not drop:
                        break
            for gone in drop:
                txn.delete(ks.packed_key(root, gone.hex()), db=pdb)
        return n

    return env.write(txn_fn)


def forget_all(env: IndexEnv, ns: str) -> int:
    """Drop every promotion record of ``ns`` (its upper files get promoted afresh)."""
    prefix = ks.promoted_prefix(ks.check_name(ns, "namespace"))
    db, pend = env.dbs[ks.DB_PROMOTED], env.dbs[ks.DB_PENDING]

    def txn_fn(txn: lmdb.Transaction) -> int:
        n = 0
        for table in (db, pend):
            cur = txn.cursor(db=table)
            if not cur.set_range(prefix):
                continue
            while bytes(cur.key()).startswith(prefix):
                n += table is db
                if not cur.delete():
                    break
        return n

    return env.write(txn_fn)
