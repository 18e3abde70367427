"""Promotion state of upper files, per mount (keys in casfs.index.keyspace).

A promoted file is recorded ``pending`` with the digest it was promoted as;
publication marks it ``published`` with the generation seq that contains it.
Promoting the same path again (its content changed) makes it pending again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

import lmdb

from casfs.index import keyspace as ks
from casfs.index.lmdbenv import IndexEnv, scan_prefix, txn_get
from casfs.store.entry import Entry

_BATCH = 1024

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


def add_promoted(env: IndexEnv, mount: str, entries: Iterable[Entry]) -> None:
    """Record ``entries`` as promoted and pending, in one transaction (one disk sync)."""
    mountb = ks.check_name(mount, "mount")
    items = [
        (ks.promoted_key(mountb, e.path), ks.pack_promoted(
            ks.STATE_PENDING, ks.digest_to_raw(e.digest), e.size, e.mode, e.mtime_ns, 0, e.path,
        ))
        for e in entries
    ]  # fmt: skip
    db, pend = env.dbs[ks.DB_PROMOTED], env.dbs[ks.DB_PENDING]

    def txn_fn(txn: lmdb.Transaction) -> None:
        for key, value in items:
            txn.put(key, value, db=db)
            txn.put(key, b"", db=pend)

    if items:
        env.write(txn_fn)


def get_promoted(env: IndexEnv, mount: str, path: str) -> PromotedRecord | None:
    key = ks.promoted_key(ks.check_name(mount, "mount"), path)
    db = env.dbs[ks.DB_PROMOTED]
    value = env.read(lambda txn: txn_get(txn, key, db))
    if value is None:
        return None
    rec = _record(value)
    return rec if rec.entry.path == path else None  # a long path's key is a hash


def forget_promoted(env: IndexEnv, mount: str, path: str) -> bool:
    key = ks.promoted_key(ks.check_name(mount, "mount"), path)
    db, pend = env.dbs[ks.DB_PROMOTED], env.dbs[ks.DB_PENDING]

    def txn_fn(txn: lmdb.Transaction) -> bool:
        txn.delete(key, db=pend)
        return bool(txn.delete(key, db=db))

    return env.write(txn_fn)


def iter_promoted(env: IndexEnv, mount: str) -> Iterator[PromotedRecord]:
    """All records of ``mount`` in key order, read in short batches."""
    prefix = ks.promoted_prefix(ks.check_name(mount, "mount"))
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


def pending(env: IndexEnv, mount: str) -> Iterator[Entry]:
    """The entries of ``mount`` promoted but not yet published (reads only those)."""
    prefix = ks.promoted_prefix(ks.check_name(mount, "mount"))
    db, pend = env.dbs[ks.DB_PROMOTED], env.dbs[ks.DB_PENDING]

    def read_batch(after: bytes | None) -> list[tuple[bytes, bytes | None]]:
        def txn_fn(txn: lmdb.Transaction) -> list[tuple[bytes, bytes | None]]:
            keys = [k for k, _ in scan_prefix(txn, pend, prefix, after, _BATCH)]
            return [(k, txn_get(txn, k, db)) for k in keys]

        return env.read(txn_fn)

    after: bytes | None = None
    while batch := read_batch(after):
        for _, value in batch:
            if value is not None:
                rec = _record(value)
                if rec.state == "pending":
                    yield rec.entry
        after = batch[-1][0]


def count_pending(env: IndexEnv, mount: str) -> int:
    prefix = ks.promoted_prefix(ks.check_name(mount, "mount"))
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


def mark_published(env: IndexEnv, mount: str, items: Iterable[str | Entry], seq: int) -> int:
    """Mark pending records published in generation ``seq``; returns how many changed.

    Given an Entry, the record changes only if it still holds that digest: a
    file re-promoted with new content while a publication ran stays pending.
    Given a bare path, the record changes whatever its digest.
    """
    mountb = ks.check_name(mount, "mount")
    todo = list(items)
    db, pend = env.dbs[ks.DB_PROMOTED], env.dbs[ks.DB_PENDING]

    def txn_fn(txn: lmdb.Transaction) -> int:
        n = 0
        for item in todo:
            path = item if isinstance(item, str) else item.path
            key = ks.promoted_key(mountb, path)
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
        return n

    return env.write(txn_fn)


def forget_all(env: IndexEnv, mount: str) -> int:
    """Drop every promotion record of ``mount`` (its upper files get promoted afresh)."""
    prefix = ks.promoted_prefix(ks.check_name(mount, "mount"))
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
