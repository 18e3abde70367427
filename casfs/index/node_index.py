"""The node index: one LMDB environment per node state dir (schema: casfs.index.keyspace).

Open it once per process, after any fork (``NodeIndex.open`` shares the
handle within a process; a handle inherited through fork refuses to work).
The daemon opens it read-write; the CLI may open it read-only at the same time
and sees every committed transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import lmdb

from casfs.index import cachedb, lower, promoted
from casfs.index import keyspace as ks
from casfs.index.lmdbenv import DEFAULT_MAP_SIZE, IndexEnv, scan_prefix, txn_get
from casfs.index.lower import AddResult, LmdbLowerTree
from casfs.index.promoted import PromotedRecord
from casfs.store.entry import Entry

log = logging.getLogger(__name__)


class NodeIndex:
    """Typed access to every part of the node index."""

    def __init__(self, env: IndexEnv) -> None:
        self._env = env

    @classmethod
    def open(
        cls, state_dir: Path, *, map_size: int = DEFAULT_MAP_SIZE, readonly: bool = False
    ) -> NodeIndex:
        """Open ``<state_dir>/index`` (created on the first read-write open).

        Raises UnsupportedFilesystemError if ``state_dir`` is on a network or
        FUSE filesystem, IndexError_ if the index is missing (read-only), has
        another format version, or cannot be opened.
        """
        return cls(IndexEnv.open(Path(state_dir), map_size=map_size, readonly=readonly))

    def take_repaired(self) -> bool:
        """True once if this process opened the index afresh after moving a damaged
        one aside (IndexEnv._repair): the local object cache's accounting went with it."""
        repaired, self._env.repaired = self._env.repaired, False
        return repaired

    def close(self) -> None:
        self._env.close()

    def sync(self) -> None:
        """Make committed changes durable (commits do not fsync; see lmdbenv)."""
        self._env.sync()

    def __enter__(self) -> NodeIndex:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def env(self) -> IndexEnv:
        """The LMDB environment (for the index's own modules)."""
        return self._env

    @property
    def node_id(self) -> str:
        """A uuid created on the first read-write open of this state dir."""
        return self._env.node_id

    @property
    def path(self) -> Path:
        return self._env.path

    @property
    def readonly(self) -> bool:
        return self._env.readonly

    # --- lower entries --------------------------------------------------------

    def add_entries(self, ns: str, seq: int, entries: Iterable[Entry]) -> AddResult:
        """Add generation ``seq``'s files to ``ns`` (idempotent; an existing path is kept)."""
        return lower.add_entries(self._env, ns, seq, entries)

    def lower_tree(self, ns: str, max_seq: int) -> LmdbLowerTree:
        """A LowerTree of ``ns`` holding the nodes added at seq <= ``max_seq``."""
        return LmdbLowerTree(self._env, ns, max_seq)

    def drop_namespace(self, ns: str) -> int:
        """Remove the lower entries and the state of ``ns``; returns the entries removed."""
        n = lower.drop_namespace(self._env, ns)
        self._delete(ks.DB_NSSTATE, ks.check_name(ns, "namespace"))
        return n

    def ns_state(self, ns: str) -> dict[str, Any] | None:
        """What has been ingested for ``ns`` (as stored by ``set_ns_state``), or None."""
        return self._get_json(ks.DB_NSSTATE, ks.check_name(ns, "namespace"))

    def set_ns_state(self, ns: str, state: Mapping[str, Any]) -> None:
        self._put_json(ks.DB_NSSTATE, ks.check_name(ns, "namespace"), state)

    def namespaces(self) -> dict[str, dict[str, Any]]:
        """Every namespace with a recorded state."""
        return self._all_json(ks.DB_NSSTATE)

    # --- promotion state (per namespace) --------------------------------------

    def add_promoted(self, ns: str, entry: Entry) -> None:
        """Record ``entry`` as promoted, pending publication."""
        promoted.add_promoted(self._env, ns, [entry])

    def add_promoted_many(self, ns: str, entries: Iterable[Entry],
                          locations: Mapping[str, promoted.Location] | None = None,
                          root: str = "") -> None:
        """Record several promoted entries, and their objects' pack locations in shared
        root ``root`` (its id), in one transaction."""
        promoted.add_promoted(self._env, ns, entries, locations, root)

    def pack_location(self, root: str, digest: str) -> promoted.Location | None:
        """Where this node's promotion put ``digest`` inside a pack (casfs.store.packs)."""
        return promoted.pack_location(self._env, root, digest)

    def pack_locations(self, root: str, digests: Iterable[str]) -> dict[str, promoted.Location]:
        return promoted.pack_locations(self._env, root, digests)

    def forget_pack_locations(self, root: str, digests: Iterable[str]) -> int:
        return promoted.forget_pack_locations(self._env, root, digests)

    def get_promoted(self, ns: str, path: str) -> PromotedRecord | None:
        return promoted.get_promoted(self._env, ns, path)

    def get_promoted_many(self, ns: str, paths: Iterable[str]) -> dict[str, PromotedRecord]:
        return promoted.get_promoted_many(self._env, ns, paths)

    def forget_promoted(self, ns: str, path: str) -> bool:
        return promoted.forget_promoted(self._env, ns, path)

    def pending(self, ns: str, root: str = "") -> Iterator[Entry]:
        """Promoted entries of ``ns`` not yet published."""
        return promoted.pending(self._env, ns, root)

    def forget_all_promoted(self, ns: str) -> int:
        """Drop every promotion record of ``ns``; returns how many."""
        return promoted.forget_all(self._env, ns)

    def count_pending(self, ns: str) -> int:
        """How many promoted entries of ``ns`` wait for publication (O(pending))."""
        return promoted.count_pending(self._env, ns)

    def iter_promoted(self, ns: str) -> Iterator[PromotedRecord]:
        return promoted.iter_promoted(self._env, ns)

    def mark_published(self, ns: str, items: Iterable[str | Entry], seq: int,
                       root: str | None = None) -> int:
        """Mark records published in ``seq`` (an Entry must still match its record's digest);
        with ``root``, drop the pack locations the published rows now hold."""
        return promoted.mark_published(self._env, ns, items, seq, root)

    # --- counters -------------------------------------------------------------

    def add_counters(self, mount: str, deltas: Mapping[str, int]) -> None:
        """Add ``deltas`` to the counters of ``mount`` in one transaction."""
        mountb = ks.check_name(mount, "mount")
        items = [(ks.counter_key(mountb, k), int(v)) for k, v in deltas.items() if v]
        db = self._env.dbs[ks.DB_COUNTERS]

        def txn_fn(txn: lmdb.Transaction) -> None:
            for key, delta in items:
                old = txn_get(txn, key, db)
                txn.put(key, ks.I64.pack((ks.I64.unpack(old)[0] if old else 0) + delta), db=db)

        if items:
            self._env.write(txn_fn)

    def counters(self, mount: str) -> dict[str, int]:
        prefix = ks.counter_prefix(ks.check_name(mount, "mount"))
        db = self._env.dbs[ks.DB_COUNTERS]

        def txn_fn(txn: lmdb.Transaction) -> dict[str, int]:
            rows = scan_prefix(txn, db, prefix, limit=1 << 20)
            return {ks.dec(k[len(prefix) :]): ks.I64.unpack(v)[0] for k, v in rows}

        return self._env.read(txn_fn)

    # --- object cache accounting ----------------------------------------------

    def cache_bytes(self) -> int:
        """Bytes of the local object cache, as recorded."""
        return cachedb.total_bytes(self._env)

    def cache_get(self, digest: str) -> tuple[int, int] | None:
        """(size, last_access_ns) of a locally cached object, or None."""
        return cachedb.get(self._env, digest)

    # --- JSON records ---------------------------------------------------------

    def _get_json(self, dbname: bytes, key: bytes) -> dict[str, Any] | None:
        db = self._env.dbs[dbname]
        value = self._env.read(lambda txn: txn_get(txn, key, db))
        return None if value is None else ks.unpack_json(value)

    def _put_json(self, dbname: bytes, key: bytes, state: Mapping[str, Any]) -> None:
        db = self._env.dbs[dbname]
        value = ks.pack_json(dict(state))
        self._env.write(lambda txn: txn.put(key, value, db=db))

    def _delete(self, dbname: bytes, key: bytes) -> bool:
        db = self._env.dbs[dbname]
        return bool(self._env.write(lambda txn: txn.delete(key, db=db)))

    def _all_json(self, dbname: bytes) -> dict[str, dict[str, Any]]:
        db = self._env.dbs[dbname]

        def txn_fn(txn: lmdb.Transaction) -> dict[str, dict[str, Any]]:
            return {ks.dec(bytes(k)): ks.unpack_json(bytes(v)) for k, v in txn.cursor(db=db)}

        return self._env.read(txn_fn)
