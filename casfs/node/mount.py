"""One mount, end to end: the composition root of every layer.

    view (FUSE overlay)  ->  promotion / publication  ->  node index + object cache  ->  store

Concurrency model: everything runs in one trio thread except blocking work
(LMDB writes of ingestion, hashing and compressing for promotion, shared-root
I/O of publication and refresh, object fetches), which goes to worker threads
via ``trio.to_thread``. FUSE handlers never wait on shared storage except for
the one object a read must fetch, and that fetch runs in a thread too.

Failure policy: the shared root may be missing, slow or hostile. Then lower
entries the index already knows still show (their objects may be cached
locally), everything else is a miss, upper files are served as usual, and
promotion/publication retry in the background.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import logging
import math
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import trio

from casfs import families
from casfs.errors import (
    CasfsError,
    CorruptObjectError,
    ObjectMissingError,
    UsageError,
    WorkerBugError,
)
from casfs.index.memtree import MemLowerTree, StagedLowerTree
from casfs.index.node_index import NodeIndex
from casfs.index.objcache import LocalObjectCache, discard_cache_dir
from casfs.node import control, fetchproc, prefetch, promoteproc, readahead, usage
from casfs.node.config import MountConfig
from casfs.promote.promoter import Promoter, RoundResult
from casfs.promote.publisher import Publisher, PublishOutcome, profile_options
from casfs.promote.tracker import WriteTracker
from casfs.store import profile, reads
from casfs.store.entry import Entry
from casfs.store.generations import GenerationStore, PublishResult, Record, Snapshot
from casfs.store.root import SharedRoot
from casfs.tenants import TenantPolicy
from casfs.util import beneath
from casfs.util.bounded import call_bounded
from casfs.util.counters import Counters
from casfs.util.crashpoint import pausepoint
from casfs.view import dirmode, overlay, session

log = logging.getLogger(__name__)

ROOT_RETRY_AFTER = 5.0  # seconds before a root that failed to open is tried again
# The longest opening the root may hold a mount's start (or a refresh): the marker is
# one small read, and a job must not wait a whole fetch timeout on a hung server (I4).
ROOT_OPEN_TIMEOUT = 3.0
USE_TICK_S = 15.0  # how often a mount checks whether its read record is due (casfs.node.usage)


class _NoSource:
    """Object source while the shared root is unreachable: every fetch is a miss."""

    def get_into(self, digest: str, expected_size: int | None, out: Any) -> int:
        raise ObjectMissingError("the shared root is unavailable")


class _RootSource:
    """Object source that follows the service's current SharedRoot handle."""

    def __init__(self, svc: MountService) -> None:
        self._svc = svc

    def get_into(self, digest: str, expected_size: int | None, out: Any) -> int:
        root = self._svc.root
        if root is None:
            return _NoSource().get_into(digest, expected_size, out)
        self._svc.counters.inc("objects_fetched")
        with self._svc.ondemand():
            n = root.objects.get_into(digest, expected_size, out)
        self._svc.counters.inc("bytes_fetched", n)
        return n

    def worker(self) -> fetchproc.FetchWorker:
        """This process's fetch worker (started at once, so a first fetch does not wait)."""
        cfg = self._svc.cfg
        return fetchproc.shared(cfg.state_dir / "objects",
                                hang_after=max(2 * cfg.fetch_timeout, 5.0))

    def pack_of(self, digest: str) -> tuple[str, int, int] | None:
        """Where a pack holds ``digest``, if this process knows: from a manifest it read,
        or from the index (packs this node's promotion wrote, maybe unpublished yet)."""
        objects = self._svc.root.objects if self._svc.root is not None else None
        if objects is None:
            return None
        loc = objects.locations.get(digest)
        if loc is None and objects.lookup is not None:
            loc = objects.lookup(digest)
        return loc

    def fill_many(self, items: list[tuple[str, int]], progressed: Callable[[], None],
                  done: Callable[[str, tuple[int, int, int] | None, BaseException | None], None],
                  packs: list[str] | None = None,
                  adopt: Callable[[str, int, tuple[int, int, int]], bool] | None = None
                  ) -> None:
        """casfs.index.objcache.CacheFiller: several objects in one request (read-ahead);
        ``done`` is called once per object answered (identity or error), ``adopt`` for
        each other member of ``packs`` the worker added (digest, size, identity)."""
        svc = self._svc
        cfg, spec = svc.cfg, self._spec()
        sizes = dict(items)

        def one(msg: dict[str, Any]) -> None:
            digest, ident = msg.get("one"), _ident(msg.get("ident"))
            if isinstance(digest, str) and digest not in sizes:  # a pack member it added
                size = msg.get("size")
                # Counted only if adopted: a member a job's open is fetching meanwhile
                # (the missed file of a one-member pack) is that fetch's, not a second.
                if (ident is not None and adopt is not None and type(size) is int
                        and size >= 0 and adopt(digest, size, ident)):
                    svc.counters.inc("objects_fetched")
                    svc.counters.inc("bytes_fetched", size)
                return
            if not isinstance(digest, str):
                return
            if ident is not None:
                svc.counters.inc("bytes_fetched", sizes[digest])
                done(digest, ident, None)
            else:
                kind = msg.get("kind")
                cls = (CorruptObjectError if kind == "corrupt" else
                       ObjectMissingError if kind == "missing" else CasfsError)
                done(digest, None, cls(str(msg.get("error", "fetch failed"))))

        svc.counters.inc("objects_fetched", len(items))
        try:
            with svc.ondemand():
                self.worker().fill_many([(d, n, self.pack_of(d)) for d, n in items], spec,
                                        cfg.namespace, progressed, svc.counters, one, packs)
        except fetchproc.FetchWorkerError:
            svc.counters.inc("fetch_worker_lost")
            raise

    def fill_cache(self, digest: str, size: int, progressed: Callable[[], None]
                   ) -> tuple[int, int, int] | None:
        """casfs.index.objcache.CacheFiller: the fetch worker process fills the cache."""
        svc = self._svc
        cfg, spec = svc.cfg, self._spec()
        worker = self.worker()
        svc.counters.inc("objects_fetched")
        try:
            with svc.ondemand():
                reply = worker.fill(digest, size, spec, cfg.namespace, self.pack_of(digest),
                                    progressed, svc.counters)
        except fetchproc.FetchWorkerError:
            svc.counters.inc("fetch_worker_lost")
            raise
        svc.counters.inc("bytes_fetched", int(reply.get("n", 0)))
        return _ident(reply.get("ident"))

    def _spec(self) -> dict[str, Any]:
        """How the fetch worker opens the root (sent over the socket, never on argv)."""
        svc = self._svc
        if svc.root is None:
            raise ObjectMissingError("the shared root is unavailable")
        cfg = svc.cfg
        return {"root": str(cfg.root), "tenant": cfg.tenant, "tenants": cfg.tenants,
                "timeout": cfg.fetch_timeout}


def _ident(raw: object) -> tuple[int, int, int] | None:
    """A cache file's identity as the fetch worker reports it (a list of 3 ints)."""
    if isinstance(raw, list) and len(raw) == 3 and all(type(v) is int for v in raw):
        return (raw[0], raw[1], raw[2])
    return None


def _try_flock(fd: int, how: int = fcntl.LOCK_EX) -> bool:
    """Take ``how`` on ``fd`` without blocking; False when another holds it."""
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True


class MountService:
    """One namespace: index, promotion, publication, refresh, and its view.

    ``hosted``: the namespace is one directory of a multi-namespace mount
    (casfs.node.host), which checked the mount base and owns the FUSE session;
    its mount point lies inside the host's own mount, so nothing here may touch
    it (that would wait on the host's FUSE loop).
    """

    def __init__(self, cfg: MountConfig, *, hosted: bool = False,
                 wait_for_reclaim: bool = True) -> None:
        if not hosted:
            cfg.check()
        self.cfg = cfg
        self.rules = families.rules(cfg.family, cfg.scratch_patterns)
        self.counters = Counters()
        self.tracker = WriteTracker()
        self.root: SharedRoot | None = None
        self.root_error: str | None = None
        self._root_failed_at = -math.inf  # monotonic end of the last failed _open_root
        self.served_seq = 0
        self.started = time.time()
        self._t0 = time.monotonic()  # the origin of mount_ready_s and warm_ready_s
        self.mount_ready_s: float | None = None
        self._stopping = False
        self._entry: dict[str, Any] = {}  # our registry entry, once we serve
        self._lock_fd: int | None = None
        self._gens_store: GenerationStore | None = None
        # Tenants: the root trusts only what this mount's tenant could have written,
        # and the directory handed to jobs is the tenant's alone (casfs.tenants).
        self.policy = TenantPolicy.from_dict(cfg.tenants) if cfg.tenant else None
        self.tenant = self.policy.tenant(cfg.tenant) if self.policy else None
        self.index = NodeIndex.open(cfg.state_dir)
        if self.index.take_repaired():
            discard_cache_dir(cfg.state_dir / "objects")
        self._take_namespace_lock(wait_for_reclaim)
        self._open_root()
        # Lazy ingest (casfs.index.memtree): a namespace with no rows on this node is
        # served from its parsed manifest while a thread writes the rows.
        self._may_stage = True
        self._staged: tuple[Record, list[list[Entry]], MemLowerTree] | None = None
        self._stop_indexing = threading.Event()
        self._replaced_pending: set[str] = set()
        # Paths an ingest added while serving: the view drops the kernel's negative
        # dentries for them once they are served (casfs.view.op_base.lower_added).
        self._added_pending: list[str] = []
        self._refresh_lock = threading.Lock()
        self.served_seq = self._initial_seq()
        self._may_stage = False
        self.restored_entries = (self._staged[0].entries if self._staged is not None else
                                 int((self.index.ns_state(cfg.namespace) or {})
                                     .get("entries", 0)))
        self.lower = StagedLowerTree(self.index.lower_tree(cfg.namespace, self.served_seq),
                                     self._staged[2] if self._staged is not None else None)
        self._indexer: threading.Thread | None = None
        if self._staged is not None:
            self._indexer = threading.Thread(target=self._write_staged_rows,
                                             name=f"casfs-index-{cfg.namespace}", daemon=True)
        # dir mode: lower paths already offered to this mount's directory. A refresh
        # restores only paths not offered before, so a file the job deleted stays
        # deleted until the next mount start (the whiteout scope rule of view.whiteout).
        self._dir_offered: set[str] = set()
        self._dir_replaced: set[str] = set()  # newer versions of replaced paths to put in place
        self._dir_refused: set[str] = set()  # paths through a symlink: skipped, warned once
        if not hosted:
            session.clear_stale_mount(cfg.mountpoint)  # a dead mount (ENOTCONN) fails mkdir
        cfg.writable_dir.mkdir(parents=True, exist_ok=True)
        root_mode = self._root_mode = self._give_to_tenant(cfg.writable_dir)
        source = _RootSource(self)
        self.cache = LocalObjectCache(
            cfg.state_dir / "objects", self.index, source, cfg.cache_max_bytes,
            filler=source if fetchproc.enabled() else None, counters=self.counters,
            # CASFS_VERIFY_CACHE=0: trust cache files without hashing (benchmarks only)
            verify_first_open=os.environ.get("CASFS_VERIFY_CACHE", "1") != "0",
        )
        self.cache.flushed_elsewhere = True  # flush_counters, every 2 s in a worker thread
        if fetchproc.enabled() and cfg.mode != "dir":
            source.worker()
        # Promotion and publication run in the promotion worker (casfs.node.promoteproc)
        # wherever a FUSE connection is to be protected; dir mode has none.
        self._promote_lock = threading.Lock()  # one round per namespace at a time
        if self._in_worker():
            promoteproc.shared(cfg.state_dir)
        if cfg.mode == "overlay" and (why := overlay.unavailable_reason()) is not None:
            log.warning("%s: %s: serving in fuse mode instead", cfg.name, why)
            self.counters.inc("overlay_fallback")
            cfg = self.cfg = dataclasses.replace(cfg, mode="fuse")
        self.overlay_paths = (
            overlay.OverlayPaths(cfg.upper, cfg.overlay_base)
            if cfg.mode == "overlay" else None
        )
        self._overlay_mounted = False
        self._watcher: Any = None
        self._last_scan = 0.0
        # Path-bearing files (Triton groups) are stored path-free and presented with
        # the path this namespace is served at: a cache works at any path.
        self.relocator = (families.Relocator(self.rules, str(cfg.mountpoint))
                          if self.rules.path_bearing else None)
        if cfg.mode != "dir":
            # Imported here: the FUSE layer needs pyfuse3 (libfuse3), dir mode must not.
            from casfs.view.ops import OverlayOperations
        self.ops = (
            OverlayOperations(self.lower, self.cache, cfg.upper, self.tracker, self.counters,
                              fetch_timeout=cfg.fetch_timeout, root_mode=root_mode,
                              share_bits=self.tenant.share_bits if self.tenant else 0,
                              replaced=self._is_replaced, presenter=self.relocator)
            if cfg.mode == "fuse" else
            # overlay: the FUSE layer serves lower only; its upper stays empty (read-only).
            # Directories show nlink 1: the overlay's first listing of a merged directory
            # (the root: every kernel dir) would otherwise list each child directory
            # here while the job waits (~10 us a file of a first pass).
            OverlayOperations(self.lower, self.cache, self.overlay_paths.fuse_upper,
                              self.tracker, self.counters, fetch_timeout=cfg.fetch_timeout,
                              replaced=self._is_replaced, presenter=self.relocator,
                              dir_nlink=False, root_mode=root_mode,
                              lower_dir_mode=root_mode & 0o7777)
            if self.overlay_paths is not None else None
        )
        self.restore_stamps = (
            dirmode.RestoreStamps(cfg.state_dir / f"restored-{cfg.namespace}.json", self.lower)
            if cfg.mode == "dir" else None
        )
        self.ondemand_fetches = 0  # the job's own fetches in flight (see ondemand)
        self._ondemand_lock = threading.Lock()
        self.recorder = profile.Recorder()
        # Published entries jobs opened (retention by use): every view mode feeds it.
        self.uses = usage.UseLog()
        self._not_lower: set[str] = set()  # observed opens of other paths, this epoch
        self.uses.on_epoch.append(self._not_lower.clear)
        self._open_watch: Any = None  # overlay mode: casfs.view.opens.OpenWatchProcess
        self.prefetcher: prefetch.Prefetcher | None = None
        self.readahead: readahead.ReadAhead | None = None
        if self.overlay_paths is not None and self.ops is not None:
            self.ops.lower_owner = self._tenant_owner()  # as the links layer's: the tenant's
        if self.ops is not None:
            self.ops.on_lower_open = self._lower_opened
            if cfg.readahead:
                self.readahead = readahead.ReadAhead(self.cache, self.lower, self.counters,
                                                     pack_of=source.pack_of)
                self.ops.on_lower_miss = self.readahead.missed
        self.publisher: Publisher | None = None
        self.last_promotion_error = ""
        self._ingredients: dict[str, Any] | None = None
        if cfg.ingredients:  # a configured mount or a dir/overlay casfs run
            self.set_ingredients(cfg.ingredients)
        self.last_publish: dict[str, Any] | None = None
        # The latest paths published with other bytes than this node's (first writer kept).
        self.conflict_paths: list[str] = []
        self._flushed: dict[str, int] = {}
        self.release_published_replaced()
        recovered = self._promoter_or_none()
        if recovered is not None:
            n = recovered.scan_all()
            if n:
                log.info("%s: %d upper files from before are awaiting promotion", cfg.name, n)
        if self._indexer is not None:
            self._indexer.start()

    # --- start-up ---------------------------------------------------------
    def _give_to_tenant(self, path: Path) -> int:
        """Owner and mode of the directory jobs get: the tenant's, never world-writable.

        Without tenants (a MountConfig without one) it stays 1777, as before.
        """
        t = self.tenant
        if t is None:
            return 0o1777
        if os.geteuid() == 0:
            os.chown(path, t.uid, t.gid)
        os.chmod(path, t.dir_mode)  # after chown, which clears setgid
        return t.dir_mode

    def _tenant_owner(self) -> tuple[int, int] | None:
        """(uid, gid) the tenant's directories belong to; None without tenants."""
        return (self.tenant.uid, self.tenant.gid) if self.tenant is not None else None

    def _take_namespace_lock(self, wait_for_reclaim: bool = True) -> None:
        """The namespace's lock: one mount (or reclaim) of it per state dir at a time.

        Held by another mount (or by anything, for the reclaim itself:
        ``wait_for_reclaim`` False): refused at once. Held by a reclaim of the namespace
        (casfs.node.reclaim, which holds ``ns-<ns>.reclaim`` meanwhile): this start
        waits for it, at most ``shutdown_timeout``, holding ``ns-<ns>.wanted``
        shared so that a reclaim not past its publication yet keeps the node state
        for it instead of dropping it.
        """
        from casfs.node import reclaim

        self.cfg.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        ns = self.cfg.namespace
        path = self.cfg.run_dir / f"ns-{ns}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        wanted: int | None = None
        try:
            deadline = time.monotonic() + self.cfg.shutdown_timeout
            while not _try_flock(fd):
                if not wait_for_reclaim or not reclaim.in_progress(self.cfg.run_dir, ns):
                    # The reclaim releases the namespace's lock before its own: free now,
                    # unless another mount took it.
                    if _try_flock(fd):
                        break
                    raise UsageError(
                        f"namespace {ns} is already mounted from {self.cfg.state_dir}")
                if wanted is None:
                    wanted = reclaim.want(self.cfg.run_dir, ns)
                    log.info("%s: %s is being reclaimed: waiting for it (at most %.0fs)",
                             self.cfg.name, ns, self.cfg.shutdown_timeout)
                if time.monotonic() > deadline:
                    raise UsageError(f"namespace {ns} is being reclaimed on this node (for"
                                     f" over {self.cfg.shutdown_timeout:.0f}s); try again")
                time.sleep(0.05)
        except BaseException:
            os.close(fd)
            raise
        finally:
            if wanted is not None:
                os.close(wanted)
        self._lock_fd = fd

    def _open_root(self) -> None:
        # A root that just failed to open (after up to fetch_timeout) is not tried again
        # at once: a release's promotion and publication each tried, so a stalled root
        # held `casfs run` twice fetch_timeout after its job had ended.
        if time.monotonic() - self._root_failed_at < ROOT_RETRY_AFTER:
            return
        bound = min(self.cfg.fetch_timeout, ROOT_OPEN_TIMEOUT)
        try:
            # In a thread: a POSIX root on a dead hard NFS mount blocks in the kernel
            # for good, and a job's start must not wait for it (I4).
            self.root = call_bounded(
                # per namespace: namespaces attached at once must not refuse each other
                f"root-open:{self.cfg.root}:{self.cfg.tenant}:{self.cfg.namespace}",
                lambda: SharedRoot.open(self.cfg.root, create=True, counters=self.counters,
                                        tenants=self.policy, timeout=self.cfg.fetch_timeout,
                                        open_timeout=bound),
                bound + 1.0)
            self.root_error = None
            # A packed object fetched before any manifest was read this run (a
            # restarted mount serving its indexed generation): learn where packs
            # hold it from the namespace's newest generation, once.
            self.root.objects.locator = self._load_pack_locations
            root_id, index = self.root.root_id, self.index
            # The packs this node's promotion wrote (named in the index before any record).
            self.root.objects.lookup = lambda digest: index.pack_location(root_id, digest)
        except (CasfsError, OSError) as e:
            self.root = None
            self.root_error = str(e)
            self._root_failed_at = time.monotonic()
            self.counters.inc("root_unavailable")
            log.error("%s: shared root unavailable, serving local state only: %s",
                      self.cfg.name, e)

    def _load_pack_locations(self) -> None:
        try:
            if self.root is not None:
                gens = self._gens()
                if gens.latest(self.cfg.namespace) is not None:
                    gens.entries(self.cfg.namespace)  # registers pack locations
        except (CasfsError, OSError) as e:
            log.warning("%s: cannot read pack locations: %s", self.cfg.name, e)

    def _initial_seq(self) -> int:
        state = self.index.ns_state(self.cfg.namespace) or {}
        known = int(state.get("seq", 0))
        if self.root is None:
            return known
        if state and state.get("root") != self.root.root_id:
            # This state dir last served the namespace from another shared root:
            # its lower entries name objects this root may not have, and what it
            # promoted was published there, not here. Start over for this root;
            # the upper files are kept and promoted again.
            log.warning("%s: %s was indexed from another shared root; re-indexing from %s",
                        self.cfg.name, self.cfg.namespace, self.root.path)
            self.index.drop_namespace(self.cfg.namespace)
            self.index.forget_all_promoted(self.cfg.namespace)
            known = 0
        try:
            return self.ingest_latest(known) or known
        except (CasfsError, OSError) as e:
            self.counters.inc("refresh_errors")
            log.error("%s: cannot read generations of %s: %s", self.cfg.name,
                      self.cfg.namespace, e)
            return known

    def ingest_latest(self, known: int) -> int | None:
        """Index the newest generation's manifest parts not seen yet; its seq, or None."""
        assert self.root is not None
        gens = self._gens()
        newest = gens.latest_seq(self.cfg.namespace, hint=known or None)
        if newest is None or newest <= known:
            return None  # nothing new: no manifest is read
        # newest_valid validates the whole generation before any of it is served.
        _, rec, snap = gens.newest_valid(self.cfg.namespace, hint=newest)
        if rec is None or rec.seq <= known:
            return None
        self._ingest(rec, snap)
        return rec.seq

    def _ingest(self, rec: Record, snap: Snapshot) -> None:
        gens = self._gens()
        ns = self.cfg.namespace
        state = self.index.ns_state(ns) or {}
        have = set(state.get("parts", []))
        new_parts = [gens.part_entries(p) for p in rec.parts if p.digest not in have]
        replaced: list[str] = []
        if self._may_stage and not state and snap.record is rec:
            # Start-up with no rows here: serve the validated generation from memory
            # (casfs.index.memtree), write the rows after.
            self._staged = (rec, new_parts, MemLowerTree(snap.entries, snap.dirs))
            log.info("%s: serving %s@%d (%d files) while indexing it", self.cfg.name, ns,
                     rec.seq, rec.entries)
        else:
            for entries in new_parts:
                replaced += self.index.add_entries(ns, rec.seq, entries).replaced
                if getattr(self, "ops", None) is not None:
                    self._added_pending += [e.path for e in entries]
            self._set_ingested(rec)
            log.info("%s: indexed %s@%d (%d files)", self.cfg.name, ns, rec.seq, rec.entries)
        self._check_mount_path(rec)
        if replaced and getattr(self, "lower", None) is None:
            self._replaced_changed(sorted(set(replaced)))  # start-up: counted only
        elif replaced:
            # Told to the view by refresh_once once the new seq is served: invalidated
            # before that, the kernel could look the old version up again (and keep it).
            self._replaced_pending.update(replaced)

    def _set_ingested(self, rec: Record) -> None:
        self.index.set_ns_state(self.cfg.namespace, {
            "seq": rec.seq, "parts": [p.digest for p in rec.parts], "entries": rec.entries,
            "root": self._gens().root.root_id})

    _INDEX_CHUNK = 8192  # rows per write transaction while serving: stop is checked between

    def _write_staged_rows(self) -> None:
        """The indexer thread: the staged generation's rows into LMDB, then its state."""
        assert self._staged is not None
        rec, parts, _ = self._staged
        ns, t0 = self.cfg.namespace, time.monotonic()
        try:
            self._staged[2].index_dirs()  # before the job's first listing needs it
            # Rows without a recorded state are an interrupted ingest's: start clean.
            self.index.drop_namespace(ns)
            for entries in parts:
                for i in range(0, len(entries), self._INDEX_CHUNK):
                    if self._stop_indexing.is_set():
                        return  # no state recorded: the next start indexes again
                    self.index.add_entries(ns, rec.seq, entries[i:i + self._INDEX_CHUNK])
            self._set_ingested(rec)
            self.lower.finish()
            self._staged = None
            log.info("%s: indexed %s@%d (%d files) in %.2fs", self.cfg.name, ns, rec.seq,
                     rec.entries, time.monotonic() - t0)
        except (CasfsError, OSError) as e:
            self.counters.inc("index_errors")
            log.error("%s: cannot index %s@%d (served from memory until the next start): %s",
                      self.cfg.name, ns, rec.seq, e)
        finally:
            self.lower.indexed.set()  # refresh may go on (it waits for this)

    def wait_indexed(self, timeout: float | None = None) -> bool:
        """Whether the served generation's rows are in LMDB (waits up to ``timeout``)."""
        return self.lower.indexed.wait(timeout) and not self.lower.staged

    # --- replaced paths ------------------------------------------------------
    def _is_replaced(self, path: str) -> bool:
        return self.rules.replace_rule(path) is not None

    def _replaced_changed(self, paths: list[str]) -> None:
        """Newer versions of replaced paths were ingested (worker thread, or start-up)."""
        self.counters.inc("replaced_refreshed", len(paths))
        if getattr(self, "lower", None) is None:
            return  # start-up: release_published_replaced runs once the view exists
        if self.cfg.mode == "dir":
            self._dir_replaced.update(paths)  # refresh_once swaps them once they are served
            return
        for p in paths:
            self._release_published_upper(p)
        ops = getattr(self, "ops", None)
        if ops is not None:
            ops.replaced_changed(paths)

    def _release_published_upper(self, path: str) -> bool:
        """This node's upper copy of a replaced path stops shadowing a newer published one.

        Only a copy that was published and is unchanged since (same size and
        mtime, no writer) is removed; a version the job wrote after that stays,
        is promoted and published, and wins in its turn.
        """
        if self.cfg.mode != "fuse":
            return False
        # The upper is shaped by the tenant (through the view): resolved beneath it,
        # no symlink followed, so root never unlinks outside it.
        try:
            base = beneath.open_base(self.cfg.upper)
        except OSError:
            return False
        try:
            try:
                st = beneath.lstat(base, path)
            except OSError:
                return False
            rec = self.index.get_promoted(self.cfg.namespace, path)
            lower = self.lower.lookup(path)
            if (rec is None or rec.state != "published" or not stat.S_ISREG(st.st_mode)
                    or (rec.entry.size, rec.entry.mtime_ns) != (st.st_size, st.st_mtime_ns)
                    or self.tracker.has_writers(path) or not isinstance(lower, Entry)
                    or lower.digest == rec.entry.digest):
                return False
            try:
                beneath.unlink(base, path)
            except OSError as e:
                log.warning("%s: cannot release %s: %s", self.cfg.name, path, e)
                return False
        finally:
            os.close(base)
        self.counters.inc("replaced_upper_released")
        return True

    def release_published_replaced(self) -> int:
        """At start: published upper copies of replaced paths a newer version supersedes."""
        if not self.rules.replaced or self.cfg.mode != "fuse":
            return 0
        return sum(self._release_published_upper(r.entry.path)
                   for r in list(self.index.iter_promoted(self.cfg.namespace))
                   if r.state == "published" and self._is_replaced(r.entry.path))

    def _check_mount_path(self, rec: Record) -> None:
        """Records of older casfs releases name their mount path: their path-bearing
        files hold absolute paths, which only hit at that path (newer ones are
        stored path-free and need no check)."""
        published_at = (rec.fingerprint or {}).get("mountpoint")
        if (self.rules.path_bearing and isinstance(published_at, str)
                and published_at != str(self.cfg.mountpoint)):
            self.counters.inc("mount_path_mismatch")
            log.warning(
                "%s: %s@%d was published from a mount at %s but is served here at %s:"
                " its Triton group files (from an older casfs) hold absolute paths,"
                " so those kernels will miss here",
                self.cfg.name, rec.namespace, rec.seq, published_at, self.cfg.mountpoint)

    def _promoter_or_none(self) -> Promoter | None:
        if self.root is None:
            return None
        return Promoter(
            upper=self.cfg.writable_dir, objects=self.root.objects, index=self.index,
            key=self.cfg.namespace, rules=self.rules, tracker=self.tracker,
            counters=self.counters, lower=self.lower, stable_after=self.cfg.stable_after,
            busy=self._dir_writers if self.cfg.mode in ("dir", "overlay") else None,
            unchanged=(self.restore_stamps.unchanged if self.restore_stamps is not None
                       else None),
            packs=self.cfg.packs, root_id=self.root.root_id, probe_loose=self.root.is_local,
        )

    def _dir_writers(self, rels: list[str]) -> set[str]:
        return dirmode.open_for_writing(self.cfg.mountpoint, rels)

    def _gens(self) -> GenerationStore:
        """One GenerationStore per root handle: it caches parsed manifests."""
        assert self.root is not None
        if self._gens_store is None or self._gens_store.root is not self.root:
            self._gens_store = self.root.generations()
        return self._gens_store

    def _publisher(self) -> Publisher | None:
        if self.root is None:
            return None
        if self.publisher is None or self.publisher.gens.root is not self.root:
            self.publisher = Publisher(
                generations=self._gens(), index=self.index, key=self.cfg.namespace,
                namespace=self.cfg.namespace, counters=self.counters, rules=self.rules,
                # The mount path travels with the record: Triton group files hold
                # absolute paths, so nodes serving another path must be warned.
                fingerprint=None,
                max_bytes=self.cfg.namespace_max_bytes,
                on_lost=self.tracker.modified,
            )
            self.publisher.options_for = self._profile_options
        self.publisher.fingerprint = self._record_fingerprint()
        return self.publisher

    def set_ingredients(self, ingredients: object) -> None:
        """The job's ingredients of this namespace, computed on the job's side.

        Kept only if they hash to the namespace served (an explicit namespace
        has none): generation records carry them so ``casfs explain`` can say
        which ingredients differ between namespaces.
        """
        from casfs.fingerprint import Fingerprint
        from casfs.tenants import split_store_namespace

        if self._ingredients is not None or not isinstance(ingredients, dict):
            return
        bare = split_store_namespace(self.cfg.namespace)[1]  # "<tenant>~<ns>" on the root
        if all(isinstance(k, str) and (v is None or isinstance(v, str))
               for k, v in ingredients.items()) and (
                Fingerprint(self.cfg.family, ingredients).namespace == bare):
            self._ingredients = dict(ingredients)

    def _record_fingerprint(self) -> dict[str, Any]:
        # Only what a job said (set_ingredients): probing an interpreter here would put
        # a subprocess on the publication path, and this process is not the job's.
        # No mount path: path-bearing files are stored path-free (relocated on read).
        return dict(self._ingredients or {})

    # --- background work (worker threads) ---------------------------------
    @contextlib.contextmanager
    def ondemand(self) -> Iterator[None]:
        """Count a fetch of the job's own (not the prefetcher's) while it runs: prefetch
        threads wait while any is in flight. Locked: fetch threads update it at once,
        and a lost update would leave prefetch waiting for good."""
        if prefetch.in_prefetch_thread():
            yield
            return
        with self._ondemand_lock:
            self.ondemand_fetches += 1
        try:
            yield
        finally:
            with self._ondemand_lock:
                self.ondemand_fetches -= 1

    def promote_once(self, final: bool = False) -> int:
        if self.root is None:
            self._open_root()
        p = self._promoter_or_none()
        if p is None:
            return 0
        if final and self.cfg.mode == "dir":
            p.scan_all()  # inotify events may still be in flight (or overflowed)
        elif self.cfg.mode == "overlay" and (final or time.monotonic() - self._last_scan >= 5):
            # overlayfs writes upper files with notifications off: inotify sees
            # creates and renames, not writes, so the upper is rescanned too.
            self._last_scan = time.monotonic()
            p.scan_all()
        if self._in_worker():
            with self._promote_lock:
                res = self._promote_in_worker(final)
        else:
            res = p.run_once(final=final)
        if res.errors:
            self.last_promotion_error = res.last_error
        elif res.promoted:
            self.last_promotion_error = ""
        return res.promoted

    def _in_worker(self) -> bool:
        return self.cfg.mode != "dir" and promoteproc.enabled()

    def _root_spec(self) -> dict[str, Any]:
        cfg = self.cfg
        return {"root": str(cfg.root), "tenant": cfg.tenant, "tenants": cfg.tenants,
                "timeout": cfg.fetch_timeout}

    def _promote_in_worker(self, final: bool) -> RoundResult:
        """One promotion round in the promotion worker; the tracker stays here."""
        cfg = self.cfg
        res = RoundResult()
        paths = self.tracker.quiet(0.0 if final else cfg.stable_after,
                                   with_writers=final and cfg.mode == "overlay")
        if paths and cfg.mode == "overlay":
            held = self._dir_writers(paths)
            res.deferred += len(held)
            paths = [p for p in paths if p not in held]
        # Bounded requests, commit records last: a group's children go in an earlier
        # request (their rows are written when the group is checked) or in its own.
        is_record = self.rules.is_commit_record
        paths = [p for p in paths if not is_record(p)] + [p for p in paths if is_record(p)]
        for i in range(0, len(paths), promoteproc.CHUNK):
            if not self._promote_paths(paths[i:i + promoteproc.CHUNK], res):
                break
        return res

    def _promote_paths(self, paths: list[str], res: RoundResult) -> bool:
        """Promote ``paths`` in one worker request, into ``res``; False if the round
        must stop (the worker lost, or the root or disk failing: the paths stay dirty).

        A request that fails on its input (WorkerBugError: an exception that is not
        the environment's) is split in halves, down to the one file it fails on:
        that file stays on this node, unpublished, until it changes, and every
        other file is promoted (one such file, an empty one or a name that is not
        UTF-8, once failed every round of its namespace: nothing was published).
        """
        cfg = self.cfg
        msg = {"op": "promote", "root": self._root_spec(), "ns": cfg.namespace,
               "upper": str(cfg.writable_dir), "family": cfg.family,
               "scratch": list(cfg.scratch_patterns), "packs": cfg.packs,
               "max_seq": self.lower.max_seq, "paths": paths}
        try:
            reply = promoteproc.shared(cfg.state_dir).call(msg, lambda: None, self.counters)
        except WorkerBugError as e:
            if len(paths) > 1:
                mid = len(paths) // 2  # order kept: commit records stay after children
                return (self._promote_paths(paths[:mid], res)
                        and self._promote_paths(paths[mid:], res))
            self.tracker.forget(paths[0])  # until it changes again
            self.counters.inc("promote_unpromotable")
            log.warning("%s: cannot promote %s (%s): it stays on this node, unpublished, "
                        "and is tried again when it changes", cfg.name, paths[0], e.message)
            return True
        except CasfsError as e:  # the worker died twice or hung: the paths stay dirty
            self.counters.inc("promote_worker_lost")
            res.errors += 1
            res.last_error = e.message
            log.warning("%s: promotion round failed (will retry): %s", cfg.name, e.message)
            return False
        for ev in reply.get("events") or []:
            if ev[0] == "f":
                self.tracker.forget(ev[1], ev[2])
            else:
                self.tracker.modified(ev[1])
        res.promoted += int(reply.get("promoted", 0))
        res.bytes += int(reply.get("bytes", 0))
        res.deferred += int(reply.get("deferred", 0))
        res.errors += int(reply.get("errors", 0))
        res.last_error = str(reply.get("last_error", "")) or res.last_error
        return True

    def _publish_in_worker(self, pub: Publisher) -> PublishOutcome:
        """Publication in the promotion worker: the outcome as Publisher.publish's."""
        cfg = self.cfg
        opened = self.recorder.paths()
        msg = {"op": "publish", "root": self._root_spec(), "ns": cfg.namespace,
               "family": cfg.family, "scratch": list(cfg.scratch_patterns),
               "fingerprint": pub.fingerprint, "max_bytes": pub.max_bytes, "opened": opened}
        try:
            reply = promoteproc.shared(cfg.state_dir).call(msg, lambda: None, self.counters)
        except CasfsError as e:  # the worker died twice or hung: retried next interval
            self.counters.inc("publish_errors")
            log.warning("%s: publication failed (will retry): %s", cfg.name, e.message)
            out = PublishOutcome(False, f"failed: {e.message}")
            pub.last = out
            return out
        for path in reply.get("lost") or []:
            self.tracker.modified(path)
        if reply.get("profiled"):
            self.recorder.mark_published(len(opened))
        raw = reply.get("result")
        out = PublishOutcome(bool(reply.get("published")), str(reply.get("message", "")),
                             PublishResult(**raw) if isinstance(raw, dict) else None)
        pub.last = out
        return out

    def _promotion_state(self) -> tuple[int, str]:
        """(files still awaiting promotion, the last promotion error or '')."""
        waiting = self.tracker.pending()
        return waiting, self.last_promotion_error if waiting else ""

    def record_reads(self, force: bool = False, final: bool = False) -> None:
        """Write what this mount's jobs opened as a read record (casfs.store.reads) when
        casfs.node.usage says it is due; ``force`` at publication, ``final`` at release."""
        if not (force or final or self.uses.due()):
            return
        batch = self.uses.take(force=force, final=final)
        if batch is None:
            return
        if self.root is None:
            self.uses.put_back(batch)
            return
        try:
            if self._in_worker():  # a write to the shared root: not in the FUSE process
                promoteproc.shared(self.cfg.state_dir).call(
                    {"op": "reads", "root": self._root_spec(), "ns": self.cfg.namespace,
                     "node": self.index.node_id, "paths": list(batch.paths),
                     "time": time.time(), "until": batch.until}, lambda: None, self.counters)
            else:
                reads.record(self.root.backend, self.cfg.namespace, self.index.node_id,
                             batch.paths, time.time(), until=batch.until)
            self.counters.inc("read_records")
            self.counters.inc("read_record_paths", len(batch.paths))
        except (CasfsError, OSError) as e:
            self.uses.put_back(batch)
            log.warning("%s: no read record this time: %s", self.cfg.name, e)

    def publish_once(self, final: bool = False) -> dict[str, Any]:
        """Publish what is promoted; ``final``: the namespace is being released."""
        self.record_reads(force=True, final=final)
        waiting, error = self._promotion_state()
        pub = self._publisher()
        if pub is None:
            self._open_root()
            return {"ok": False, "message": f"shared root unavailable: {self.root_error}",
                    "pending_promotion": waiting, "promotion_error": error}
        out = self._publish_in_worker(pub) if self._in_worker() else pub.publish()
        res = out.result
        if res is not None and res.added:
            self.refresh_once()  # serve (and report) the generation we just made
        message, ok = out.message, out.ok
        if waiting:
            # Never "nothing to publish" while files wait: say what is stuck and why.
            what = f"{waiting} files await promotion"
            message = (f"{what}, failing: {error}" if error else what) + (
                "" if message == "nothing to publish" else f"; {message}")
            ok = ok and not error
        if res is not None and res.conflict_paths:
            log.info("%s: %d paths published by another writer with other bytes (kept): %s",
                     self.cfg.name, res.conflicts, ", ".join(res.conflict_paths[:5]))
            self.conflict_paths = (self.conflict_paths + res.conflict_paths)[-20:]
        self.last_publish = {
            "ok": ok, "message": message, "time": time.time(),
            "seq": res.seq if res else None, "added": res.added if res else 0,
            "conflicts": res.conflicts if res else 0,
            "pending_promotion": waiting, "promotion_error": error,
        }
        return self.last_publish

    def refresh_once(self) -> dict[str, Any]:
        # A newer generation is added to the rows: the staged one's must be written first.
        self.lower.indexed.wait()
        # One refresh at a time (the periodic one, publish's, the control command's):
        # a second one could report the new seq before the first told the view which
        # replaced paths changed, and its caller would still see the old version.
        with self._refresh_lock:
            return self._refresh_locked()

    def _refresh_locked(self) -> dict[str, Any]:
        if self.root is None:
            self._open_root()
            if self.root is None:
                return {"ok": False, "message": f"shared root unavailable: {self.root_error}"}
        try:
            seq = self.ingest_latest(self.served_seq)
        except (CasfsError, OSError) as e:
            self.counters.inc("refresh_errors")
            log.warning("%s: refresh failed: %s", self.cfg.name, e)
            return {"ok": False, "message": str(e)}
        if seq is not None and seq > self.served_seq:
            # Entries only ever get added, and each path's bytes never change, so
            # raising max_seq never changes an entry a reader has seen.
            self.lower.max_seq = seq
            if self.lower.staged:  # the indexer failed; this ingest wrote every row
                self.lower.finish()
            if self._replaced_pending:
                changed, self._replaced_pending = sorted(self._replaced_pending), set()
                self._replaced_changed(changed)
            added, self._added_pending = self._added_pending, []
            if added and self.ops is not None:
                self.ops.lower_added(added)
            self.served_seq = seq
            self.counters.inc("refreshes")
            if self.cfg.mode == "dir":
                self._refresh_replaced_dir()
                self._restore_dir()
        return {"ok": True, "served_seq": self.served_seq}

    def flush_counters(self) -> None:
        self.cache.flush_touches()  # the LRU hits of warm opens (flushed_elsewhere)
        snap = self.counters.snapshot()
        delta = {k: v - self._flushed.get(k, 0) for k, v in snap.items()}
        if any(delta.values()):
            self.index.add_counters(self.cfg.name, delta)
            self._flushed = snap
        self.index.sync()

    def pending_publication(self) -> int:
        return self.index.count_pending(self.cfg.namespace)

    def status(self) -> dict[str, Any]:
        return {
            "name": self.cfg.name,
            "family": self.cfg.family,
            "mode": self.cfg.mode,
            "namespace": self.cfg.namespace,
            "mountpoint": str(self.cfg.mountpoint),
            "root": str(self.cfg.root),
            "root_available": self.root is not None,
            "root_error": self.root_error,
            "served_seq": self.served_seq,
            "restored_entries": self.restored_entries,
            "pid": os.getpid(),
            "uptime": round(time.time() - self.started, 1),
            "pending_promotion": self.tracker.pending(),
            "promotion_error": self._promotion_state()[1],
            "pending_publication": self.pending_publication(),
            "last_publish": self.last_publish,
            "conflict_paths": self.conflict_paths,
            # The two readiness points, in seconds from the mount's start: the job may
            # start / the profile's hot set is local (before mount-ready with wait_warm).
            "mount_ready_s": self.mount_ready_s,
            "warm_ready_s": self.prefetcher.warm_ready_s if self.prefetcher else None,
            "counters": self.counters.snapshot(),
            "open_watch": self._open_watch_status(),
            "fetch_worker": fetchproc.status_of(self.cfg.state_dir / "objects"),
            "promote_worker": promoteproc.status_of(self.cfg.state_dir),
        }

    # --- serving ------------------------------------------------------------
    async def _handle(self, req: dict[str, Any]) -> dict[str, Any]:
        cmd = req.get("cmd")
        if cmd in ("status", "stats"):
            # In a thread: status reads the index, which must not stall FUSE requests.
            return {"ok": True, **await trio.to_thread.run_sync(self.status)}
        if cmd == "publish":
            t0 = time.monotonic()
            await trio.to_thread.run_sync(self.promote_once, True, abandon_on_cancel=True)
            promote_s = time.monotonic() - t0  # apart from publication (issue 11's figures)
            reply = await trio.to_thread.run_sync(self.publish_once, abandon_on_cancel=True)
            return {**reply, "promote_s": round(promote_s, 4)}
        if cmd == "refresh":
            return await trio.to_thread.run_sync(self.refresh_once, abandon_on_cancel=True)
        return {"ok": False, "error": f"unknown command {cmd!r}"}

    async def _every(self, seconds: float, fn: Callable[[], object]) -> None:
        while True:
            await trio.sleep(seconds)
            try:
                # Abandonable: a stalled shared root must not hold up shutdown.
                await trio.to_thread.run_sync(fn, abandon_on_cancel=True)
            except Exception:
                log.exception("%s: background task %s failed", self.cfg.name,
                              getattr(fn, "__name__", fn))

    def timers(self) -> list[tuple[float, Callable[[], object]]]:
        """The periodic work of a served namespace: (interval in seconds, function)."""
        cfg = self.cfg
        return [(max(0.2, min(1.0, cfg.stable_after / 2)), self.promote_once),
                (cfg.publish_interval, self._publish_if_pending),
                (cfg.refresh_interval, self.refresh_once),
                (2.0, self.flush_counters),
                (USE_TICK_S, self.record_reads)]

    async def _background(self, nursery: trio.Nursery) -> None:
        await nursery.start(control.serve_control, self.cfg.socket_path, self._handle)
        for seconds, fn in self.timers():
            nursery.start_soon(self._every, seconds, fn)
        self.start_prefetch()

    # --- access profiles and prefetch ------------------------------------------
    def _lower_opened(self, path: str, digest: str) -> None:
        if self.uses.recorded(path):
            return  # the profile, the read record and prefetch saw it this epoch
        self.recorder.opened(path)
        self.uses.opened(path)
        self.counters.inc("opens_recorded")
        if self.prefetcher is not None:
            self.prefetcher.opened(digest)

    def _observed_open(self, rel: str) -> bool:
        """An open the kernel served without casfs (overlay: fanotify; dir: inotify).

        Recorded if ``rel`` is a published entry. Returns True: no more events
        for this file are needed this epoch.
        """
        if self.uses.recorded(rel) or rel in self._not_lower:
            return True
        node = self.lower.lookup(rel)
        if isinstance(node, Entry):
            self._lower_opened(rel, node.digest)
        elif len(self._not_lower) < reads.MAX_PATHS:
            self._not_lower.add(rel)  # the job's own files, scratch: no lookup next time
        return True

    def _observed_opens(self, rels: list[str]) -> None:
        """``_observed_open`` for a batch (overlay's listener): one index read for all,
        one lock per log for all (this runs beside the job)."""
        seen, not_lower = self.uses.recorded, self._not_lower
        # once each: a file opened again before its ignore mark was set comes twice
        todo = list(dict.fromkeys(r for r in rels if not seen(r) and r not in not_lower))
        if not todo:
            return
        paths: list[str] = []
        digests: list[str] = []
        for rel, digest in zip(todo, self.lower.digests_many(todo), strict=True):
            if digest is not None:
                paths.append(rel)
                digests.append(digest)
            elif len(not_lower) < reads.MAX_PATHS:
                not_lower.add(rel)
        if not paths:
            return
        self.recorder.opened_many(paths)
        self.uses.opened_many(paths)
        self.counters.inc("opens_recorded", len(paths))
        if self.prefetcher is not None:
            self.prefetcher.opened_many(digests)

    def _profile_options(self, published: list[Entry]) -> dict[str, Any]:
        """The record's ``profile`` (casfs.promote.publisher.profile_options), in the
        publishing thread of this process (no promotion worker)."""
        opened = self.recorder.paths()
        out = profile_options(self._gens(), self.cfg.namespace, opened, published,
                              self.counters)
        if out:
            self.recorder.mark_published(len(opened))
        return out

    def _hot_set(self) -> list[str]:
        """The paths of the served generation's profile, hottest first ([] if none)."""
        if self.root is None or not self.served_seq:
            return []
        rec = self._gens().record(self.cfg.namespace, self.served_seq)
        digest = rec.options.get("profile")
        if not isinstance(digest, str):
            return []
        paths, _ = profile.decode(self.root.objects.get_bytes(digest))
        return [p for p, _ in paths]

    def start_prefetch(self, paced: bool = True) -> None:
        if not self.cfg.prefetch or self.prefetcher is not None or self.root is None:
            return
        self.prefetcher = prefetch.Prefetcher(
            self.cache, self.lower, self.counters,
            ondemand_busy=lambda: self.ondemand_fetches > 0,
            max_bytes=min(self.cfg.cache_max_bytes, 4 << 30) // 2,
            origin=self._t0, paced=paced)
        self.prefetcher.start(self._hot_set)

    def wait_warm(self, timeout: float) -> None:
        """Hold mount-ready until the hot set is local, at most ``timeout`` seconds.

        Overlay mode builds its links layer after this, so the kernel serves the
        hot set natively (the links layer is fixed for the life of the mount).
        Nothing runs on the mount yet: the bandwidth bound is lifted until the
        wait ends; on timeout the job starts with what is local and the rest
        keeps arriving in the background (served by the FUSE layer)."""
        self.start_prefetch(paced=False)
        p = self.prefetcher
        if p is None:  # prefetch off, or no shared root: nothing to wait for
            return
        t0 = time.monotonic()
        warm = p.wait(timeout)
        p.pace()
        self.counters.inc("warm_waits")
        if not warm and not self._stopping:
            self.counters.inc("warm_wait_timeouts")
            log.warning("%s: not warm-ready after %.1fs: mounting with what is local",
                        self.cfg.name, time.monotonic() - t0)
        # The hot set's cache rows (one LRU touch per object fetched) and counters are
        # written now, while nothing runs, not by the first timer tick beside the job.
        try:
            self.flush_counters()
        except Exception:  # the periodic flush tries again
            log.exception("%s: flushing counters after the warm wait failed", self.cfg.name)

    def stop_prefetch(self) -> None:
        """Cancel the background fetches (prefetch, read-ahead): the namespace goes."""
        if self.prefetcher is not None:
            self.prefetcher.stop()
        if self.readahead is not None:
            self.readahead.stop()

    def torn_writes(self, since: float, until: float) -> int:
        """A job of this namespace was killed: what changed from ``since`` to ``until``
        (monotonic) may be half-written (a linker's output, a cache file written in
        place). It is never promoted, and removed from the upper at release (a miss
        next time, never a torn file on other nodes). Returns how many files."""
        n = self.tracker.hold(since, until)
        if n:
            self.counters.inc("torn_held", n)
            log.warning("%s: a job was killed: %d files it may have been writing are not "
                        "published", self.cfg.name, n)
        return n

    def _discard_held(self) -> None:
        """Remove what ``torn_writes`` held from the upper (fuse mode: the namespace
        is being released, nothing serves it now)."""
        if self.cfg.mode != "fuse":
            return
        try:
            base = beneath.open_base(self.cfg.upper)
        except OSError as e:
            log.warning("%s: cannot remove torn files: %s", self.cfg.name, e)
            return
        try:
            for rel in self.tracker.held():
                try:  # beneath the upper, no symlink followed: never outside it
                    if stat.S_ISDIR(beneath.lstat(base, rel).st_mode):
                        continue
                    beneath.unlink(base, rel)
                except OSError as e:
                    log.warning("%s: cannot remove %s: %s", self.cfg.name, rel, e)
                    continue
                self.tracker.removed(rel)
                self.counters.inc("torn_discarded")
        finally:
            os.close(base)

    def final_publication(self) -> None:
        """Promote and publish everything stable: the namespace is being released.

        A publication that finds a promoted object gone puts its path back to
        promotion, for the next round; at release no next round comes, so it
        gets one more here.
        """
        self._discard_held()
        for _ in range(2):
            lost = self.counters.get("promoted_objects_lost")
            self.promote_once(True)
            self.publish_once(True)
            if self.counters.get("promoted_objects_lost") == lost:
                return

    def _publish_if_pending(self) -> None:
        if self.pending_publication():
            self.publish_once()

    async def _shutdown(self) -> None:
        """Final promotion and publication, bounded by shutdown_timeout."""
        self._stopping = True
        await trio.to_thread.run_sync(self.stop_prefetch)
        with trio.move_on_after(self.cfg.shutdown_timeout) as scope:
            await trio.to_thread.run_sync(self.final_publication, abandon_on_cancel=True)
        if scope.cancelled_caught:
            log.warning("%s: final publication did not finish within %.0fs", self.cfg.name,
                        self.cfg.shutdown_timeout)

    def mark_ready(self) -> None:
        """Mount-ready: a job may start on the namespace now (``mount_ready_s``)."""
        self.mount_ready_s = round(time.monotonic() - self._t0, 3)

    def serve(self, on_ready: Callable[[], None] | None = None) -> None:
        from casfs.node import guard

        cfg = self.cfg
        guard.refuse_stacking(cfg.mountpoint, f"namespace {cfg.namespace}")
        for other in control.registered(cfg.run_dir):
            # (Same mount point: a supervisor's replacement for a worker it gave up on.)
            if (other.get("name") == cfg.name and other.get("pid") != os.getpid()
                    and other.get("mountpoint") != str(cfg.mountpoint)):
                raise UsageError(f"a casfs mount named {cfg.name} already runs at"
                                 f" {other.get('mountpoint')} (pid {other.get('pid')}):"
                                 " give this one another --name")
        cfg.mountpoint.mkdir(parents=True, exist_ok=True)

        def ready() -> None:
            self.mark_ready()
            self._entry = {
                "name": cfg.name, "pid": os.getpid(), "mountpoint": str(cfg.mountpoint),
                "namespace": cfg.namespace, "socket": str(cfg.socket_path),
                "family": cfg.family,
            }
            control.write_registry(cfg.run_dir, cfg.name, self._entry)
            log.info("%s: serving %s@%d at %s", cfg.name, cfg.namespace, self.served_seq,
                     cfg.mountpoint)
            if on_ready:
                on_ready()

        from casfs.node.reclaim import record_served

        record_served(cfg)  # idle namespaces' node state is reclaimed (casfs.node.reclaim)
        # Under a supervisor the mount point stays read-only and empty between workers.
        guarded = self.ops is not None and cfg.guard and guard.install(cfg.mountpoint,
                                                                      cfg.state_dir)
        try:
            if self.ops is None:
                self._serve_dir(ready)
            elif self.overlay_paths is not None:
                self._serve_overlay(ready)
            else:
                session.serve(self.ops, cfg.mountpoint, fsname=f"casfs-{cfg.name}",
                              allow_other=cfg.allow_other, debug=cfg.debug, on_ready=ready,
                              background=self._background, on_shutdown=self._shutdown)
        finally:
            if guarded:
                guard.remove(cfg.mountpoint)  # a clean stop; a crash leaves it (the point)
            record_served(cfg)
            control.remove_registry(cfg.run_dir, cfg.name)
            self.flush_counters()
            self.close()

    # --- overlay mode -----------------------------------------------------------
    def _serve_overlay(self, ready: Callable[[], None]) -> None:
        paths = self.overlay_paths
        assert paths is not None and self.ops is not None
        cfg = self.cfg
        from casfs.view import whiteout

        whiteout.sweep(paths.upper)  # whiteouts last as long as the view that made them
        # The merged root shows the upper's owner and mode: the tenant's, never wider.
        os.chmod(paths.upper, self._root_mode)
        paths.fuse.mkdir(parents=True, exist_ok=True)
        paths.fuse_upper.mkdir(parents=True, exist_ok=True)

        async def background(nursery: trio.Nursery) -> None:
            # The FUSE layer serves from here on; mounting the overlay looks up its
            # root, so it must happen off this (the FUSE) thread.
            if cfg.wait_warm > 0:
                await trio.to_thread.run_sync(self.wait_warm, cfg.wait_warm)
            if self._stopping:  # stopped while waiting: never mount, never say READY
                await trio.sleep_forever()
            await trio.to_thread.run_sync(self._mount_overlay)
            await self._background(nursery)

        async def shutdown() -> None:
            await self._shutdown()
            await trio.to_thread.run_sync(self._unmount_overlay)

        try:
            session.serve(self.ops, paths.fuse, fsname=f"casfs-{cfg.name}-lower",
                          allow_other=True, debug=cfg.debug, read_only=True,
                          on_ready=ready, background=background, on_shutdown=shutdown)
        finally:
            self._unmount_overlay()

    def _mount_overlay(self) -> None:
        paths = self.overlay_paths
        assert paths is not None
        t0 = time.monotonic()
        present = self._presenter()
        local = self._local_digests()  # one listing, not a stat per entry
        entries = self.lower.walk() if local else iter(())  # a fresh node: nothing to link

        def local_path(e: Entry) -> str | None:
            if e.digest not in local:
                return None
            p = str(self.cache.path_of(e.digest))
            try:  # a damaged local copy is never linked (the FUSE layer refetches it)
                return p if os.stat(p).st_size == e.size else None
            except OSError:
                return None

        rep = overlay.build_links(paths.links, entries, local_path, present,
                                  dir_mode=self._root_mode, owner=self._tenant_owner())
        self.counters.inc("overlay_linked", rep.linked)
        self.counters.inc("overlay_generated", rep.generated)
        self.counters.inc("overlay_sealed_dirs", rep.sealed_dirs)
        overlay.mount(self.cfg.mountpoint, paths)
        self._overlay_mounted = True
        self._watcher = dirmode.watch(paths.upper, self.tracker)
        self._watch_opens()
        log.info("%s: overlay at %s: %d linked, %d generated, %d via FUSE (%.2fs)",
                 self.cfg.name, self.cfg.mountpoint, rep.linked, rep.generated, rep.absent,
                 time.monotonic() - t0)

    def _watch_opens(self) -> None:
        """Overlay mode: the kernel serves linked files without casfs; fanotify tells."""
        from casfs.view.opens import FanotifyOpens, OpenWatchProcess

        # The per-event work runs in a child process at low CPU priority, off the
        # job's cores and this process's GIL; only the recording runs here.
        # CASFS_OPEN_WATCH_PROCESS=0: a thread of this process instead (as before);
        # "off": no listener (benchmarks).
        w: FanotifyOpens | OpenWatchProcess
        how = os.environ.get("CASFS_OPEN_WATCH_PROCESS", "1")
        if how == "off":
            log.warning("%s: CASFS_OPEN_WATCH_PROCESS=off: opens of linked files are not "
                        "recorded", self.cfg.name)
            return
        if how == "0":
            w = FanotifyOpens(self.cfg.mountpoint, self._observed_open)
        else:
            w = OpenWatchProcess(self.cfg.mountpoint, self._observed_open,
                                 on_opens=self._observed_opens)
        try:
            w.start()
        except OSError as e:  # retention and profiles then see FUSE-served opens only
            self.counters.inc("open_watch_unavailable")
            log.warning("%s: opens of linked files are not recorded: %s", self.cfg.name, e)
            return
        self._open_watch = w
        self.uses.on_epoch.append(w.reset)

    def _open_watch_status(self) -> dict[str, Any] | None:
        """Overlay mode's open listener: its pid, paths received, restarts, failed."""
        w = self._open_watch
        if w is None:
            return None
        return {"pid": w.pid, "events": w.events, "restarts": w.restarts, "failed": w.failed}

    def _unmount_overlay(self) -> None:
        if self._open_watch is not None:
            self._open_watch.stop()
            self.counters.inc("open_events", self._open_watch.events)
            self.counters.inc("open_watch_restarts", self._open_watch.restarts)
            self._open_watch = None
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher.join(timeout=10)
            self._watcher = None
        if self._overlay_mounted:
            overlay.unmount(self.cfg.mountpoint)
            self._overlay_mounted = False

    def _local_digests(self) -> set[str]:
        """Digests of every object in the local cache (a listing of its fan-out dirs)."""
        out: set[str] = set()
        try:
            fans = list(os.scandir(self.cache.directory))
        except FileNotFoundError:
            return out
        for fan in fans:
            if len(fan.name) == 2 and fan.is_dir(follow_symlinks=False):
                with os.scandir(fan.path) as it:
                    out.update(fan.name + f.name for f in it if len(f.name) == 62)
        return out

    def _presenter(self) -> Callable[[Entry, str], bytes | None] | None:
        """Bytes to generate for files the family presents differently (never linked)."""
        relocator = self.relocator
        if relocator is None:
            return None

        def present(e: Entry, src: str) -> bytes | None:
            if relocator.size(e) is None:
                return None
            with open(src, "rb") as f:
                # Not the announced stored form: an empty file, which Triton takes for a miss.
                return relocator.content(e, f.read()) or b""

        return present

    # --- dir mode -------------------------------------------------------------
    def _dir_owner(self) -> tuple[int, int] | None:
        """Whose fs credentials write the dir-mode directory (the tenant's, not root's)."""
        return (self.tenant.uid, self.tenant.gid) if self.tenant is not None else None

    def _restore_dir(self) -> None:
        fresh = [e for e in self.lower.walk() if e.path not in self._dir_offered]
        written = dirmode.restore(self.cfg.mountpoint, fresh, self.cache, self.counters,
                                  self.restore_stamps, present=self._presenter(),
                                  owner=self._dir_owner(), refused=self._dir_refused)
        # Offered = now in the directory; a failed fetch is tried again on the next refresh.
        self._dir_offered.update(dirmode.lstats(self.cfg.mountpoint, [e.path for e in fresh]))
        # Restored files are published already: record them so promotion skips them.
        self.index.add_promoted_many(self.cfg.namespace, written)
        self.index.mark_published(self.cfg.namespace, written, self.served_seq)

    def _refresh_replaced_dir(self) -> None:
        """Dir mode: newer published versions of replaced paths replace the local copies
        that are still a published version the job has not rewritten (the promoted
        record: restored, or this node's own, published, same size and mtime, no
        writer), atomically by rename (dirmode.replace_file). A copy the job wrote
        and has not published stays, is published, and wins in its turn."""
        paths, self._dir_replaced = sorted(self._dir_replaced), set()
        mp = self.cfg.mountpoint
        todo: list[tuple[Entry, os.stat_result]] = []
        local = dirmode.lstats(mp, paths)
        for p in paths:
            e = self.lower.lookup(p)
            rec = self.index.get_promoted(self.cfg.namespace, p)
            st = local.get(p)
            if st is None:
                continue  # absent: the restore puts the newest version in place
            if (isinstance(e, Entry) and rec is not None and rec.state == "published"
                    and stat.S_ISREG(st.st_mode) and rec.entry.digest != e.digest
                    and (rec.entry.size, rec.entry.mtime_ns) == (st.st_size, st.st_mtime_ns)
                    and not self.tracker.has_writers(p)):
                todo.append((e, st))
        busy = dirmode.open_for_writing(mp, [e.path for e, _ in todo]) if todo else set()
        done = [e for e, st in todo if e.path not in busy and dirmode.replace_file(
            mp, e, self.cache, st, self.restore_stamps, present=self._presenter(),
            owner=self._dir_owner(), refused=self._dir_refused)]
        if done:
            self.index.add_promoted_many(self.cfg.namespace, done)
            self.index.mark_published(self.cfg.namespace, done, self.served_seq)
            self.counters.inc("replaced_dir_swapped", len(done))
            log.info("%s: %d replaced paths refreshed in place", self.cfg.name, len(done))

    def _serve_dir(self, ready: Callable[[], None]) -> None:
        if self.rules.replaced:  # copies left by an earlier mount may be older versions
            self._dir_replaced.update(
                r.entry.path for r in self.index.iter_promoted(self.cfg.namespace)
                if r.state == "published" and self._is_replaced(r.entry.path))
            self._refresh_replaced_dir()
        self._restore_dir()
        observer = dirmode.watch(self.cfg.mountpoint, self.tracker, on_open=self._observed_open)
        try:
            trio.run(self._dir_main, ready)
        finally:
            observer.stop()
            observer.join(timeout=10)

    async def _dir_main(self, ready: Callable[[], None]) -> None:
        async with trio.open_nursery() as nursery:
            await self._background(nursery)
            # Catch SIGTERM before telling the parent we serve: a job that ends at once
            # is stopped right after READY, and the default action would skip the final
            # publication and the stats. As in the FUSE session, a second signal must
            # not cut the final publication: stop_signals swallows it.
            with session.stop_signals() as signals:
                ready()
                async for signum in signals:
                    log.info("%s: signal %d: shutting down", self.cfg.name, signum)
                    break
            # A job joining now would write after the final scan: the entry says we
            # stop, so the next job waits for our exit and spawns a fresh process
            # (casfs.node.dirshare).
            try:
                control.write_registry(self.cfg.run_dir, self.cfg.name,
                                       dict(self._entry, stopping=True))
            except OSError as e:  # a full state dir: the final publication still runs
                log.warning("%s: marking the registry entry stopping: %s", self.cfg.name, e)
            pausepoint("dir-final-publication")
            await self._shutdown()
            nursery.cancel_scope.cancel()

    def final_stats(self) -> dict[str, Any]:
        st = self.status()
        st["restored_entries"] = self.restored_entries
        return st

    def close(self) -> None:
        self._stop_indexing.set()
        if self._indexer is not None and self._indexer.is_alive():
            self._indexer.join()  # at most one chunk: then the index may be closed
        # The idle fds this namespace kept (a host releases namespaces all its life:
        # nothing else ever closes them).
        if self.ops is not None:
            self.ops.close_idle()
        self.cache.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


