"""Lower entries of each namespace in LMDB, and the LowerTree the view reads.

Ingesting a generation writes its entries once (``add_entries``); serving it
afterwards costs one get per lookup and one prefix scan per directory
listing, so mount-ready time does not depend on the number of files. Keys and
invariants are documented in casfs.index.keyspace.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import lmdb

from casfs.index import keyspace as ks
from casfs.index.lmdbenv import IndexEnv, scan_prefix, txn_get
from casfs.index.tree import DIR, LowerNode, walk
from casfs.store.entry import Entry
from casfs.store.generations import RELOCATE, is_replace
from casfs.util.paths import is_valid_relpath, parent_dirs

log = logging.getLogger(__name__)

_SCAN_BATCH = 512  # children per read transaction: bounded txn length and memory


@dataclass(frozen=True, slots=True)
class AddResult:
    """What ``add_entries`` did: new files, paths already present, entries refused."""

    added: int = 0
    kept: int = 0
    conflicts: int = 0  # a different file already held the path, or blocked a directory
    invalid: int = 0
    replaced: tuple[str, ...] = ()  # replaced paths now holding a newer version


def add_entries(env: IndexEnv, ns: str, seq: int, entries: Iterable[Entry]) -> AddResult:
    """Add the files of generation ``seq`` (idempotent; first writer wins).

    Except for replaced paths (casfs.store.generations.is_replace): their
    entry overrides the row in place. Parts must be added in
    generation order (a record's parts in their order), as ``_ingest`` does.
    """
    nsb = ks.check_name(ns, "namespace")
    todo = list(entries)  # the transaction may be rerun after a map resize
    lower = env.dbs[ks.DB_LOWER]

    def txn_fn(txn: lmdb.Transaction) -> AddResult:
        added = kept = conflicts = invalid = 0
        replaced: list[str] = []
        dirs_ok: set[str] = set()  # directories known to exist with seq_added <= seq
        for e in todo:
            if not is_valid_relpath(e.path):
                invalid += 1
                continue
            if not _ensure_dirs(txn, lower, nsb, seq, parent_dirs(e.path), dirs_ok):
                conflicts += 1
                continue
            key = ks.lower_key(nsb, e.path)
            old = txn_get(txn, key, lower)
            raw = ks.digest_to_raw(e.digest)
            mode = _packed_mode(e)
            if old is None:
                txn.put(key, ks.pack_lower(ks.KIND_FILE, raw, e.size, mode, e.mtime_ns, seq),
                        db=lower)  # fmt: skip
                added += 1
                continue
            kind, odigest, osize, omode, omtime, oseq = ks.unpack_lower(old)
            if kind == ks.KIND_FILE and odigest == raw and (osize == e.size
                                                             or not is_replace(e)):
                kept += 1
                if seq < oseq:  # ingested out of order: visible from the earlier seq
                    txn.put(key, ks.pack_lower(kind, odigest, osize, omode, omtime, seq),
                            db=lower)  # fmt: skip
            elif kind == ks.KIND_FILE and is_replace(e):
                # Keeps its seq_added: the path never disappears between this write
                # and the view's refresh; the view then invalidates the kernel's cache.
                # (The same digest with another size: a wrong row put right.)
                txn.put(key, ks.pack_lower(ks.KIND_FILE, raw, e.size, mode, e.mtime_ns, oseq),
                        db=lower)  # fmt: skip
                replaced.append(e.path)
            else:
                conflicts += 1
        return AddResult(added, kept, conflicts, invalid, tuple(replaced))

    result = env.write(txn_fn)
    if result.conflicts or result.invalid:
        log.debug("namespace %s seq %d: %s", ns, seq, result)
    return result


def _packed_mode(e: Entry) -> int:
    """Permission bits, and the manifest's ``relocate`` count above them (keyspace: lower)."""
    n = (e.extras or {}).get(RELOCATE)
    if type(n) is int and 0 < n <= ks.RELOCATE_MAX:
        return e.mode | (n << ks.RELOCATE_SHIFT)
    return e.mode


def _entry(path: str, raw: bytes, size: int, mode: int, mtime_ns: int) -> Entry:
    n = mode >> ks.RELOCATE_SHIFT
    return Entry(path, raw.hex(), size, mode & 0o7777, mtime_ns,
                 {RELOCATE: n} if n else None)


def _ensure_dirs(
    txn: lmdb.Transaction, lower: Any, nsb: bytes, seq: int, dirs: list[str], ok: set[str]
) -> bool:
    """Create the missing ancestor directories; False if a file stands in the way."""
    changes: list[tuple[bytes, bytes]] = []
    for d in dirs:
        if d in ok:
            continue
        key = ks.lower_key(nsb, d)
        old = txn_get(txn, key, lower)
        if old is None:
            changes.append((key, ks.pack_lower(ks.KIND_DIR, ks.ZERO_DIGEST, 0, 0o755, 0, seq)))
            continue
        kind, _, _, _, _, oseq = ks.unpack_lower(old)
        if kind != ks.KIND_DIR:
            return False
        if seq < oseq:
            changes.append((key, ks.pack_lower(ks.KIND_DIR, ks.ZERO_DIGEST, 0, 0o755, 0, seq)))
    for key, value in changes:  # only once the whole chain is known to be free
        txn.put(key, value, db=lower)
    ok.update(dirs)
    return True


def drop_namespace(env: IndexEnv, ns: str) -> int:
    """Remove every lower entry of ``ns`` (e.g. before re-ingesting it). Returns the count."""
    prefix = ks.check_name(ns, "namespace") + b"\0"
    lower = env.dbs[ks.DB_LOWER]
    total = 0

    def txn_fn(txn: lmdb.Transaction) -> int:
        n = 0
        cur = txn.cursor(db=lower)
        if not cur.set_range(prefix):
            return 0
        while n < 10_000 and bytes(cur.key()).startswith(prefix):
            if not cur.delete():  # delete moves to the next key
                break
            n += 1
        return n

    while n := env.write(txn_fn):  # bounded transactions: readers are never held up long
        total += n
    return total


_MEMO_MAX = 1 << 16  # memoised lower nodes per tree (~100 B each)
_LISTED_MAX = 1 << 12  # memoised directory listings per tree


class LmdbLowerTree:
    """The lower tree of one namespace up to ``max_seq``; satisfies index.tree.LowerTree.

    Every call uses a fresh short read transaction, so entries added after
    the tree was created become visible as soon as their seq is <= max_seq.
    Found nodes are memoised (a FUSE open resolves its path each time: one
    LMDB read saved per warm open) until ``max_seq`` changes: at a fixed
    max_seq a found node cannot change (a replaced path's new version comes
    with a higher seq); absent paths are never memoised, so additions show.
    """

    def __init__(self, env: IndexEnv, ns: str, max_seq: int) -> None:
        self._env = env
        self._ns = ks.check_name(ns, "namespace")
        self._lower = env.dbs[ks.DB_LOWER]
        self.namespace = ns
        self.max_seq = max_seq
        self._memo: dict[str, LowerNode] = {}
        self._listed: dict[str, list[tuple[str, LowerNode]]] = {}
        self._memo_seq = max_seq

    def _node(self, path: str, value: bytes | None) -> LowerNode | None:
        if value is None:
            return None
        kind, raw, size, mode, mtime_ns, seq = ks.unpack_lower(value)
        if seq > self.max_seq:
            return None
        if kind == ks.KIND_DIR:
            return DIR
        return _entry(path, raw, size, mode, mtime_ns)

    def lookup(self, path: str) -> LowerNode | None:
        if path == "":
            return DIR
        if self._memo_seq != self.max_seq:
            self._memo, self._listed, self._memo_seq = {}, {}, self.max_seq
        memo = self._memo
        node = memo.get(path)
        if node is not None:
            return node
        key = ks.lower_key(self._ns, path)
        lower = self._lower
        node = self._node(path, self._env.read(lambda txn: txn_get(txn, key, lower)))
        if node is not None:
            if len(memo) >= _MEMO_MAX:
                memo.clear()
            memo[path] = node
        return node

    def lookup_many(self, paths: list[str]) -> list[LowerNode | None]:
        """``lookup`` of each path, the misses in one read transaction (about half the
        cost per path of single lookups: recording a batch of observed opens)."""
        if self._memo_seq != self.max_seq:
            self._memo, self._listed, self._memo_seq = {}, {}, self.max_seq
        memo = self._memo
        out: list[LowerNode | None] = [DIR if p == "" else memo.get(p) for p in paths]
        miss = [i for i, n in enumerate(out) if n is None]
        if not miss:
            return out
        ns, lower = self._ns, self._lower

        def get(txn: lmdb.Transaction) -> list[bytes | None]:
            return [txn_get(txn, ks.lower_key(ns, paths[i]), lower) for i in miss]

        for i, value in zip(miss, self._env.read(get), strict=True):
            node = out[i] = self._node(paths[i], value)
            if node is not None:
                if len(memo) >= _MEMO_MAX:
                    memo.clear()
                memo[paths[i]] = node
        return out

    def digests_many(self, paths: list[str]) -> list[str | None]:
        """The digest of each path that is a file entry (None: absent, or a directory),
        in one read transaction, building no Entry and memoising nothing: recording a
        batch of opens the kernel served (overlay mode), where new objects would only
        feed the garbage collector."""
        if self._memo_seq != self.max_seq:
            self._memo, self._listed, self._memo_seq = {}, {}, self.max_seq
        memo, ns, lower, max_seq = self._memo, self._ns, self._lower, self.max_seq
        out: list[str | None] = [None] * len(paths)
        miss: list[int] = []
        for i, p in enumerate(paths):
            node = memo.get(p)
            if node is None:
                if p:
                    miss.append(i)
            elif isinstance(node, Entry):
                out[i] = node.digest
        if not miss:
            return out

        def get(txn: lmdb.Transaction) -> list[bytes | None]:
            return [txn_get(txn, ks.lower_key(ns, paths[i]), lower) for i in miss]

        for i, value in zip(miss, self._env.read(get), strict=True):
            if value is not None:
                kind, raw, _, _, _, seq = ks.unpack_lower(value)
                if kind != ks.KIND_DIR and seq <= max_seq:
                    out[i] = raw.hex()
        return out

    def children(self, dirpath: str) -> Iterator[tuple[str, LowerNode]]:
        # Memoised like lookups (a warm reader lists each directory on every run):
        # at a fixed max_seq a directory gains no entry (a new generation's rows
        # carry a higher seq), so the listing read once stays right until it moves.
        if self._memo_seq != self.max_seq:
            self._memo, self._listed, self._memo_seq = {}, {}, self.max_seq
        listed = self._listed.get(dirpath)
        if listed is None:
            listed = list(self._scan(dirpath))
            if len(self._listed) >= _LISTED_MAX:
                self._listed.clear()
            self._listed[dirpath] = listed
        return iter(listed)

    def _scan(self, dirpath: str) -> Iterator[tuple[str, LowerNode]]:
        prefix = ks.lower_dir_prefix(self._ns, dirpath)
        base = f"{dirpath}/" if dirpath else ""
        start: bytes | None = None
        while True:
            batch = self._read_batch(prefix, start)
            for key, value in batch:
                name = ks.dec(key[len(prefix) :])
                node = self._node(base + name, value)
                if node is not None:
                    yield name, node
            if len(batch) < _SCAN_BATCH:
                return
            start = batch[-1][0]

    def _read_batch(self, prefix: bytes, after: bytes | None) -> list[tuple[bytes, bytes]]:
        db = self._lower
        return self._env.read(lambda txn: scan_prefix(txn, db, prefix, after, _SCAN_BATCH))

    def walk(self, dirpath: str = "") -> Iterator[Entry]:
        """Every file under ``dirpath``, depth first, in name order."""
        return walk(self, dirpath)
