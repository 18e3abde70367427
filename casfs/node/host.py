"""The node's mount process: one FUSE session, a directory per (tenant, namespace).

    <base>/<tenant>/<namespace>/      e.g. /run/casfs/ns/u1000/triton-3f2a.../

casfsd runs one (supervised), or ``casfs run`` starts one when no daemon serves
the node. Jobs ask for their caches on the control socket (``lease``): the
host starts serving each namespace if needed (a MountService in hosted mode,
routed to by casfs.view.mux), shares it with every other job of that stack,
and releases it ``grace`` seconds after its last lease (casfs.node.leases: the
job's process, then any open file, mapping or cwd under the directory). A
released namespace is promoted and published first, then detached, without
remounting. ``casfs run``'s host (``exit_when_idle``) unmounts and exits once
it serves nothing and holds no lease: the last job out publishes.

Control protocol (JSON lines, casfs.node.control): ``lease`` {pid, caches:
[{family, namespace}], lease?} -> {lease, caches: [{family, namespace, path,
tenant}]}; ``release`` {lease, wait?} -> final stats of what it released;
``status``/``stats``/``publish``/``refresh`` -> {namespaces: [per-namespace
replies]}. The tenant comes from the peer's credentials (casfs.node.tenant).

What is served is written to ``<state>/run/host-served.json`` so a restarted
host (after a crash) serves the same namespaces at the same paths at once.

After a crash, casfsd holds the connection (casfs.node.fuseconn) and starts a
host with ``adopt`` (casfs.view.adopt): it serves the same connection, so jobs'
open files, mappings and cwds stay valid. For that the host keeps what the
kernel knows it by: each namespace's slot and the tenants' inode numbers (the
mux's ``layout``, in ``host-served.json`` with the pid that wrote it), each
namespace's inode journal (``<run>/<name>.<pid>.ns<slot>.inodes``) and the
mux's handle table (``<run>/<name>.<pid>.handles``); the adopter attaches
every namespace at its slot before it reads a request.

Replaced under running jobs (``spawn_host(replace=True)``: casfsd's restart of
it, an upgrade) like one mount (casfs.node.handover): at ``prepare`` the old
host writes what it serves and its leases, gives up its lock and every
namespace's, and answers lease requests with ``retry`` until it steps aside;
the new one restores all of it, serves its session on a stage, moves it
beneath the old mount, and has the old one step aside. The old host then
serves only what jobs hold open on its detached mount, checks no lease, and
publishes and exits once the kernel ends its connection.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from casfs.errors import CasfsError, UsageError
from casfs.node import (
    bounds,
    control,
    fetchproc,
    guard,
    handover,
    leases,
    nsregistry,
    procexit,
    reclaim,
)
from casfs.node.config import HostConfig  # lives below trio: the CLI builds one without it
from casfs.node.rootlink import fetch_worker
from casfs.node.tenant import requester, tenant_of, tenant_owner
from casfs.node.worker import spawn_host
from casfs.util import atomic
from casfs.util.crashpoint import pausepoint
from casfs.util.envnum import env_float
from casfs.util.flock import try_flock

log = logging.getLogger(__name__)

# The longest a job's release waits for the lease check that lets its namespaces go now
# (and gives casfs run their final stats), seconds; past it they go at a later one.
# CASFS_RELEASE_SCAN_S sets it.
RELEASE_SCAN_S = 10.0


def _users(dirs: list[str], owns: leases.Owns | None,
           deadline: float | None = None) -> dict[str, set[int]]:
    """leases.users, in a worker thread: the host grants leases meanwhile."""
    found = leases.users(dirs, owns=owns, deadline=deadline)
    pausepoint("host-users-scanned")
    return found


__all__ = ["HostConfig", "NodeHost", "spawn_host"]

Key = tuple[str, str]  # (tenant, namespace)


@dataclass
class Lease:
    id: str
    pid: int
    started: str | None
    keys: set[Key] = field(default_factory=set)
    # ``casfs run``'s own lease: it is always released, so its holder dying first
    # means the wrapper (and, under a scheduler's kill, its job) was killed.
    run: bool = False
    # The lease of a ``casfs run``'s command (its pid), following that run's lease
    # (``casfs.node.client.follow``): the job holds its caches should casfs run die.
    follows: str | None = None
    tenant: str | None = None  # whose it is (None: recorded by a release before it)


def _holds(lease: Lease, tenant: str) -> bool:
    """Whether ``tenant`` may extend, release or follow ``lease``: hers from its start
    (while its first namespaces attach it has none to tell by)."""
    if lease.tenant is not None:
        return lease.tenant == tenant
    return bool(lease.keys) and all(k[0] == tenant for k in lease.keys)


@dataclass
class Served:
    key: Key
    family: str
    path: Path
    svc: Any  # MountService
    scope: trio.CancelScope | None = None
    idle_since: float | None = None
    users: set[int] = field(default_factory=set)
    tasks: list[Any] = field(default_factory=list)  # its Periodic work, once started


class NodeHost:
    def __init__(self, cfg: HostConfig, replace: bool = False,
                 adopt: tuple[int, int] | None = None) -> None:
        """``adopt``: (fd, pid): the FUSE connection of this host's crashed process
        ``pid``, held by casfsd: serve it, with every namespace as that one served it."""
        from casfs.view.mux import MuxOperations

        cfg.check()
        self.cfg = cfg
        self.policy = cfg.policy
        self.mux = MuxOperations(owner=tenant_owner(self.policy), statfs_path=cfg.state_dir)
        self.served: dict[Key, Served] = {}
        self.adopt = adopt
        self._families: dict[Key, str] = {}  # of what the mux serves, for its layout
        self.leases: dict[str, Lease] = {}
        self.final: dict[Key, dict[str, Any]] = {}  # stats of released namespaces
        self._attaching: dict[Key, trio.Event] = {}
        self._detaching: dict[Key, trio.Event] = {}
        self._last_check = 0.0  # monotonic start of the last lease check
        self._scan_warned = -60.0  # when a users scan that could not look was last logged
        self._check_lock: trio.Lock | None = None
        self._exits = procexit.ExitWatch()  # how casfs env leases' holders ended
        self._nursery: trio.Nursery | None = None
        self.stopping = False
        self.started = time.time()
        # Replacements (casfs.node.handover): ours of a predecessor (it gives up its
        # locks first), and our answers to a successor (``handing_over`` from its
        # prepare on: what is served and leased is the successor's to record).
        self.handing = handover.Handing()
        self.handing_over = False
        self.predecessor = (handover.prepare(cfg.run_dir, cfg.name, cfg.base) if replace
                            else None)
        if self.predecessor is not None:
            self.handing.stage = handover.stage_dir(cfg.run_dir, cfg.name)
        self.drain = handover.Drain(cfg.base, cfg.run_dir, self.handing,
                                    give_locks=self._give_locks,
                                    retake_locks=self._retake_locks,
                                    writing=self._writing, aside=self._stepped_aside)
        self._lock_fd: int | None = self._take_lock()

    def _take_lock(self) -> int:
        self.cfg.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.cfg.run_dir / f"{self.cfg.name}.lock",
                     os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            taken = try_flock(fd)
        except OSError:
            os.close(fd)
            raise
        if not taken:
            os.close(fd)
            raise UsageError(f"this node's mount process already runs (state dir"
                             f" {self.cfg.state_dir})")
        return fd

    # --- serving namespaces --------------------------------------------------------
    async def attach(self, tenant: str, family: str, namespace: str) -> Served:
        from casfs.node.mount import MountService

        key = (tenant, namespace)
        # Attached by another lease just now, or being released: its final publication
        # holds the namespace's lock (a new MountService would be refused): wait for it.
        # (Not ``a.get(key) or d.get(key)``: a trio.Event refuses to be a bool, and the
        # second lease of a namespace being attached failed with TypeError.)
        while (ev := self._attaching.get(key, self._detaching.get(key))) is not None:
            await ev.wait()
        s = self.served.get(key)
        if s is not None:
            return s
        if self.stopping:
            raise UsageError("this node's mount process is stopping; try again")
        ev = self._attaching[key] = trio.Event()
        svc: MountService | None = None
        slot: int | None = None
        s = None
        try:
            mcfg = self.cfg.ns_config(tenant, family, namespace)
            # (All or nothing: a MountService that fails gives its lock back itself.)
            svc = await trio.to_thread.run_sync(functools.partial(MountService, mcfg,
                                                                  hosted=True))
            if svc.ops is not None:
                # Lower entries appear as the tenant's: its jobs may rewrite a
                # replaced path they did not write.
                svc.ops.lower_owner = tenant_owner(self.cfg.policy)(tenant)[:2]
            self._families[key] = family
            slot = self.mux.attach(tenant, namespace, svc.ops)
            # Before any request can name it (no await in between): an adopter after
            # a crash must find the slot and the namespace's inodes.
            try:
                svc.ops.journal_inodes(self._journal(os.getpid(), slot))
            except OSError as e:  # the namespace serves; only an adoption would miss it
                log.warning("%s: cannot journal its inode numbers (%s): after a crash it"
                            " is served again as new", namespace, e)
            self._persist()
            s = Served(key, family, mcfg.mountpoint, svc)
            assert self._nursery is not None
            await self._nursery.start(self._ns_tasks, s)
            self.served[key] = s
            self.final.pop(key, None)
            nsregistry.record_served(mcfg)
            svc.mark_ready()
            log.info("serving %s@%d at %s", namespace, svc.served_seq, mcfg.mountpoint)
        except BaseException:
            if svc is not None and key not in self.served:  # (served: released as usual)
                self._abandon(key, svc, slot, s)
            raise
        finally:
            del self._attaching[key]
            ev.set()
        self._persist()
        return s

    def _abandon(self, key: Key, svc: Any, slot: int | None, s: Served | None) -> None:
        """An attach failed (or was cancelled) after its MountService was made: nothing
        of it is left (its routing, tasks, journal, record, lock), or the namespace
        stayed refused here ("already mounted") until this process exited. Nothing
        was leased on it: no final publication (what its upper holds waits on disk for
        the next attach)."""
        try:
            if s is not None and s.scope is not None:
                s.scope.cancel()
            if slot is not None:
                self.mux.detach(*key)
            self._families.pop(key, None)
            svc.stop_prefetch()
            svc.close()
            if slot is not None:  # its slot is never served again by this process
                self._journal(os.getpid(), slot).unlink(missing_ok=True)
        except Exception:
            log.exception("%s: cleaning up after its failed attach", key[1])
        finally:
            self._persist()

    async def _ns_tasks(self, s: Served, task_status: trio.TaskStatus[None]
                        = trio.TASK_STATUS_IGNORED) -> None:
        svc = s.svc
        with trio.CancelScope() as scope:
            s.scope = scope
            task_status.started()
            async with trio.open_nursery() as n:
                s.tasks = svc.tasks()
                for t in s.tasks:
                    n.start_soon(t.run)
                svc.start_prefetch()  # the namespace's hot set, in the background

    async def detach(self, key: Key) -> dict[str, Any] | None:
        """Stop serving ``key``: stop routing, final promotion and publication, close."""
        s = self.served.pop(key, None)
        if s is None:
            return None
        ev = self._detaching[key] = trio.Event()  # a lease for it meanwhile waits
        try:
            return await self._detach(key, s)
        finally:
            del self._detaching[key]
            ev.set()

    async def _detach(self, key: Key, s: Served) -> dict[str, Any]:
        self.mux.detach(*key)
        self._families.pop(key, None)
        journal = getattr(getattr(s.svc.ops, "inodes", None), "journal", None)
        if s.scope is not None:
            s.scope.cancel()
        svc = s.svc
        await trio.to_thread.run_sync(pausepoint, "host-release", abandon_on_cancel=True)
        await svc.release(self.cfg.shutdown_timeout)  # prefetch stopped, published, bounded
        st: dict[str, Any] = await trio.to_thread.run_sync(svc.final_stats)
        st["path"] = str(s.path)
        await trio.to_thread.run_sync(svc.flush_counters)
        svc.close()
        if journal is not None:  # its slot is never served again by this process
            journal.path.unlink(missing_ok=True)
        nsregistry.record_served(svc.cfg)
        self.final[key] = st
        self._persist()
        log.info("released %s (%s)", svc.cfg.namespace, s.path)
        return st

    # --- leases ------------------------------------------------------------------------
    async def lease(self, req: dict[str, Any]) -> dict[str, Any]:
        from casfs.fingerprint import check_family, check_namespace

        peer = requester(req)
        tenant = tenant_of(req, self.policy).id
        pid = int(req.get("pid") or peer.get("pid") or 0)
        if pid <= 0 or not leases.alive(pid, None):
            raise UsageError(f"no such process to hold the lease: {pid}")
        caches = req.get("caches")
        if not isinstance(caches, list) or not caches:
            raise UsageError("lease needs caches: [{family, namespace}, ...]")
        lid = str(req.get("lease") or "")
        lease = self.leases.get(lid)
        if lease is not None and not _holds(lease, tenant):
            lease = None  # another tenant's lease id: a new lease of this one's
        limits = req.get("limits")  # casfsd's [jobs] bounds, on a lease from its jobs socket
        if isinstance(limits, dict) and (no := self._bounded(
                tenant, [str(c.get("namespace")) if isinstance(c, dict) else "" for c in caches],
                lease is None, limits)):
            return {"ok": False, "bound": no[0], "error": no[1]}
        if lease is None:
            lid = uuid.uuid4().hex[:16]
            follows = str(req.get("follows") or "") or None
            if follows is not None and (
                    (led := self.leases.get(follows)) is None or not _holds(led, tenant)):
                # Following another tenant's casfs run (its id leaked) would make its
                # killed job's last writes look finished, and be published.
                follows = None
            lease = Lease(lid, pid, leases.start_time(pid), run=bool(req.get("run")),
                          follows=follows, tenant=tenant)
        # Registered before attaching: the lease check must not release the first
        # namespace while the next one is being attached.
        self.leases[lid] = lease
        self._watch_holders()
        out: list[dict[str, Any]] = []
        try:
            names = [(check_family(str(c.get("family"))), check_namespace(str(c.get("namespace"))))
                     for c in caches]
            # All at once: each attach is a few round trips to the root (its marker, a
            # LIST, a manifest), and a job's caches are several namespaces (vLLM: 3).
            # A failed one does not cancel the others (a cancelled attach could leave a
            # MountService half made, holding its namespace's lock); the first failure
            # is raised once all have ended, as it was when they ran one by one.
            got: list[dict[str, Any] | BaseException | None] = [None] * len(caches)

            async def one(i: int, family: str, namespace: str) -> None:
                try:
                    if isinstance(limits, dict) and (no := self._bounded(
                            tenant, [namespace], False, limits)):
                        raise UsageError(no[1])  # another lease of the tenant's took the room
                    s = await self.attach(tenant, family, namespace)
                    s.svc.set_ingredients(caches[i].get("ingredients"))
                    lease.keys.add(s.key)
                    s.idle_since = None
                    got[i] = {"family": family, "namespace": namespace, "tenant": tenant,
                              "path": str(s.path), "served_seq": s.svc.served_seq,
                              "restored_entries": s.svc.restored_entries}
                except Exception as e:  # raised below, after the others
                    got[i] = e

            async with trio.open_nursery() as n:
                for i, (family, namespace) in enumerate(names):
                    n.start_soon(one, i, family, namespace)
            for g in got:
                if isinstance(g, BaseException):
                    raise g
                assert g is not None
                out.append(g)
        except BaseException:
            if not lease.keys:
                self.leases.pop(lid, None)
            raise
        self._persist()
        return {"ok": True, "lease": lid, "caches": out, "mountpoint": str(self.cfg.base)}

    def _owns(self, idle: dict[str, Key]) -> leases.Owns | None:
        """Which files are a served namespace's (for the users scan): those on this host's
        FUSE mount in its slot (a predecessor's mount, after a handover: any of its). A
        path's text alone is another user's to forge in a mount namespace of her own."""
        from casfs.view.mux import slot_of

        stack = [m for m in guard.mounts_at(self.cfg.base) if m.fstype.startswith("fuse")]
        if not stack:
            return None  # (not mounted yet, or gone: nothing served to scan for)
        current, older = stack[-1].dev, {m.dev for m in stack[:-1]}
        slots = {p: self.mux.slot(*k) for p, k in idle.items()}

        def owns(prefix: str, dev: int, ino: int) -> bool:
            if dev in older:
                return True
            return dev == current and slots.get(prefix) is not None and \
                slot_of(ino) == slots[prefix]
        return owns

    def _bounded(self, tenant: str, namespaces: list[str], new_lease: bool,
                 limits: dict[str, Any]) -> tuple[str, str] | None:
        return bounds.lease_refusal(tenant, namespaces, new_lease=new_lease,
                                    leases=self.leases.values(), limits=limits,
                                    serving=[*self.served, *self._attaching, *self._detaching])

    async def release(self, req: dict[str, Any]) -> dict[str, Any]:
        lid = str(req.get("lease"))
        lease = self.leases.get(lid)
        if lease is None or not _holds(lease, tenant_of(req, self.policy).id):
            # Another tenant's lease (its id leaked) is never released for her: its
            # namespaces would go, after their grace, under its holder's running job.
            return {"ok": False, "error": "no such lease"}
        self.leases.pop(lid, None)
        self._persist()
        if req.get("killed"):  # casfs run saw its job killed by a signal just now
            self._torn(lease.keys, late=0.0)
        if req.get("wait") and await self._check_now(
                env_float("CASFS_RELEASE_SCAN_S", RELEASE_SCAN_S)):
            # The releases that check started run in the background: casfs run's
            # summary line needs their final stats.
            for key in sorted(lease.keys):
                if (ev := self._detaching.get(key)) is not None:
                    await ev.wait()
        out = []
        for key in sorted(lease.keys):
            s = self.served.get(key)
            if s is not None:
                st = await trio.to_thread.run_sync(s.svc.status)
                if s.users or any(key in other.keys for other in self.leases.values()):
                    st["shared"] = True  # another job holds it: its figures are theirs too
                else:
                    st["kept_s"] = self.cfg.grace  # served on, for a next job of the tenant
                out.append(st)
            elif key in self.final:
                out.append(self.final[key])
        return {"ok": True, "namespaces": out}

    async def check_leases(self) -> None:
        """Drop dead leases; release namespaces idle for ``grace`` (or exit when idle)."""
        if self._check_lock is None:
            self._check_lock = trio.Lock()
        async with self._check_lock:
            await self._check_leases()

    async def _check_now(self, within: float) -> bool:
        """check_leases for a job's release (casfs run's summary wants its namespaces'
        final stats), given up after ``within`` seconds, the wait for a check already
        running included: the scan's cost grows with every descriptor any user holds
        open on the node (a review: 100 processes of 19,000 held one tenant's release
        for 38 s). False if given up: the namespaces stay served, the next check's."""
        if self._check_lock is None:
            self._check_lock = trio.Lock()
        deadline = time.monotonic() + within
        with trio.move_on_after(within):
            await self._check_lock.acquire()
        if not self._check_lock.locked() or self._check_lock.statistics().owner \
                is not trio.lowlevel.current_task():
            return False
        try:
            await self._check_leases(deadline)
        except leases.ScanIncomplete:
            return False
        finally:
            self._check_lock.release()
        return True

    async def _check_leases(self, deadline: float | None = None) -> None:
        # A holder found dead now died at most this long ago: since the last check
        # began (checks never wait on a release's final publication, see below).
        now = time.monotonic()
        late = min(now - self._last_check, 3600.0) if self._last_check else self.cfg.lease_poll
        self._last_check = now
        for lid, lease in list(self.leases.items()):
            if not leases.alive(lease.pid, lease.started):
                log.info("lease %s: process %d is gone", lid, lease.pid)
                del self.leases[lid]
                self._persist()
                killed, died = await self._gone_killed(lid, lease)
                if killed:  # since it died, when the kernel said (casfs env), or the check
                    self._torn(lease.keys, late=max(late, self.cfg.lease_poll) if died is None
                               else max(0.0, time.monotonic() - died))
        self._watch_holders()
        held = {k for lease in self.leases.values() for k in lease.keys}
        idle = {str(s.path): k for k, s in self.served.items() if k not in held}
        for k, s in self.served.items():
            if k in held:
                s.idle_since = None
        if idle:
            try:
                found = await trio.to_thread.run_sync(_users, list(idle), self._owns(idle),
                                                      deadline)
            except leases.ScanIncomplete as e:  # who uses them is unknown: none goes now
                if deadline is not None:
                    raise  # (a release's own check, out of time: the next one goes on)
                if now - self._scan_warned >= 60.0:
                    self._scan_warned = now
                    log.warning("lease check: %s: no idle namespace released meanwhile", e)
                return
            now = time.monotonic()
            for p, k in idle.items():
                # A lease may have come for it during the scan (or a detach before).
                cur = self.served.get(k)
                if cur is None or any(k in lease.keys for lease in self.leases.values()):
                    continue
                cur.users = found.get(p, set())
                if cur.users:
                    cur.idle_since = None  # a mapped .so or an open file holds it
                    continue
                if cur.idle_since is None:
                    cur.idle_since = now
                # A killed job's half-written files are removed at release: no grace
                # for them, a job leasing it meanwhile would read them.
                if now - cur.idle_since >= self.cfg.grace or cur.svc.tracker.holding():
                    self._detach_soon(k)
        if (self.cfg.exit_when_idle and not self.served and not self.leases
                and not self._attaching and not self._detaching and not self.stopping):
            log.info("nothing left to serve: unmounting")
            self.stopping = True
            os.kill(os.getpid(), signal.SIGTERM)

    async def _lease_loop(self) -> None:
        while True:
            await trio.sleep(self.cfg.lease_poll)
            if self.handing_over:  # the leases are the successor's now (or soon)
                continue
            try:
                await self.check_leases()
            except Exception:
                log.exception("lease check failed")

    async def _reclaim_loop(self) -> None:
        """Reclaim the node state of namespaces idle for ``reclaim_after`` (item: disk)."""
        every = max(1.0, min(600.0, self.cfg.reclaim_after / 4))
        while True:
            await trio.sleep(every)
            if self.handing_over:
                continue
            skip = {s.svc.cfg.namespace for s in self.served.values()}
            try:
                await trio.to_thread.run_sync(reclaim.reclaim_idle, self.cfg.state_dir,
                                              self.cfg.reclaim_after, skip,
                                              abandon_on_cancel=True)
            except Exception:
                log.exception("reclaiming idle namespaces failed")

    def _detach_soon(self, key: Key) -> None:
        """Release ``key`` in the background: its final publication (up to
        shutdown_timeout on a slow root) must not hold up the next lease check, whose
        killed-job decisions would then come late and cover the wrong window."""
        if key in self._detaching or self._nursery is None:
            return
        s = self.served.pop(key)  # stops new leases finding it; detach waits for attach
        self._detaching[key] = trio.Event()

        async def run() -> None:
            try:
                await self._detach(key, s)
            except Exception:
                log.exception("releasing %s failed", key[1])
            finally:
                self._detaching.pop(key).set()
                if (self.cfg.exit_when_idle and not self.served and not self.leases
                        and not self._attaching and not self._detaching
                        and not self.stopping):
                    await self.check_leases()  # the last one out: exit now, not next poll

        self._nursery.start_soon(run)

    async def _gone_killed(self, lid: str, lease: Lease) -> tuple[bool, float | None]:
        """Whether a lease whose process died unreleased stands for a killed job, and
        when it died (time.monotonic()) if the kernel said."""
        if lease.follows is not None:
            # A job's own lease: casfs run releases it and says whether the job was
            # killed, unless casfs run died first (then nobody can tell: assume so).
            return lease.follows not in self.leases, None
        if lease.run:
            # casfs run killed before it released: its job likely too, unless the job's
            # own lease still stands (dead or alive: a dead one is judged on its turn).
            return not any(f.follows == lid for f in self.leases.values()), None
        # casfs env's: its holder (the job's shell) is no child of ours; the kernel's
        # process connector said how it ended. Unknown (not said, lost, no connector,
        # died while no host ran) counts as killed: a good file is only compiled again.
        ex = self._exits.exit_of(lease.pid)
        if ex is None:  # read just after the check found it gone, or never to come
            killed, ex = await trio.to_thread.run_sync(self._exits.verdict, lease.pid)
        else:
            killed = ex.killed
        log.info("lease %s: process %d %s", lid, lease.pid,
                 ex.describe() if ex is not None else "ended, how is unknown")
        return killed, ex.at if ex is not None else None

    def _watch_holders(self) -> None:
        self._exits.watch(lease.pid for lease in self.leases.values()
                          if not lease.run and lease.follows is None)

    def _torn(self, keys: set[Key], late: float) -> None:
        """A job holding ``keys`` was killed at most ``late`` seconds ago: what its
        namespaces changed from ``stable_after`` before that (a file still being
        written then was not stable yet) until a moment after now (the kernel's
        RELEASEs of the dead job's files come late) is never published."""
        now = time.monotonic()
        for key in keys:
            s = self.served.get(key)
            if s is not None:
                s.svc.torn_writes(now - late - s.svc.cfg.stable_after - 0.5, now + 2.0)

    # --- persistence across a restart ----------------------------------------------------
    def _persist(self) -> None:
        if self.handing_over:  # the successor's record from prepare on
            return
        data = {
            "served": [{"tenant": k[0], "namespace": k[1], "family": s.family}
                       for k, s in sorted(self.served.items())],
            "leases": [{"id": lease.id, "pid": lease.pid, "started": lease.started,
                        "keys": sorted(lease.keys), "run": lease.run,
                        "follows": lease.follows, "tenant": lease.tenant}
                       for lease in self.leases.values()],
            "mux": self._layout(),
        }
        try:
            atomic.write_atomic(self.cfg.served_file, json.dumps(data).encode())
        except OSError as e:
            log.warning("cannot record what is served: %s", e)

    def _layout(self) -> dict[str, Any]:
        layout = {"pid": os.getpid(), **self.mux.layout()}
        for v in layout["slots"].values():
            v.append(self._families.get((v[0], v[1]), ""))
        return layout

    def _journal(self, pid: int, slot: int) -> Path:
        return self.cfg.run_dir / f"{self.cfg.name}.{pid}.ns{slot}.inodes"

    def _handles_file(self, pid: int) -> Path:
        """The name casfs.node.fuseconn.adoptable looks for: one definition of it."""
        from casfs.view.op_restore import state_paths

        return state_paths(self.cfg.run_dir, self.cfg.name, pid)[1]

    def _keep_view_state(self) -> None:
        """The mux's handles and the namespaces' inodes are kept for an adopter
        (module doc); adopting: what crashed process ``adopt[1]`` kept is read first."""
        from casfs.node.mount import MountService, sweep_view_state

        cfg = self.cfg
        if self.adopt is None:
            sweep_view_state(cfg.run_dir, cfg.name)
            self.mux.keep_handles(self._handles_file(os.getpid()))
            return
        dead = self.adopt[1]
        try:
            layout = json.loads(cfg.served_file.read_bytes())["mux"]
            if layout.get("pid") != dead:
                raise ValueError(f"written by pid {layout.get('pid')}")
            slots = self.mux.restore_layout(layout)
            self.mux.keep_handles(self._handles_file(os.getpid()),
                                  restore_from=self._handles_file(dead))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CasfsError(f"no record of what pid {dead} served ({e})") from None
        self._handles_file(dead).unlink(missing_ok=True)
        for slot, tenant, namespace in slots:
            key = (tenant, namespace)
            try:
                family = str(layout["slots"][str(slot)][2])
                mcfg = cfg.ns_config(tenant, family, namespace)
                svc = MountService(mcfg, hosted=True)
            except (CasfsError, OSError, ValueError, LookupError) as e:
                log.warning("could not serve %s/%s again: %s", tenant, namespace, e)
                continue
            svc.ops.lower_owner = tenant_owner(cfg.policy)(tenant)[:2]
            self.mux.attach(tenant, namespace, svc.ops, slot=slot)  # its inodes' range
            try:
                svc.ops.journal_inodes(self._journal(os.getpid(), slot),
                                       dead=self._journal(dead, slot))
            except (OSError, ValueError, LookupError, TypeError) as e:  # ENOENT, not wrong files
                log.warning("could not serve %s/%s again: its inode journal: %s", tenant,
                            namespace, e)
                self.mux.detach(tenant, namespace)
                svc.close()
                continue
            self._families[key] = family
            self.served[key] = Served(key, family, mcfg.mountpoint, svc)
            nsregistry.record_served(mcfg)
            svc.mark_ready()
        log.info("serving the connection of pid %d: %d namespaces, %d open handles",
                 dead, len(self.served), len(self.mux.handles.held))

    async def _restore(self) -> None:
        """Serve again what a previous (crashed) host served, with its live leases."""
        since = time.monotonic()  # what the attaches find unpromoted is marked from here
        try:
            data = json.loads(self.cfg.served_file.read_bytes())
        except (OSError, ValueError):
            return
        if not isinstance(data, dict):
            return
        gone: list[Lease] = []
        for item in data.get("served", []):
            try:
                await self.attach(item["tenant"], item["family"], item["namespace"])
            except Exception as e:  # one namespace's failure (attach left nothing of it)
                # must not keep the others, and their leases, from being served again
                log.warning("could not serve %s again: %s", item, e,
                            exc_info=not isinstance(e, CasfsError | OSError | LookupError
                                                    | TypeError))
        for item in data.get("leases", []):
            try:
                lease = Lease(item["id"], int(item["pid"]), item.get("started"),
                              {(k[0], k[1]) for k in item["keys"]}, bool(item.get("run")),
                              str(item.get("follows") or "") or None,
                              str(item["tenant"]) if item.get("tenant") else None)
            except (KeyError, TypeError, ValueError, IndexError):
                continue
            if leases.alive(lease.pid, lease.started):
                self.leases[lease.id] = lease
            else:
                gone.append(lease)
        self._watch_holders()
        self._persist()
        for lease in gone:  # died unreleased while no host ran: judged as at a check
            log.info("lease %s: process %d ended while no mount process ran", lease.id,
                     lease.pid)
            if (await self._gone_killed(lease.id, lease))[0]:
                self._torn(lease.keys, late=time.monotonic() - since)

    # --- control ------------------------------------------------------------------------------
    async def _handle(self, req: dict[str, Any]) -> dict[str, Any]:
        cmd = req.get("cmd")
        if cmd == "handover":  # a successor takes the node's namespaces over
            return await self.drain.handle(req)
        if cmd == "upper_changed":  # a drained predecessor's jobs changed these
            for s in list(self.served.values()):
                if s.svc.cfg.namespace == req.get("ns"):
                    return await s.svc.upper_changed(req)
            return {"ok": True}  # not served here (any more): nothing cached
        if cmd in ("lease", "release") and self.handing_over:
            # The successor restores leases from what prepare wrote: ask it (a moment)
            return {"ok": False, "retry": True,
                    "error": "this node's mount process is being replaced: try again"}
        if cmd == "lease":
            return await self.lease(req)
        if cmd == "release":
            return await self.release(req)
        if cmd in ("status", "stats", "publish", "refresh"):
            out = []
            for s in list(self.served.values()):
                r = await s.svc.handle({"cmd": cmd})
                r["path"] = str(s.path)
                r["holders"] = sorted(lease.pid for lease in self.leases.values()
                                      if s.key in lease.keys)
                r["users"] = sorted(s.users)
                out.append(r)
            return {"ok": all(r.get("ok", True) for r in out), "host": True,
                    "pid": os.getpid(), "mountpoint": str(self.cfg.base),
                    "uptime": round(time.time() - self.started, 1), "namespaces": out,
                    "leases": len(self.leases),
                    "handles_per_tenant": self.mux.handles_per_tenant,
                    "handles_refused": self.mux.handles_refused}
        return {"ok": False, "error": f"unknown command {cmd!r}"}

    async def _background(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self.drain.nursery = nursery
        await nursery.start(self._exits.run)  # before any lease: its holder's end is seen
        for s in list(self.served.values()):  # attached before the session (an adopter)
            if s.scope is None:
                await nursery.start(self._ns_tasks, s)
        if self.predecessor is not None:
            # Every namespace routable here before this mount is the visible one, then
            # the control socket (the predecessor's path) and the leases are ours.
            await self._restore()
            await handover.take_over(self.cfg.base, self.handing, self.predecessor)
            await nursery.start(control.serve_control, self.cfg.socket_path, self._handle)
        else:
            await nursery.start(control.serve_control, self.cfg.socket_path, self._handle)
            await self._restore()
        nursery.start_soon(self._lease_loop)
        if self.cfg.reclaim_after > 0:
            nursery.start_soon(self._reclaim_loop)

    async def _shutdown(self) -> None:
        self.stopping = True
        if self.handing.ended:  # handed over and let go of: the RELEASEs may never come
            for s in self.served.values():
                s.svc.handing.ended = True
        async with trio.open_nursery() as n:
            for key in list(self.served):
                n.start_soon(self.detach, key)
            for ev in list(self._detaching.values()):  # releases already under way
                n.start_soon(ev.wait)
        if not self.handing_over:  # else the successor's record
            self.cfg.served_file.unlink(missing_ok=True)  # a clean stop: nothing to restore

    def serve(self, on_ready: Callable[[], None] | None = None) -> None:
        from casfs.view import session

        cfg = self.cfg
        adoption = None
        if self.adopt is not None:  # its mount point waits for us: never touched
            from casfs.view.adopt import Adoption

            adoption = Adoption(self.adopt[0])
        elif self.predecessor is None:  # a successor stacks beneath its predecessor's mount
            guard.refuse_stacking(cfg.base, "this node's namespaces")
            session.clear_stale_mount(cfg.base)
        self._keep_view_state()
        if adoption is None:
            cfg.base.mkdir(parents=True, exist_ok=True)
        guarded = cfg.guard and (guard.guarded(cfg.base) if adoption is not None
                                 else guard.install(cfg.base, cfg.state_dir))

        def ready() -> None:
            control.write_registry(cfg.run_dir, cfg.name, {
                "name": cfg.name, "pid": os.getpid(), "mountpoint": str(cfg.base),
                "namespace": "*", "socket": str(cfg.socket_path), "family": "*", "host": True,
            })
            log.info("serving namespaces under %s%s", cfg.base,
                     " (read-only guard underneath)" if guarded else "")
            if fetchproc.enabled():  # before the first lease: its imports are done by then
                fetch_worker(cfg)
            if on_ready:
                on_ready()

        try:
            session.serve(self.mux, cfg.base, fsname="casfs-ns", allow_other=cfg.allow_other,
                          debug=cfg.debug, on_ready=ready, background=self._background,
                          on_shutdown=self._shutdown, handing=self.handing, adoption=adoption)
        finally:
            control.remove_registry(cfg.run_dir, cfg.name, os.getpid())
            if guarded and not self.handing.stepped_aside:  # else: the successor's
                guard.remove(cfg.base)  # a clean stop; a crash leaves it, which is the point
            if self._lock_fd is not None:
                os.close(self._lock_fd)
            self.mux.handles.close()
            self.drain.close()

    # --- handing over (casfs.node.handover) ---------------------------------------------
    def _give_locks(self) -> list[str]:
        """prepare: what is served and leased written for the successor, then the host's
        lock and every namespace's given up; the namespaces to hold draining."""
        self._persist()
        self.handing_over = True
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        return [ns for s in self.served.values() for ns in s.svc.give_lock()]

    def _retake_locks(self) -> bool:
        """The successor never took over: serve on (False while someone holds a lock)."""
        try:
            self._lock_fd = self._lock_fd if self._lock_fd is not None else self._take_lock()
        except (UsageError, OSError):
            return False
        if not all(s.svc.retake_lock() for s in self.served.values()):
            return False
        self.handing_over = False
        self._persist()
        return True

    def _writing(self) -> dict[str, list[str]]:
        return {s.svc.cfg.namespace: s.svc.tracker.writing() for s in self.served.values()}

    async def _stepped_aside(self) -> None:
        """Serve only what jobs hold open here: no lease checks (the successor's), no
        refresh or prefetch; promotion and publication of what is tracked go on."""
        for s in list(self.served.values()):
            for t in s.tasks:
                if t.name == "refresh_once":
                    t.stop()
            await s.svc.stepped_aside(self.cfg.socket_path)

    def final_stats(self) -> dict[str, Any]:
        return {"host": True, "namespaces": list(self.final.values())}


# The process's entry point is casfs.node.hoststart (it starts the pre-opens first).
