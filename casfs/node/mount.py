"""One mount of one namespace: the composition of its parts.

    view (casfs.node.modes)  ->  publication (casfs.node.publishing)
                             ->  lower feed (casfs.node.lowerfeed)  ->  root link
    access recording (casfs.node.access) beside the view; the namespace's lock
    and served record (casfs.node.nsregistry); background tasks (casfs.node.tasks)

A ``MountService`` is built in this order: the namespace's lock, the link to the
shared root, the lower feed (which reads the newest generation before anything
is served), the writable directory given to the tenant, the local object
cache, the view of the configured mode, publication. ``serve`` runs the view
until it is stopped; a node's host instead attaches the view to its own FUSE
session and runs ``tasks()`` itself; both end with ``release()``.

Concurrency model: everything runs in one trio thread except blocking work
(LMDB writes of ingestion, hashing and compressing for promotion, shared-root
I/O of publication and refresh, object fetches), which goes to worker threads
via ``trio.to_thread`` or to worker processes. FUSE handlers never wait on
shared storage except for the one object a read must fetch.

Failure policy: the shared root may be missing, slow or hostile. Then lower
entries the index already knows still show (their objects may be cached
locally), everything else is a miss, upper files are served as usual, and
promotion/publication retry in the background.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from casfs import families
from casfs.errors import CasfsError
from casfs.index.memtree import StagedLowerTree
from casfs.index.node_index import NodeIndex
from casfs.index.objcache import LocalObjectCache, discard_cache_dir
from casfs.node import (
    compiletime,
    control,
    fetchproc,
    guard,
    handover,
    lifeline,
    nsregistry,
    preopen,
    promoteproc,
    quota,
    readahead,
)
from casfs.node.access import Access
from casfs.node.config import MountConfig
from casfs.node.lowerfeed import LowerFeed
from casfs.node.modes import (
    ModeServer,
    Serving,
    ViewParts,
    build,
    effective_mode,
    give_to_tenant,
)
from casfs.node.publishing import Context, Publication
from casfs.node.rootlink import RootLink, RootSource, fetch_worker
from casfs.node.tasks import Periodic
from casfs.promote.tracker import WriteTracker
from casfs.store.root import SharedRoot
from casfs.tenants import TenantPolicy
from casfs.util.flock import try_flock
from casfs.util.paths import is_valid_relpath
from casfs.view import session

log = logging.getLogger(__name__)

# dir mode handover: how long past its shutdown_timeout a predecessor may take to exit.
LEAVE_MARGIN = 15.0
ROOT_WAIT_POLL_S = 0.25  # a warm wait's look for a root unavailable at the start (stop)
USE_TICK_S = 15.0  # how often a mount checks whether its read record is due (casfs.node.usage)


def sweep_view_state(run_dir: Path, name: str) -> None:
    """Remove the view state files (casfs.view.op_restore.state_paths; the node host's
    ``<name>.<pid>.ns<slot>.inodes``) of mount ``name``'s processes that are gone:
    nobody adopts them now."""
    for suffix in (".inodes", ".handles"):
        for p in run_dir.glob(f"{glob.escape(name)}.*{suffix}"):
            pid = p.name[len(name) + 1:-len(suffix)].split(".")[0]
            if pid.isdigit() and int(pid) != os.getpid() and not control.running(int(pid)):
                with contextlib.suppress(OSError):
                    p.unlink()


class MountService:
    """One namespace: index, promotion, publication, refresh, and its view.

    ``hosted``: the namespace is one directory of a multi-namespace mount
    (casfs.node.host), which checked the mount base and owns the FUSE session;
    its mount point lies inside the host's own mount, so nothing here may touch
    it (that would wait on the host's FUSE loop).
    """

    def __init__(self, cfg: MountConfig, *, hosted: bool = False,
                 wait_for_reclaim: bool = True, replace: bool = False,
                 adopt: tuple[int, int] | None = None) -> None:
        """``replace``: take the mount point over from the mount process serving it
        (casfs.node.handover; HandoverUnavailable if it cannot hand over).
        ``adopt``: (fd, pid): the FUSE connection of crashed process ``pid`` of this
        mount (fuse mode), held by the supervisor: serve it (casfs.view.adopt), and
        read its inode numbers and handles as the dead process left them."""
        if not hosted:
            cfg.check()
        self.cfg = cfg
        self.rules = families.rules(cfg.family, cfg.scratch_patterns)
        self.counters = preopen.counters(cfg)  # with what a pre-open read for us, if any
        self.tracker = WriteTracker()
        self.started = time.time()
        self._t0 = time.monotonic()  # the origin of mount_ready_s and warm_ready_s
        self.mount_ready_s: float | None = None
        self._stopping = False
        self._entry: dict[str, Any] = {}  # our registry entry, once we serve
        self._flushed: dict[str, int] = {}
        # Tenants: the root trusts only what this mount's tenant could have written,
        # and the directory handed to jobs is the tenant's alone (casfs.tenants).
        self.policy = TenantPolicy.from_dict(cfg.tenants) if cfg.tenant else None
        self.tenant = self.policy.tenant(cfg.tenant) if self.policy else None
        self.index = NodeIndex.open(cfg.state_dir)
        if self.index.take_repaired():
            discard_cache_dir(cfg.state_dir / "objects")
        if cfg.mode != "dir" and fetchproc.enabled():
            fetch_worker(cfg)  # its start overlaps ours (casfs.node.rootlink)
        # Replacements (casfs.node.handover): this session's part, the mount process we
        # take over from (it gives up the namespace's lock first), and our answers to one.
        self.handing = handover.Handing(kind="overlay" if cfg.mode == "overlay" else "fuse")
        self.predecessor = None
        left = None
        if replace and not hosted:
            if cfg.mode == "dir":  # a plain directory: the predecessor leaves it in place
                left = handover.leave(cfg.run_dir, cfg.name, cfg.mountpoint,
                                      cfg.shutdown_timeout + LEAVE_MARGIN)
            else:  # a FUSE mount or an overlay: ours goes beneath, the old one steps aside
                self.predecessor = handover.prepare(cfg.run_dir, cfg.name, cfg.mountpoint,
                                                    self.handing.kind)
        if self.predecessor is not None:
            self.handing.stage = handover.stage_dir(cfg.run_dir, cfg.name)
        self._periodic: list[Periodic] = []
        self.drain = handover.Drain(cfg.mountpoint, cfg.run_dir, self.handing,
                                    give_locks=self.give_lock, retake_locks=self.retake_lock,
                                    writing=self.writing,
                                    aside=self.stepped_aside,
                                    leave=self.leave_dir if cfg.mode == "dir" else None)
        self._lock_fd: int | None = nsregistry.take_lock(cfg, wait_for_reclaim)
        self.adopt = adopt
        try:
            self._start(cfg, hosted, left)
        except BaseException:
            # All or nothing: a start that fails after the lock (a bug, a hostile store
            # document, a full disk) leaves nothing running and the lock given back, or
            # the namespace stayed refused ("already mounted") while this process ran:
            # for a node's host, every job of it uncached until casfsd restarted.
            self._abandon()
            raise

    def _start(self, cfg: MountConfig, hosted: bool, left: int | None) -> None:
        """__init__'s part after the namespace's lock (see ``_abandon``)."""
        self.link = RootLink(cfg, self.policy, self.index, self.counters)
        self.link.connect()
        self.feed = LowerFeed(cfg, self.rules, self.index, self.link, self.counters)
        guard.detach_foreign(cfg.mountpoint, f"namespace {cfg.namespace}")  # (before any stat)
        if not hosted and self.adopt is None:  # an adopted mount point waits for us: untouched
            session.clear_stale_mount(cfg.mountpoint)  # a dead mount (ENOTCONN) fails mkdir
        quota.prepare(cfg)  # the tenant's own filesystem ([quota] mechanism "loopfs")
        cfg.writable_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        root_mode = give_to_tenant(cfg.writable_dir, self.tenant)
        self.access = Access(cfg, self.lower, self.link, self.counters, self._t0)
        source = RootSource(self.link, self.counters, self.access.ondemand)
        self.cache = LocalObjectCache(
            cfg.state_dir / "objects", self.index, source, cfg.cache_max_bytes,
            filler=source if fetchproc.enabled() else None, counters=self.counters,
            # CASFS_VERIFY_CACHE=0: trust cache files without hashing (benchmarks only)
            verify_first_open=os.environ.get("CASFS_VERIFY_CACHE", "1") != "0",
        )
        self.cache.flushed_elsewhere = True  # flush_counters, every 2 s in a worker thread
        cfg = self.cfg = effective_mode(cfg, self.counters)
        # Path-bearing files (Triton groups) are stored path-free and presented with
        # the path this namespace is served at: a cache works at any path.
        relocator = (families.Relocator(self.rules, str(cfg.mountpoint))
                     if self.rules.path_bearing else None)
        self.server: ModeServer = build(ViewParts(
            cfg=cfg, rules=self.rules, index=self.index, tracker=self.tracker,
            counters=self.counters, lower=self.lower, cache=self.cache, access=self.access,
            served_seq=lambda: self.feed.served_seq, tenant=self.tenant, root_mode=root_mode,
            relocator=relocator))
        # Never promote what a draining predecessor's jobs write (casfs.node.handover).
        self.server.busy = handover.busy_hook(cfg.run_dir, cfg.namespace,
                                              self.server.busy or self._tracked_writers,
                                              lambda pid, rels: self.publication.drained_torn(
                                                  pid, rels),
                                              lambda: not self.handing.stepped_aside)
        if self.server.has_fuse and fetchproc.enabled():
            source.worker()  # started now, so a first fetch does not wait
        # A miss fetches the rest of its directory (objects fetched on open only).
        self.readahead = (readahead.ReadAhead(self.cache, self.lower, self.counters,
                                              pack_of=source.pack_of)
                          if cfg.readahead and self.server.has_fuse else None)
        self.server.wire(self.access.lower_opened,
                         self.readahead.missed if self.readahead is not None else None)
        # Compile time per entry (casfs.node.compiletime): first misses (the FUSE view's
        # negative lookups; none in dir mode) and the seconds hits save.
        self.miss_clock = compiletime.MissClock(self.rules, self.counters)
        if getattr(self.server, "ops", None) is not None:
            self.server.ops.on_lookup_miss = self.miss_clock.missed
        self.access.count_savings(compiletime.Savings(
            self.rules, self.counters, compiletime.parts_loader(self.link.gens, cfg.namespace),
            lambda: self.feed.served_seq))
        self.publication = Publication(
            Context(cfg, self.rules, self.index, self.tracker, self.counters, self.link,
                    self.lower, self.access.recorder),
            self.server, self.access.uses,
            in_worker=self.server.has_fuse and promoteproc.enabled(),
            refresh=self.refresh_once, profile_options=self.access.profile_options)
        self.publication.clock = self.miss_clock
        self.publication.savings = self.access.savings
        if cfg.ingredients:  # a configured mount or a dir/overlay casfs run
            self.set_ingredients(cfg.ingredients)
        self._keep_view_state(hosted)
        self.server.release_published_replaced()
        self.publication.discard_recorded_torn()  # a killed job's, before a stop: never published
        recovered = self.publication.promoter()
        if recovered is not None:
            def scan() -> int:
                n = recovered.scan_all()
                if n:
                    log.info("%s: %d upper files from before are awaiting promotion",
                             cfg.name, n)
                return n

            self.server.recover(scan, left is not None or self.predecessor is not None)
        self.feed.listener = self.server
        self.feed.start(held=cfg.prefetch)  # until the prefetch's plan or fetch ends

    def _abandon(self) -> None:
        """The start failed after the namespace's lock: stop and close what it began
        (the indexer thread, the view's fds and journals, the object cache's shares),
        give the lock back, and drop this start's reference to the node index. Each
        step runs whatever an earlier one raised."""
        self._stopping = True
        if (access := getattr(self, "access", None)) is not None:
            access.stopping = True
        steps: list[tuple[str, Callable[[], object]]] = []
        if (feed := getattr(self, "feed", None)) is not None:
            steps.append(("lower feed", feed.close))  # before the index closes
        if (ahead := getattr(self, "readahead", None)) is not None:
            steps.append(("read-ahead", ahead.stop))
        if (server := getattr(self, "server", None)) is not None:
            steps.append(("view", server.close))
        if (cache := getattr(self, "cache", None)) is not None:
            steps.append(("object cache", cache.close))
        steps += [("lock", self.give_lock), ("drain", self.drain.close),
                  ("index", self.index.close)]
        for what, step in steps:
            try:
                step()
            except Exception:
                log.exception("%s: closing the %s of a failed start", self.cfg.name, what)


    def _keep_view_state(self, hosted: bool) -> None:
        """A fuse mode mount of its own, or an overlay mode one's FUSE layer on the plain
        layers, journals its inodes and handles for a process that adopts its connection
        after a crash (docs/reliability.md, "Crashes"). (An overlay on private layers:
        their names carry the pid, and the adopter's would differ.)"""
        cfg = self.cfg
        # A successor (or a mount while one drains) stacks on layers of its own.
        self.private_layers = self.adopt is None and (
            self.predecessor is not None or nsregistry.draining(cfg.run_dir, cfg.namespace))
        if (hosted or self.server.name not in ("fuse", "overlay")
                or (self.server.name == "overlay" and self.private_layers)):
            if self.adopt is not None:
                raise CasfsError(f"{cfg.name}: only a fuse or overlay mode mount can adopt a"
                                 " connection")
            return
        cfg.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.adopt is None:
            sweep_view_state(cfg.run_dir, cfg.name)
        self.server.ops.keep_state(cfg.run_dir, cfg.name,
                                   self.adopt[1] if self.adopt is not None else None)

    # --- the parts' state, as callers knew it ------------------------------------------
    @property
    def root(self) -> SharedRoot | None:
        return self.link.root

    @property
    def root_error(self) -> str | None:
        return self.link.error

    @property
    def lower(self) -> StagedLowerTree:
        return self.feed.lower

    @property
    def served_seq(self) -> int:
        return self.feed.served_seq

    @property
    def restored_entries(self) -> int:
        return self.feed.restored_entries

    @property
    def ops(self) -> Any:
        """The FUSE operations a host attaches (None in dir mode)."""
        return self.server.ops

    @property
    def last_publish(self) -> dict[str, Any] | None:
        return self.publication.last_publish

    # --- what jobs, hosts and control commands ask ---------------------------------------
    def set_ingredients(self, ingredients: object) -> None:
        self.publication.set_ingredients(ingredients)

    def wait_indexed(self, timeout: float | None = None) -> bool:
        return self.feed.wait_indexed(timeout)

    def refresh_once(self) -> dict[str, Any]:
        return self.feed.refresh()

    def promote_once(self, final: bool = False) -> int:
        return self.publication.promote_once(final)

    def publish_once(self, final: bool = False) -> dict[str, Any]:
        return self.publication.publish_once(final)

    def pending_publication(self) -> int:
        return self.publication.pending_publication()

    def torn_writes(self, since: float, until: float) -> int:
        return self.publication.torn_writes(since, until)

    def final_publication(self) -> None:
        self.publication.final_publication()

    def flush_counters(self) -> None:
        self.cache.flush_touches()  # the LRU hits of warm opens (flushed_elsewhere)
        snap = self.counters.snapshot()
        delta = {k: v - self._flushed.get(k, 0) for k, v in snap.items()}
        try:
            if any(delta.values()):
                self.index.add_counters(self.cfg.name, delta)
                self._flushed = snap
            self.index.sync()
        except (CasfsError, OSError) as e:  # a full state disk: kept for the next flush
            log.warning("%s: counters not saved this time: %s", self.cfg.name, e)

    def status(self) -> dict[str, Any]:
        cfg, pub = self.cfg, self.publication
        return {
            "name": cfg.name,
            "family": cfg.family,
            "mode": cfg.mode,
            "namespace": cfg.namespace,
            "mountpoint": str(cfg.mountpoint),
            "root": str(cfg.root),
            "root_available": self.root is not None,
            "root_error": self.root_error,
            "served_seq": self.served_seq,
            "restored_entries": self.restored_entries,
            "pid": os.getpid(),
            "uptime": round(time.time() - self.started, 1),
            "pending_promotion": self.tracker.pending(),
            "promotion_error": pub.promotion_state()[1],
            "pending_publication": self.pending_publication(),
            "last_publish": pub.last_publish,
            "conflict_paths": pub.conflict_paths,
            # The two readiness points, in seconds from the mount's start: the job may
            # start / the profile's hot set is local (before mount-ready with wait_warm).
            "mount_ready_s": self.mount_ready_s,
            "warm_ready_s": self.access.warm_ready_s,
            "counters": self.counters.snapshot(),
            "histograms": self.counters.histograms(),  # fetch_seconds, publish_seconds
            "open_watch": self.server.status(),
            "fetch_worker": fetchproc.status_of(cfg.state_dir / "objects"),
            "promote_worker": promoteproc.status_of(cfg.state_dir),
        }

    def final_stats(self) -> dict[str, Any]:
        """``status`` and the entries the mount's jobs missed, by name (bounded:
        casfs.node.compiletime.NAMED_CAP), for the summary's miss causes."""
        return {**self.status(), "missed_entries": self.miss_clock.named()}

    async def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        """A control-socket request (casfs status/stats/publish/refresh)."""
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
        if cmd == "handover":  # a successor takes the mount point over (casfs.node.handover)
            return await self.drain.handle(req)
        if cmd == "upper_changed":  # a drained predecessor's jobs changed these
            return await self.upper_changed(req)
        if cmd == "torn":  # casfs run: its job was killed ``late`` seconds ago
            late = req.get("late")
            late = min(float(late), 3600.0) if isinstance(late, (int, float)) and late >= 0 else 0.0
            now = time.monotonic()
            n = self.torn_writes(now - late - self.cfg.stable_after - 0.5, now + 2.0)
            return {"ok": True, "held": n}
        return {"ok": False, "error": f"unknown command {cmd!r}"}

    # --- background work -----------------------------------------------------------------
    def tasks(self) -> list[Periodic]:
        """The periodic work of a served namespace, for the mount or the host to run."""
        cfg, pub = self.cfg, self.publication

        def task(name: str, interval: float, fn: Callable[[], object]) -> Periodic:
            return Periodic(name, interval, fn, self.counters, cfg.name)

        return [task("promote_once", max(0.2, min(1.0, cfg.stable_after / 2)),
                     self.promote_once),
                task("publish_if_pending", cfg.publish_interval, pub.publish_if_pending),
                task("refresh_once", cfg.refresh_interval, self.refresh_once),
                task("flush_counters", 2.0, self.flush_counters),
                task("record_reads", USE_TICK_S, pub.record_reads)]

    def start_prefetch(self, paced: bool = True) -> None:
        self.publication.prepare()  # served now: the promotion worker's root, meanwhile
        self.access.start_prefetch(self.cache, lambda: self.access.hot_set(self.served_seq),
                                   paced, on_idle=self.feed.index_now)
        if self.access.prefetcher is None:
            self.feed.index_now()

    def wait_warm(self, timeout: float) -> None:
        """Hold mount-ready until the hot set is local, at most ``timeout`` seconds.

        Overlay mode builds its links layer after this, so the kernel serves the
        hot set natively (the links layer is fixed for the life of the mount).
        Nothing runs on the mount yet: the bandwidth bound is lifted until the
        wait ends; on timeout the job starts with what is local and the rest
        keeps arriving in the background (served by the FUSE layer).

        A shared root unavailable at the start is waited for within the same
        ``timeout`` (opened again every ROOT_RETRY_AFTER s): an overlay mounted
        over nothing would answer each name the job looks up with a miss for the
        life of the mount (overlayfs keeps the negative dentry when the FUSE layer
        gains the name later), so a 30 s stall at the start cost the whole cache."""
        deadline = time.monotonic() + timeout
        if self.link.root is None:
            self._wait_for_root(deadline)
        self.start_prefetch(paced=False)
        if self.access.wait_warm(max(0.0, deadline - time.monotonic())) is None:
            return
        # The hot set's cache rows (one LRU touch per object fetched) and counters are
        # written now, while nothing runs, not by the first timer tick beside the job.
        try:
            self.flush_counters()
        except Exception:  # the periodic flush tries again
            log.exception("%s: flushing counters after the warm wait failed", self.cfg.name)

    def _wait_for_root(self, deadline: float) -> None:
        """Until ``deadline``: open the root and serve its newest generation (a refresh)."""
        name, t0 = self.cfg.name, time.monotonic()
        self.counters.inc("warm_waits_for_root")
        log.warning("%s: shared root unavailable at the start: waiting up to %.0fs for it"
                    " (wait_warm) before mounting", name, deadline - t0)
        while not self.access.stopping:
            if self.refresh_once().get("ok"):  # each open bounded (ROOT_OPEN_TIMEOUT)
                log.info("%s: shared root available after %.1fs of the warm wait", name,
                         time.monotonic() - t0)
                return
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("%s: shared root still unavailable after %.1fs: mounting with"
                            " what is local", name, time.monotonic() - t0)
                return
            time.sleep(min(ROOT_WAIT_POLL_S, left))

    def stop_prefetch(self) -> None:
        """Cancel the background fetches (prefetch, read-ahead): the namespace goes."""
        self.access.stop_prefetch()
        if self.readahead is not None:
            self.readahead.stop()

    async def _background(self, nursery: trio.Nursery) -> None:
        pred = self.predecessor
        if pred is not None:
            # Before our control socket replaces the predecessor's (same path).
            await handover.take_over(self.cfg.mountpoint, self.handing, pred)
        self.drain.nursery = nursery
        await nursery.start(control.serve_control, self.cfg.socket_path, self.handle)
        self._periodic = self.tasks()
        for t in self._periodic:
            nursery.start_soon(t.run)
        self.start_prefetch()

    # --- handing over (casfs.node.handover) ---------------------------------------------
    def _tracked_writers(self, paths: list[str]) -> set[str]:
        return {p for p in paths if self.tracker.has_writers(p)}

    def writing(self) -> dict[str, list[str]]:
        """Paths open for writing, by namespace: a successor's promotion waits for them."""
        held = self.server.writing()
        return {self.cfg.namespace: self.tracker.writing() if held is None else held}

    def give_lock(self) -> list[str]:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        return [self.cfg.namespace]

    def leave_dir(self, successor: int) -> None:
        """dir mode: a successor takes the directory over. Stop as on SIGTERM (the final
        publication), but leave the directory and its bind in place; the successor
        waits for our exit."""
        log.info("%s: leaving the directory to pid %d: stopping", self.cfg.name, successor)
        self.server.keep_dir = True  # type: ignore[attr-defined]  # DirServer's
        lifeline.detach()  # our end is the successor's doing, not casfsd's
        os.kill(os.getpid(), signal.SIGTERM)  # DirServer's loop: the final publication

    def retake_lock(self) -> bool:
        if self._lock_fd is not None:
            return True
        fd = nsregistry.lock_file(self.cfg.run_dir, self.cfg.namespace, "lock")
        if not try_flock(fd):
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    async def stepped_aside(self, successor: Path | None = None) -> None:
        """What a drained mount no longer does: refresh (the successor serves the newer
        generations), prefetch. Promotion and publication of what it tracks go on; what
        its jobs change through it is told to the successor (``successor``: its control
        socket; this mount's own path by default) whose FUSE view caches the upper."""
        for t in self._periodic:
            if t.name == "refresh_once":
                t.stop()
        if self.server.name == "fuse":
            self.tracker.on_change = handover.teller(successor or self.cfg.socket_path,
                                                     self.cfg.namespace)
        await trio.to_thread.run_sync(self.server.stepped_aside)
        await trio.to_thread.run_sync(self.stop_prefetch)

    async def upper_changed(self, req: dict[str, Any]) -> dict[str, Any]:
        """A predecessor still draining changed upper paths of ours (casfs.node.handover):
        the view forgets what it caches of them, before the answer."""
        paths = req.get("paths")
        if req.get("ns") != self.cfg.namespace or not isinstance(paths, list):
            return {"ok": False, "error": f"not namespace {req.get('ns')!r}'s mount"}
        rels = [p for p in paths if isinstance(p, str) and is_valid_relpath(p)]
        await trio.to_thread.run_sync(self.server.upper_changed_elsewhere, rels)
        return {"ok": True}

    async def release(self, timeout: float | None = None) -> None:
        """Final promotion and publication, bounded by ``timeout`` (shutdown_timeout):
        the namespace is no longer served. Then ``close``."""
        self._stopping = self.access.stopping = True
        if self.handing.ended:  # handed over and let go of: the RELEASEs may never come
            self.tracker.all_closed()
        await trio.to_thread.run_sync(self.stop_prefetch)
        limit = self.cfg.shutdown_timeout if timeout is None else timeout
        with trio.move_on_after(limit) as scope:
            await trio.to_thread.run_sync(self.final_publication, abandon_on_cancel=True)
        if scope.cancelled_caught:
            log.warning("%s: final publication did not finish within %.0fs", self.cfg.name,
                        limit)
            # said in the job's summary line too (casfs.cli.summary), not only here
            self.publication.last_publish = {
                "ok": False, "time": time.time(),
                "message": f"the final publication did not finish within {limit:.0f}s (the"
                           " shared root slow or not answering); what it held is published"
                           " by this namespace's next mount on this node"}

    # --- serving -------------------------------------------------------------------------
    def mark_ready(self) -> None:
        """Mount-ready: a job may start on the namespace now (``mount_ready_s``)."""
        self.mount_ready_s = round(time.monotonic() - self._t0, 3)

    def serve(self, on_ready: Callable[[], None] | None = None) -> None:
        cfg = self.cfg
        adoption = None
        if self.adopt is not None:
            from casfs.view.adopt import Adoption

            adoption = Adoption(self.adopt[0])
        elif self.predecessor is None:  # a successor stacks beneath its predecessor's mount
            guard.refuse_stacking(cfg.mountpoint, f"namespace {cfg.namespace}")
        else:  # never a stat (mkdir below) through a tenant's server stacked on top
            guard.refuse_foreign(cfg.mountpoint, f"namespace {cfg.namespace}")
        for other in control.registered(cfg.run_dir):
            # (Same mount point: a supervisor's replacement for a worker it gave up on.)
            if (other.get("name") == cfg.name and other.get("pid") != os.getpid()
                    and other.get("mountpoint") != str(cfg.mountpoint)):
                from casfs.errors import UsageError

                raise UsageError(f"a casfs mount named {cfg.name} already runs at"
                                 f" {other.get('mountpoint')} (pid {other.get('pid')}):"
                                 " give this one another --name")
        if adoption is None:
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

        nsregistry.record_served(cfg)  # idle namespaces' node state is reclaimed
        # Under a supervisor the mount point stays read-only and empty between workers.
        guarded = self.server.has_fuse and cfg.guard and (
            guard.guarded(cfg.mountpoint) if adoption is not None
            else guard.install(cfg.mountpoint, cfg.state_dir))
        try:
            self.server.serve(Serving(ready=ready, background=self._background,
                                      shutdown=self.release, wait_warm=self.wait_warm,
                                      stopping=lambda: self._stopping,
                                      entry=lambda: self._entry, handing=self.handing,
                                      private_layers=self.private_layers,
                                      adoption=adoption))
        finally:
            if guarded and not self.handing.stepped_aside:  # else: a successor's mount point
                guard.remove(cfg.mountpoint)  # a clean stop; a crash leaves it (the point)
            nsregistry.record_served(cfg)
            control.remove_registry(cfg.run_dir, cfg.name, os.getpid())
            self.flush_counters()
            self.close()

    def close(self) -> None:
        self.feed.close()  # at most one chunk more: then the index may be closed
        self.server.close()
        self.cache.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self.drain.close()
