"""Accounting of the local object cache in the node index (keys in casfs.index.keyspace).

Every process that fills or uses the cache records it here, so the LRU order
and the byte total are shared by the daemon and ``casfs run`` on one node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lmdb

from casfs.index import keyspace as ks
from casfs.index.lmdbenv import IndexEnv, txn_get


def _dbs(env: IndexEnv) -> tuple[Any, Any, Any]:
    return env.dbs[ks.DB_OBJECTS], env.dbs[ks.DB_OBJLRU], env.dbs[ks.DB_META]


def _add_total(txn: lmdb.Transaction, meta: Any, delta: int) -> None:
    if not delta:
        return
    old = txn_get(txn, ks.META_OBJCACHE_BYTES, meta)
    total = (ks.U64.unpack(old)[0] if old else 0) + delta
    txn.put(ks.META_OBJCACHE_BYTES, ks.U64.pack(max(total, 0)), db=meta)


def _upsert(env: IndexEnv, txn: lmdb.Transaction, raw: bytes, size: int, ts: int) -> None:
    objects, lru, meta = _dbs(env)
    old = txn_get(txn, raw, objects)
    delta = size
    if old is not None:
        osize, ots = ks.OBJECT.unpack(old)
        if ts <= ots and osize == size:
            return
        ts = max(ts, ots)
        txn.delete(ks.lru_key(ots, raw), db=lru)
        delta = size - osize
    txn.put(raw, ks.OBJECT.pack(size, ts), db=objects)
    txn.put(ks.lru_key(ts, raw), b"", db=lru)
    _add_total(txn, meta, delta)


def record(env: IndexEnv, touches: Mapping[str, tuple[int, int]]) -> None:
    """Record objects as present: digest -> (size, last_access_ns); newer times win."""
    items = [(ks.digest_to_raw(d), size, ts) for d, (size, ts) in touches.items()]
    if not items:
        return

    def txn_fn(txn: lmdb.Transaction) -> None:
        for raw, size, ts in items:
            _upsert(env, txn, raw, size, ts)

    env.write(txn_fn)


def get(env: IndexEnv, digest: str) -> tuple[int, int] | None:
    """(size, last_access_ns) of a cached object, or None."""
    raw = ks.digest_to_raw(digest)
    objects = env.dbs[ks.DB_OBJECTS]
    value = env.read(lambda txn: txn_get(txn, raw, objects))
    return None if value is None else ks.OBJECT.unpack(value)


def remove(env: IndexEnv, digest: str, if_last_access: int | None = None) -> int | None:
    """Forget an object; its size, or None if absent or touched since ``if_last_access``."""
    raw = ks.digest_to_raw(digest)
    objects, lru, meta = _dbs(env)

    def txn_fn(txn: lmdb.Transaction) -> int | None:
        value = txn_get(txn, raw, objects)
        if value is None:
            return None
        size, ts = ks.OBJECT.unpack(value)
        if if_last_access is not None and ts != if_last_access:
            return None
        txn.delete(raw, db=objects)
        txn.delete(ks.lru_key(ts, raw), db=lru)
        _add_total(txn, meta, -size)
        return int(size)

    return env.write(txn_fn)


def oldest(env: IndexEnv, limit: int, after: bytes | None = None) -> list[tuple[bytes, str, int]]:
    """Up to ``limit`` (lru key, digest, last_access_ns), least recently used first."""
    lru = env.dbs[ks.DB_OBJLRU]

    def txn_fn(txn: lmdb.Transaction) -> list[tuple[bytes, str, int]]:
        cur = txn.cursor(db=lru)
        positioned = cur.set_range(after) if after else cur.first()
        if not positioned:
            return []
        if after is not None and cur.key() == after and not cur.next():
            return []
        out: list[tuple[bytes, str, int]] = []
        for key in cur.iternext(keys=True, values=False):
            if len(out) >= limit:
                break
            ts, raw = ks.unpack_lru_key(bytes(key))
            out.append((bytes(key), raw.hex(), ts))
        return out

    return env.read(txn_fn)


def total_bytes(env: IndexEnv) -> int:
    meta = env.dbs[ks.DB_META]
    value = env.read(lambda txn: txn_get(txn, ks.META_OBJCACHE_BYTES, meta))
    return int(ks.U64.unpack(value)[0]) if value else 0
