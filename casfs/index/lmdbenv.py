"""The LMDB environment of the node index: opening, transactions, map growth.

Rules this module enforces (from LMDB's documentation):

* One environment per process and path: opening the same environment twice
  in one process breaks LMDB's locking (closing one handle drops the other's
  POSIX locks). ``IndexEnv.open`` therefore shares one handle per path,
  reference counted.
* Never across fork: a child must open the index again. Using a handle
  inherited through fork raises IndexError_.
* Not on network or FUSE filesystems (checked before opening).
* Readers left behind by crashed processes are cleared at open
  (``reader_check``), otherwise they pin old pages forever.
* The map grows instead of failing: a write that hits MapFullError is
  aborted, the map size doubled, and the write function run again. Changing
  the map size invalidates every transaction of the process, so every
  transaction holds a shared lock and resizing takes it exclusively. When
  another process grew the map, a transaction begin raises MapResizedError
  and the new size is adopted the same way.

Transactions are functions (``read(fn)``, ``write(fn)``) so they can be rerun
after a resize: ``fn`` must have no effects outside the transaction and must
not start another transaction. Read
transactions are short (one per call): with py-lmdb they cost about a
microsecond, they always see the latest commit, and they never pin old pages
the way a long-lived per-thread transaction would.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import lmdb

from casfs.errors import IndexError_
from casfs.index import keyspace as ks
from casfs.util.fsinfo import check_local_fs

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_MAP_SIZE = 1 << 30  # address space only: the file grows as pages are used
MAX_READERS = 1024  # FUSE worker threads + CLI readers, each holding a slot briefly
_MAX_GROWTHS = 16


class _SharedLock:
    """Many holders of the shared side, or one of the exclusive side.

    Writer-preferring: once a resize waits, new shared holders wait too, or a
    steady stream of FUSE lookups would starve it. So the shared side must
    never be taken twice by one thread (transaction functions must not call
    ``read``/``write``).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._shared = 0
        self._exclusive = False
        self._exclusive_waiting = 0

    def acquire_shared(self) -> None:
        with self._cond:
            while self._exclusive or self._exclusive_waiting:
                self._cond.wait()
            self._shared += 1

    def release_shared(self) -> None:
        with self._cond:
            self._shared -= 1
            if not self._shared:
                self._cond.notify_all()

    def acquire_exclusive(self) -> None:
        with self._cond:
            self._exclusive_waiting += 1
            try:
                while self._exclusive or self._shared:
                    self._cond.wait()
            finally:
                self._exclusive_waiting -= 1
            self._exclusive = True

    def release_exclusive(self) -> None:
        with self._cond:
            self._exclusive = False
            self._cond.notify_all()


class _Truncated(Exception):
    """data.mdb is shorter than its meta page says (a system crash under sync=False)."""


# What says the index's file is damaged, not the environment (a lock, a full disk).
_DAMAGE = (lmdb.InvalidError, lmdb.CorruptedError, lmdb.PageNotFoundError, _Truncated)

_registry_lock = threading.Lock()
_registry: dict[str, IndexEnv] = {}


def index_path(state_dir: Path) -> Path:
    """Where a node's index lives in its state dir (absent: nothing was indexed here)."""
    return Path(state_dir) / "index"


class IndexEnv:
    """One open LMDB environment with its named databases."""

    def __init__(self, env: lmdb.Environment, path: Path, readonly: bool) -> None:
        self.env = env
        self.path = path
        self.readonly = readonly
        self.dbs: dict[bytes, Any] = {}
        self.node_id = ""
        self._pid = os.getpid()
        self._lock = _SharedLock()
        self._write_lock = threading.Lock()
        self._refs = 1
        self.repaired = False  # opened afresh after moving a damaged one aside

    @classmethod
    def open(cls, state_dir: Path, *, map_size: int, readonly: bool) -> IndexEnv:
        """The process's handle on ``<state_dir>/index`` (shared if already open)."""
        path = index_path(state_dir)
        key = os.path.realpath(path)
        with _registry_lock:
            existing = _registry.get(key)
            if existing is not None and existing._pid == os.getpid():
                if existing.readonly and not readonly:
                    raise IndexError_(
                        f"node index {path} is already open read-only in this process"
                    )
                existing._refs += 1
                return existing
            check_local_fs(state_dir, "node state dir")
            opened = cls._open_new(path, map_size, readonly)
            _registry[key] = opened
            return opened

    @classmethod
    def _open_new(cls, path: Path, map_size: int, readonly: bool) -> IndexEnv:
        try:
            return cls._open_env(path, map_size, readonly)
        except IndexError_ as e:
            if readonly or not isinstance(e.__cause__, _DAMAGE):
                raise
        return cls._repair(path, map_size)

    @classmethod
    def _repair(cls, path: Path, map_size: int) -> IndexEnv:
        """A damaged index (a node's power loss under ``sync=False``, a bad disk) is
        moved aside and started afresh, once, under a lock other processes of the
        node take too: everything in it can be rebuilt or redone (upper files are
        promoted again at start, lower entries re-ingested). Without this the node
        served only private caches until an operator stepped in."""
        import fcntl

        lock_fd = os.open(path.parent / "index.repair.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                          0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            try:  # another process of the node may have repaired it meanwhile
                return cls._open_env(path, map_size, False)
            except IndexError_ as e:
                if not isinstance(e.__cause__, _DAMAGE):
                    raise
                stamp = time.strftime("%Y%m%dT%H%M%S")
                aside = path.parent / f"index.damaged-{stamp}-{os.getpid()}"
                os.rename(path, aside)
                log.error("node index %s is damaged (%s): moved to %s, starting a fresh one "
                          "(this node's unpublished files are promoted again)", path,
                          e.__cause__, aside)
            fresh = cls._open_env(path, map_size, False)
            fresh.repaired = True
            return fresh
        finally:
            os.close(lock_fd)

    @classmethod
    def _open_env(cls, path: Path, map_size: int, readonly: bool) -> IndexEnv:
        if readonly and not (path / "data.mdb").exists():
            raise IndexError_(f"no node index at {path} (no daemon or 'casfs run' has used it yet)")
        if not readonly:
            path.mkdir(parents=True, exist_ok=True)
        try:
            env = lmdb.open(
                str(path),
                map_size=map_size,
                max_dbs=len(ks.ALL_DBS) + 4,
                max_readers=MAX_READERS,
                readonly=readonly,
                create=not readonly,
                # No fsync per commit: everything in the index can be rebuilt or
                # redone (lower entries re-ingested, promotions re-hashed), so a
                # system crash may lose the last seconds of commits, never
                # integrity. The daemon calls sync() every few seconds; a process
                # crash loses nothing (the pages are in the page cache).
                sync=False,
                readahead=False,  # random access: readahead only evicts useful pages
                max_spare_txns=16,
            )
        except lmdb.Error as e:
            raise IndexError_(f"cannot open node index {path}: {e}") from e
        self = cls(env, path, readonly)
        try:
            _check_roots(env, path)
            stale = env.reader_check()
            if stale:
                log.info("cleared %d stale LMDB reader slot(s) in %s", stale, path)
            self._init_dbs()
        except _DAMAGE as e:
            env.close()
            raise IndexError_(f"cannot open node index {path}: {e}") from e
        except BaseException:
            env.close()
            raise
        return self

    def _init_dbs(self) -> None:
        if self.readonly:
            # open_db without a transaction: py-lmdb loses handles opened in a
            # caller's read transaction. The version is checked first, so a
            # newer layout is reported as such rather than as missing tables.
            try:
                meta = self.env.open_db(ks.DB_META, create=False)
                with self.env.begin() as txn:
                    found = self._check_format(txn.get(ks.META_FORMAT_VERSION, db=meta))
                    self.node_id = bytes(txn.get(ks.META_NODE_ID, db=meta) or b"").decode()
                for name in ks.ALL_DBS:
                    if ks.NEW_IN.get(name, 0) > found:
                        continue  # an older index, read as it is: callers see the db empty
                    self.dbs[name] = self.env.open_db(name, create=False)
            except (lmdb.NotFoundError, KeyError) as e:
                raise IndexError_(f"node index {self.path} is incomplete: {e}") from e
            return
        with self.env.begin(write=True) as txn:
            meta = self.env.open_db(ks.DB_META, txn=txn)
            version = txn.get(ks.META_FORMAT_VERSION, db=meta)
            if version is None and txn.stat(meta)["entries"] == 0:
                version = str(ks.FORMAT_VERSION).encode()
                txn.put(ks.META_FORMAT_VERSION, version, db=meta)
            if self._check_format(version) < ks.FORMAT_VERSION:  # raising aborts: nothing written
                # Upgrade in place: later versions only add databases (created below).
                txn.put(ks.META_FORMAT_VERSION, str(ks.FORMAT_VERSION).encode(), db=meta)
                log.info("node index %s upgraded to format version %d", self.path,
                         ks.FORMAT_VERSION)
            for name in ks.ALL_DBS:
                self.dbs[name] = self.env.open_db(name, txn=txn)
            node_id = txn.get(ks.META_NODE_ID, db=meta)
            if node_id is None:
                node_id = uuid.uuid4().hex.encode()
                txn.put(ks.META_NODE_ID, node_id, db=meta)
            self.node_id = bytes(node_id).decode()

    def _check_format(self, version: bytes | None) -> int:
        """The index's format version; IndexError_ unless this casfs reads it."""
        try:
            v = int(bytes(version)) if version is not None else None
        except ValueError:
            v = None
        if v is None or v not in ks.READABLE_VERSIONS:
            shown = "none" if version is None else bytes(version)[:20].decode(errors="replace")
            raise IndexError_(
                f"node index {self.path} has format version {shown}; this casfs reads only "
                f"versions {', '.join(map(str, ks.READABLE_VERSIONS))} (use a matching casfs,"
                " or move the index aside to rebuild it)"
            )
        return v

    # --- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Drop one reference; the environment closes with the last one."""
        with _registry_lock:
            self._refs -= 1
            if self._refs > 0:
                return
            key = os.path.realpath(self.path)
            if _registry.get(key) is self:
                del _registry[key]
        if self._pid == os.getpid():  # a forked child must not close the parent's locks
            if not self.readonly:
                self.sync()
            self.env.close()

    def sync(self) -> None:
        """Flush committed transactions to disk (commits themselves do not fsync)."""
        try:
            self.env.sync(True)
        except lmdb.Error as e:
            log.warning("syncing node index %s: %s", self.path, e)

    def _check_pid(self) -> None:
        if self._pid != os.getpid():
            raise IndexError_("node index handle used across fork(); open it again in the child")

    # --- transactions -------------------------------------------------------

    def read(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """Run ``fn`` in a short read transaction (rerun if the map was resized)."""
        self._check_pid()
        while True:
            self._lock.acquire_shared()
            try:
                with self.env.begin(buffers=False) as txn:
                    return fn(txn)
            except lmdb.MapResizedError:
                pass
            except lmdb.Error as e:  # e.g. EIO: one line for the caller, never a traceback
                raise IndexError_(f"node index {self.path}: {e}") from None
            finally:
                self._lock.release_shared()
            self._resize(0)

    def write(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """Run ``fn`` in a write transaction; grow the map and rerun it if it fills."""
        self._check_pid()
        if self.readonly:
            raise IndexError_(f"node index {self.path} is open read-only")
        for _ in range(_MAX_GROWTHS):
            grow = 0
            with self._write_lock:
                self._grow_early()
                self._lock.acquire_shared()
                try:
                    with self.env.begin(write=True) as txn:
                        return fn(txn)
                except lmdb.MapFullError:
                    grow = self.env.info()["map_size"] * 2
                except lmdb.MapResizedError:
                    grow = 0
                except lmdb.Error as e:  # a full disk (DiskError: ENOSPC), EIO: one line
                    raise IndexError_(f"node index {self.path}: {e}") from None
                finally:
                    self._lock.release_shared()
                self._resize(grow)
        raise IndexError_(f"node index {self.path}: map still full after {_MAX_GROWTHS} growths")

    def _grow_early(self) -> None:
        """Double the map while it is over half used, so that writes rarely hit MapFullError.

        A write aborted by MapFullError is work thrown away and done again;
        growing between transactions avoids it except for very large ones.
        """
        info = self.env.info()
        used = (info["last_pgno"] + 1) * self.env.stat()["psize"]
        size = info["map_size"]
        if used * 2 > size:
            while used * 2 > size:
                size *= 2
            self._resize(size)

    def _resize(self, new_size: int) -> None:
        """Set the map size (0 adopts the size another process set)."""
        self._lock.acquire_exclusive()
        try:
            self.env.set_mapsize(new_size)
            if new_size:
                log.info("node index %s: map size grown to %d MiB", self.path, new_size >> 20)
        finally:
            self._lock.release_exclusive()


# LMDB's meta page (lmdb.h MDB_meta, 64-bit; after the 16-byte page header of pages 0
# and 1): magic, version; its two databases' records (the free list's, the main
# one's) each end with their root page; then the last page used and the txn id.
_META = struct.Struct("<II16x40xQ40xQQQ")
_META_MAGIC = 0xBEEFC0DE
_NO_PAGE = (1 << 64) - 1  # an empty database's root
_PAGE_HEADER = 16


def _check_roots(env: lmdb.Environment, path: Path) -> None:
    """The newest meta page's root pages are in the file. LMDB reads pages through a
    mapping: a root past the file's end (data.mdb truncated after its meta pages, a
    power loss under sync=False) is a SIGBUS at the first lookup, which no except
    catches (every mount process, and `casfs doctor`, died of it). (Not the last
    page used: pages allocated and freed in one transaction are never written, so a
    sound file may end before it.)"""
    psize = env.stat()["psize"]
    with open(path / "data.mdb", "rb") as f:
        head = os.pread(f.fileno(), 2 * psize, 0)
        pages = os.fstat(f.fileno()).st_size // psize
    metas = []
    for i in range(2):
        off = i * psize + _PAGE_HEADER
        if len(head) >= off + _META.size:
            magic, _, free_root, main_root, _, txnid = _META.unpack_from(head, off)
            if magic == _META_MAGIC:
                metas.append((txnid, free_root, main_root))
    if not metas:
        return  # not ours to judge: LMDB's own open said what it found
    _, free_root, main_root = max(metas)
    for root in (free_root, main_root):
        if root != _NO_PAGE and root >= pages:
            raise _Truncated(f"data.mdb holds {pages} pages, its root is page {root}")


# --- typed helpers (the stubs say bytes | memoryview; with buffers=False it is bytes) ---


def txn_get(txn: lmdb.Transaction, key: bytes, db: Any) -> bytes | None:
    value = txn.get(key, db=db)
    return None if value is None else bytes(value)


def scan_prefix(
    txn: lmdb.Transaction, db: Any, prefix: bytes, after: bytes | None = None, limit: int = 1024
) -> list[tuple[bytes, bytes]]:
    """Up to ``limit`` (key, value) with ``prefix``, in key order, starting after key ``after``."""
    cur = txn.cursor(db=db)
    if not cur.set_range(after or prefix):
        return []
    if after is not None and cur.key() == after and not cur.next():
        return []
    out: list[tuple[bytes, bytes]] = []
    for key, value in cur:
        if len(out) >= limit or not bytes(key).startswith(prefix):
            break
        out.append((bytes(key), bytes(value)))
    return out
