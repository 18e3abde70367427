"""The supervisor: one worker process per mount, kept alive, stopped cleanly.

Each mount runs in its own process (pyfuse3 allows one FUSE session per
process), started by ``casfs.node.worker.spawn``, which returns once the mount
serves. The supervisor runs in the daemon's main thread:

- ``start`` spawns every mount in parallel and returns once all serve (or
  stops the ones that came up and raises, so a failed start mounts nothing);
- ``run`` polls the workers every 0.1 s until told to stop: a worker that
  died is restarted at once, then with exponential backoff if it keeps dying
  (1 s doubling to 60 s, reset after 10 s of good service), after its dead
  mount (ENOTCONN) is cleared, which uncovers the read-only guard
  (casfs.node.guard): in the gap readers miss and writers get EROFS; the new
  worker promotes and publishes what the old one left in the upper dir;
- ``stop`` SIGTERMs every worker at once: each publishes (bounded by its
  ``shutdown_timeout``), unmounts and exits; a worker that overruns is killed
  and its mount detached.

Workers hold a lifeline pipe to the supervisor. casfsd's (``adopt``) serve on
when it closes, for the next casfsd to adopt them (casfs.node.lifeline): at
``start`` each configured mount's running process is adopted, not started
again, and ``replace_outdated`` then hands over those whose configuration or
casfs build differs; ``leave`` is the stop that leaves every process serving
(casfsd re-executing itself, or restarted by systemd). A process nobody adopts
in time publishes and unmounts by itself, as one whose supervisor was killed
always did.

``reconfigure`` applies a reloaded configuration's mounts (SIGHUP, ``systemctl
reload``): a mount no longer configured is stopped like at ``stop``, a new one
started, a changed one (any option, the mount point, the node defaults it takes)
stopped then started again; the others keep serving, untouched.

Planned restarts hand over (``handover``, casfsd's; casfs.node.handover): a
changed mount at the same mount point, and ``restart``, start the new mount
process beside the old one, which steps aside once the new one serves and then
drains what jobs hold open on its (detached) mount; ``draining`` holds those
processes until they exit by themselves (reaped each turn; SIGTERMed at
``stop``). One that cannot hand over is stopped first, as before, in one line.

``alive`` says whether the supervision loop is turning: it beats every poll, and
marks the bounded operations that block it (a restart waits up to
RESTART_READY_TIMEOUT for the new worker) as busy until their bound; the daemon's
systemd watchdog pings only while it is alive.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from casfs.daemon.config import DaemonConfig
from casfs.errors import CasfsError
from casfs.node import control
from casfs.node.config import MountConfig
from casfs.node.worker import Worker

log = logging.getLogger(__name__)

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0
HEALTHY_AFTER = 10.0  # a worker up this long resets the backoff (its next death restarts at once)
STATUS_INTERVAL = 10.0
RESTART_READY_TIMEOUT = 60.0
QUERY_TIMEOUT = 5.0
ORPHAN_STOP_TIMEOUT = 90.0  # a left-behind mount's final publication, then it is killed

SpawnFn = Callable[..., Worker]


@dataclass
class Slot:
    """One configured mount and the worker currently serving it."""

    cfg: MountConfig
    worker: Worker | None = None
    state: str = "starting"  # starting | up | restarting | stopping | stopped
    restarts: int = 0
    started: float = 0.0  # monotonic time the current worker became ready
    next_start: float = 0.0  # monotonic time of the next restart attempt
    backoff: float = 0.0  # the first restart is immediate: every second of it is a gap
    last_exit: str | None = None
    last_status: dict[str, Any] | None = None
    last_final: dict[str, Any] | None = field(default=None, repr=False)
    outdated: bool = False  # adopted, but to be replaced (another config or build)
    conn: int | None = None  # our dup of the worker's FUSE connection (casfs.node.fuseconn)
    detached: bool = False  # up, but its mount point shows its mount no more
    shown: int | None = None  # the worker (pid) whose mount was last seen at its point
    adopted_at: float = 0.0  # monotonic time a new process last adopted that connection

    @property
    def pid(self) -> int | None:
        return self.worker.proc.pid if self.worker is not None else None


class Supervisor:
    def __init__(self, cfg: DaemonConfig, spawn: SpawnFn, *,
                 spawn_options: dict[str, Any] | None = None,
                 standby: Callable[[], Any] | None = None, handover: bool = False,
                 adopt: bool = False, hold: bool = False) -> None:
        self.cfg = cfg
        # Hold each fuse mode worker's connection: a crashed worker's is served by a new
        # process (casfs.view.adopt), its jobs see no error (docs/reliability.md).
        self.hold = hold
        self.handover = handover  # planned restarts stack the new process (casfs.node.handover)
        self.adopt = adopt  # start adopts running mount processes (casfs.node.adopted)
        self.draining: list[Worker] = []  # replaced processes serving what jobs still hold
        self.slots = [Slot(mc) for mc in cfg.mount_configs()]
        host = cfg.host_config()
        if host is not None:
            self.slots.append(Slot(host))  # type: ignore[arg-type]  # same duck type
        self._spawn = spawn
        self._spawn_options = dict(spawn_options or {})
        self.started = time.time()
        self.stopping = False
        self._lock = threading.Lock()  # slots are read by the control/metrics threads
        # A pre-started mount process for the next restart (casfs.node.standby).
        self._standby_fn = standby
        self._standbys: list[Any] = []
        self._standby_lock = threading.Lock()
        # Mount processes often die together (an OOM kill, a bad node): one standby
        # each for up to two of them; more would cost memory (~35 MB each) for little.
        self.standby_pool = min(2, len(self.slots))
        # the supervision loop's last turn, and how long a bounded operation may block it
        self.heartbeat = time.monotonic()
        self.busy_until = 0.0

    # --- start ----------------------------------------------------------------
    def start(self) -> None:
        """Bring every mount up in parallel. One that fails is retried like a dead worker
        (backoff; its error logged) while the others serve: one tenant's directory must
        not keep every tenant's caches down. If every mount fails (a broken node or
        configuration), stop and raise the first error."""
        errors: dict[str, CasfsError] = {}

        def one(slot: Slot) -> None:
            try:
                self._start_slot(slot)
            except CasfsError as e:
                errors[slot.cfg.name] = e
            except Exception as e:  # a bug: still report it as the start failure
                log.exception("%s: start failed", slot.cfg.name)
                errors[slot.cfg.name] = CasfsError(f"mount {slot.cfg.name}: {e}")

        threads = [threading.Thread(target=one, args=(s,), name=f"start-{s.cfg.name}")
                   for s in self.slots]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors and len(errors) == len(self.slots):
            self.stop()
            first = next(s.cfg.name for s in self.slots if s.cfg.name in errors)
            raise errors[first]
        now = time.monotonic()
        for slot in self.slots:
            e = errors.get(slot.cfg.name)
            if e is None:
                continue
            with self._lock:
                slot.worker = None
                slot.state = "restarting"
                slot.last_exit = e.message
            self._schedule(slot, now)
            log.error("%s: start failed: %s; next try in %.0fs (the other mounts serve)",
                      slot.cfg.name, e.message, slot.next_start - now)

    def _start_slot(self, slot: Slot, ready_timeout: float = 120.0) -> None:
        from casfs.view.session import clear_stale_mount

        slot.state = "starting"
        if self.adopt and not slot.restarts:
            from casfs.node import adopted
            from casfs.util.buildid import build_id

            found = adopted.adopt(slot.cfg, slot.cfg.to_json(), build_id())
            if found is not None:
                with self._lock:
                    slot.worker, slot.outdated = found
                    slot.state = "up"
                    slot.started = time.monotonic()
                self._hold(slot)
                return
        clear_stale_mount(slot.cfg.mountpoint)
        w = self._from_standby(slot, ready_timeout) if slot.restarts else None
        if w is None:
            w = self._spawn(slot.cfg, ready_timeout=ready_timeout, **self._spawn_options)
        with self._lock:
            slot.worker = w
            slot.state = "up"
            slot.started = time.monotonic()
        self._hold(slot)
        log.info("%s: mounted %s at %s (worker pid %d)", slot.cfg.name, slot.cfg.namespace,
                 slot.cfg.mountpoint, w.proc.pid)

    def stop_orphans(self) -> list[str]:
        """Stop the mount processes a casfsd left serving for a mount no longer configured
        (final publication, unmount), as a reload that removed it would: the names."""
        from casfs.node import adopted

        found = adopted.orphans(self.cfg.run_dir, {s.cfg.name for s in self.slots})
        threads = []
        for entry, proc in found:
            log.info("%s: no longer configured: stopping the mount process it left serving"
                     " at %s (pid %d)", entry.get("name"), entry.get("mountpoint"), proc.pid)
            gone = SimpleNamespace(name=str(entry.get("name")),
                                   mountpoint=Path(str(entry.get("mountpoint"))))
            w = Worker(gone, proc,  # type: ignore[arg-type]  # what stop() reads of them
                       self.cfg.run_dir / f"{gone.name}.final-stats", None, None)
            threads.append(threading.Thread(target=w.stop, args=(ORPHAN_STOP_TIMEOUT,),
                                            name=f"stop-{proc.pid}"))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [str(e.get("name")) for e, _ in found]

    def replace_outdated(self) -> list[str]:
        """Hand over each adopted process that runs another configuration or casfs build
        (casfs.node.handover): the release now installed serves every mount."""
        return self.restart([s.cfg.name for s in self.slots if s.outdated])

    # --- the standby process --------------------------------------------------------
    def refill_standby(self) -> None:
        """Start standby processes up to the pool size (in the caller's thread)."""
        if self._standby_fn is None:
            return
        while not self.stopping:
            with self._standby_lock:
                self._standbys = [sb for sb in self._standbys if sb.alive()]
                if len(self._standbys) >= self.standby_pool:
                    return
                try:
                    self._standbys.append(self._standby_fn())
                except (OSError, CasfsError) as e:
                    log.warning("cannot start a standby mount process: %s", e)
                    return

    def _from_standby(self, slot: Slot, ready_timeout: float) -> Worker | None:
        from casfs.node.standby import spawn_with

        with self._standby_lock:
            sb = self._standbys.pop(0) if self._standbys else None
        if sb is None or not sb.alive():
            return None
        try:
            w: Worker = spawn_with(sb, slot.cfg, ready_timeout=ready_timeout)
        except CasfsError as e:
            log.warning("%s: the standby process could not take over: %s", slot.cfg.name,
                        e.message)
            return None
        finally:
            threading.Thread(target=self.refill_standby, name="standby", daemon=True).start()
        log.info("%s: the standby process (pid %d) took over", slot.cfg.name, w.proc.pid)
        return w

    def set_log_level(self, level: str) -> None:
        """Mount processes started from now on log at ``level`` (the standbys were started
        at the old one: replaced)."""
        self._spawn_options["log_level"] = level
        if self._standby_fn is not None and not self.stopping:
            self._drop_standby()
            threading.Thread(target=self.refill_standby, name="standby", daemon=True).start()

    def _drop_standby(self) -> None:
        with self._standby_lock:
            sbs, self._standbys = self._standbys, []
        for sb in sbs:
            sb.discard()

    # --- liveness (the daemon's watchdog) -------------------------------------------
    @contextmanager
    def busy(self, bound: float) -> Iterator[None]:
        """The loop is blocked on purpose for at most ``bound`` seconds."""
        self.busy_until = time.monotonic() + bound
        try:
            yield
        finally:
            self.busy_until = 0.0
            self.heartbeat = time.monotonic()

    def alive(self, stalled_after: float) -> bool:
        """The loop turned in the last ``stalled_after`` seconds, or is in a bounded wait."""
        now = time.monotonic()
        return now - self.heartbeat < stalled_after or now < self.busy_until

    # --- supervision ------------------------------------------------------------
    def run(self, stop: threading.Event, on_status: Callable[[str], object] | None = None,
            poll: float = 0.1, tick: Callable[[], object] | None = None) -> None:
        """Watch the workers until ``stop`` is set; ``tick`` runs every turn (reloads)."""
        next_status = time.monotonic()
        while not stop.is_set():
            now = self.heartbeat = time.monotonic()
            for slot in self.slots:
                if stop.is_set():
                    break
                self._check(slot, now)
            self.reap_drained()
            if now >= next_status and not stop.is_set():
                with self.busy(QUERY_TIMEOUT * len(self.slots) + 5):
                    self.refresh_status()
                if on_status is not None:
                    on_status(self.summary())
                next_status = now + STATUS_INTERVAL
            if tick is not None and not stop.is_set():
                tick()
            stop.wait(poll)

    def _check(self, slot: Slot, now: float) -> None:
        w = slot.worker
        if w is not None and w.proc.poll() is not None:
            self._on_exit(slot, w, now)
        elif w is None and slot.state == "restarting" and now >= slot.next_start:
            slot.restarts += 1
            try:
                with self.busy(RESTART_READY_TIMEOUT + 10):
                    self._start_slot(slot, ready_timeout=RESTART_READY_TIMEOUT)
            except CasfsError as e:
                slot.state = "restarting"
                slot.last_exit = e.message
                self._schedule(slot, time.monotonic())
                log.error("%s: restart failed: %s; next try in %.0fs", slot.cfg.name,
                          e.message, slot.next_start - time.monotonic())

    def _on_exit(self, slot: Slot, w: Worker, now: float) -> None:
        from casfs.view.session import clear_stale_mount

        rc = w.proc.returncode
        w.release()
        how = (f"killed by signal {-rc}" if rc < 0 else f"exited with status {rc}"
               if getattr(w.proc, "status_known", True) else "exited (adopted: status unknown)")
        if self._adopt_connection(slot, w, how):
            return
        with self._lock:
            slot.worker = None
            slot.state = "restarting"
            slot.last_exit = how
            if slot.started and now - slot.started >= HEALTHY_AFTER:
                slot.backoff = 0.0
        self._schedule(slot, now)
        log.error("%s: worker pid %d %s; restarting in %.0fs", slot.cfg.name, w.proc.pid, how,
                  slot.next_start - now)
        if clear_stale_mount(slot.cfg.mountpoint):
            log.warning("%s: cleared the dead mount at %s", slot.cfg.name, slot.cfg.mountpoint)

    # --- held connections (casfs.node.fuseconn, casfs.view.adopt) -------------------
    def _hold(self, slot: Slot) -> None:
        """Hold a dup of the FUSE connection of ``slot``'s (new) worker."""
        from casfs.node import fuseconn

        self._let_go(slot)
        w = slot.worker
        # A fuse or overlay mode mount (its FUSE layer), or the node's host (a dir mode
        # mount has no connection).
        if (self.hold and w is not None
                and (not isinstance(slot.cfg, MountConfig) or slot.cfg.mode != "dir")):
            slot.conn = fuseconn.grab(w.proc.pid)

    def _let_go(self, slot: Slot) -> None:
        if slot.conn is not None:
            os.close(slot.conn)
            slot.conn = None

    def _adopt_connection(self, slot: Slot, dead: Worker, how: str) -> bool:
        """A new worker serves the held connection of ``dead`` (its mount still there);
        False (the connection let go: it ends, ENOTCONN, as without a hold) if none can,
        or the last adopter died within HEALTHY_AFTER (a request that kills every
        process serving it must not hold the jobs' requests in a loop)."""
        from casfs.node import fuseconn

        conn, slot.conn = slot.conn, None
        if conn is None:
            return False
        t0 = time.monotonic()
        if (self.stopping or not fuseconn.adoptable(slot.cfg, dead.proc.pid)
                or (slot.adopted_at and t0 - slot.adopted_at < HEALTHY_AFTER)):
            os.close(conn)
            return False
        log.error("%s: worker pid %d %s; restarting: a new process serves its connection"
                  " (requests wait meanwhile, none fails)", slot.cfg.name, dead.proc.pid, how)
        with self._lock:
            slot.worker = None
            slot.state = "restarting"
            slot.last_exit = how
        try:
            with self.busy(RESTART_READY_TIMEOUT + 10):
                new = self._spawn(slot.cfg, ready_timeout=RESTART_READY_TIMEOUT,
                                  adopt=(conn, dead.proc.pid), **self._spawn_options)
        except Exception as e:  # a bug too: the connection must not stay held unserved
            log.error("%s: no process could serve the connection of pid %d (%s): mounting"
                      " again", slot.cfg.name, dead.proc.pid,
                      e.message if isinstance(e, CasfsError) else repr(e))
            os.close(conn)
            return False
        with self._lock:
            slot.worker = new
            slot.state = "up"
            slot.restarts += 1
            slot.started = slot.adopted_at = time.monotonic()
            slot.conn = conn  # the same connection: held on
        log.info("%s: worker pid %d serves the connection of pid %d (%.2f s after its exit"
                 " was seen)", slot.cfg.name, new.proc.pid, dead.proc.pid,
                 time.monotonic() - t0)
        return True

    def _schedule(self, slot: Slot, now: float) -> None:
        slot.next_start = now + slot.backoff
        slot.backoff = min(max(slot.backoff * 2, BACKOFF_FIRST), BACKOFF_MAX)

    # --- planned restarts (casfs.node.handover) ----------------------------------
    def restart(self, names: list[str] | None = None) -> list[str]:
        """Put a new mount process (the release now installed) in the place of each
        named mount's (all: None), one after the other; the names restarted."""
        done = []
        for slot in list(self.slots):
            if names is not None and slot.cfg.name not in names:
                continue
            if slot.worker is None or slot.state != "up":
                continue
            with self.busy(RESTART_READY_TIMEOUT + slot.cfg.shutdown_timeout + 30):
                try:
                    self._replace(slot, slot.worker, slot.cfg)
                except CasfsError as e:
                    log.error("%s: restart failed: %s", slot.cfg.name, e.message)
                    continue
            done.append(slot.cfg.name)
            slot.outdated = False
        return done

    def _replace(self, slot: Slot, old: Worker, cfg: Any) -> None:
        """``slot`` served by a new process for ``cfg`` in ``old``'s place: handed over
        if ``old`` can, else after it stopped (casfs.node.worker.replace)."""
        from casfs.node.worker import replace

        slot.state = "starting"
        try:
            new, seamless = replace(old, self._spawn, cfg, ready_timeout=RESTART_READY_TIMEOUT,
                                    **self._spawn_options)
        except BaseException:
            if old.proc.poll() is None:  # the new one failed: the old one serves on
                with self._lock:
                    slot.worker = old
                    slot.state = "up"
            raise
        with self._lock:
            slot.worker = new
            slot.cfg = cfg
            slot.state = "up"
            slot.started = time.monotonic()
            if seamless:
                self.draining.append(old)
        self._hold(slot)
        if seamless:
            log.info("%s: worker pid %d took over %s from pid %d, which serves what jobs"
                     " hold open there until they let go", cfg.name, new.proc.pid,
                     cfg.mountpoint, old.proc.pid)

    def reap_drained(self) -> None:
        """Replaced processes that exited: their jobs let go, they published."""
        with self._lock:
            gone = [w for w in self.draining if w.proc.poll() is not None]
            self.draining = [w for w in self.draining if w not in gone]
        for w in gone:
            w.release()
            rc = w.proc.returncode
            (log.info if rc == 0 else log.warning)(
                "%s: replaced worker pid %d drained and exited (status %d)", w.cfg.name,
                w.proc.pid, rc)

    # --- stop -------------------------------------------------------------------
    def leave(self) -> int:
        """Stop supervising, every mount process left serving for the next casfsd to
        adopt (casfs.node.lifeline); the number left."""
        self.stopping = True
        self._drop_standby()
        with self._lock:
            return sum(1 for s in self.slots if s.worker is not None)

    def stop(self) -> None:
        """SIGTERM every worker at once; each publishes, unmounts and exits (bounded)."""
        from casfs.node.handover import draining_pids

        self.stopping = True
        self._drop_standby()
        with self._lock:
            drained, self.draining = self.draining, []
        stoppers = [threading.Thread(target=w.stop, name=f"stop-{w.proc.pid}")
                    for w in drained]
        # Replaced processes a casfsd before a re-exec left draining: not in ``draining``
        # (kept in memory), they served a job's held cwd for good after the stop, an old
        # release's code among them (a review, 2026-12-06). Found by their writers files.
        strays = draining_pids(self.cfg.run_dir) - {w.proc.pid for w in drained}
        for pid in sorted(strays):
            log.info("stopping pid %d, a replaced mount process still draining", pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for t in stoppers:
            t.start()
        self._stop_slots(self.slots)
        for t in stoppers:
            t.join()
        deadline = time.monotonic() + ORPHAN_STOP_TIMEOUT
        while strays and time.monotonic() < deadline:
            strays = {pid for pid in strays if control.running(pid)}
            time.sleep(0.1)
        for pid in strays:
            log.warning("pid %d (draining) did not stop in %.0fs: killed", pid,
                        ORPHAN_STOP_TIMEOUT)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _stop_slots(self, slots: list[Slot]) -> None:
        def one(slot: Slot) -> None:
            w = slot.worker
            if w is None:
                slot.state = "stopped"
                return
            slot.state = "stopping"
            final = w.stop()
            with self._lock:
                slot.worker = None
                slot.state = "stopped"
                slot.last_final = final
            self._let_go(slot)
            pub = (final or {}).get("last_publish") or {}
            log.info("%s: unmounted %s; last publication: %s", slot.cfg.name,
                     slot.cfg.mountpoint, pub.get("message", "none"))

        threads = [threading.Thread(target=one, args=(s,), name=f"stop-{s.cfg.name}")
                   for s in slots]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # --- reload -----------------------------------------------------------------
    def reconfigure(self, cfg: DaemonConfig) -> list[str]:
        """Serve ``cfg``'s mounts: stop the removed and changed ones (in parallel, each
        with its final publication), then start the changed and new ones (in parallel);
        the unchanged keep serving. Returns one phrase per change (none: nothing to do).
        A mount that fails to start is retried like a dead worker (backoff), not undone."""
        want: list[Any] = list(cfg.mount_configs())
        host = cfg.host_config()
        if host is not None:
            want.append(host)
        old = {s.cfg.name: s for s in self.slots}
        new = {c.name: c for c in want}
        gone = [s for name, s in old.items() if name not in new]
        changed = [s for name, s in old.items() if name in new and s.cfg != new[name]]
        changes = ([f"{s.cfg.name} removed" for s in gone]
                   + [f"{s.cfg.name} changed" for s in changed]
                   + [f"{name} added" for name in new if name not in old])
        self.cfg = cfg
        if not changes:
            return []
        fresh = {name: Slot(c) for name, c in new.items()
                 if name not in old or old[name] in changed}
        # Changed at the same mount point, with a live worker: handed over, not stopped.
        swap = {s.cfg.name: s.worker for s in changed
                if self.handover and s.worker is not None and s.state == "up"
                and s.cfg.mountpoint == new[s.cfg.name].mountpoint}
        changed = [s for s in changed if s.cfg.name not in swap]
        bound = (max([s.cfg.shutdown_timeout for s in gone + changed], default=0.0) + 20
                 + 120.0)  # each stop is bounded by its shutdown_timeout, each start by 120 s
        with self.busy(bound):
            self._stop_slots(gone + changed)
            with self._lock:
                self.slots = [fresh.get(name) or old[name] for name in new]
            self.standby_pool = min(2, len(self.slots))
            errors: dict[str, str] = {}

            def one(slot: Slot) -> None:
                try:
                    old_worker = swap.get(slot.cfg.name)
                    if old_worker is not None:
                        # The held connection goes with its worker (as in ``restart``),
                        # let go once the new one holds its own: left on the old slot, a
                        # dead drainer's connection stayed held unserved, and its jobs'
                        # next request hung in D state until casfsd exited (a review).
                        slot.conn, old[slot.cfg.name].conn = old[slot.cfg.name].conn, None
                        self._replace(slot, old_worker, slot.cfg)
                    else:
                        self._start_slot(slot)
                except CasfsError as e:
                    errors[slot.cfg.name] = e.message
                except Exception as e:  # a bug: retried like any failed start
                    log.exception("%s: start failed", slot.cfg.name)
                    errors[slot.cfg.name] = str(e)

            threads = [threading.Thread(target=one, args=(s,), name=f"start-{s.cfg.name}")
                       for s in fresh.values()]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        now = time.monotonic()
        for name, message in errors.items():
            slot = fresh[name]
            with self._lock:
                slot.state = "restarting"
                slot.last_exit = message
            self._schedule(slot, now)
            log.error("%s: start failed: %s; next try in %.0fs", name, message,
                      slot.next_start - now)
        return changes

    # --- status ---------------------------------------------------------------
    def query(self, slot: Slot, cmd: str = "status") -> dict[str, Any] | None:
        if slot.worker is None or slot.state != "up":
            return None
        try:
            reply = control.request(slot.cfg.socket_path, cmd, timeout=QUERY_TIMEOUT)
        except CasfsError as e:
            log.debug("%s: %s", slot.cfg.name, e.message)
            return None
        return reply if reply.get("ok") else None

    def refresh_status(self) -> None:
        for slot in self.slots:
            st = self.query(slot)
            with self._lock:
                slot.last_status = st
            self._check_mounted(slot)

    def _check_mounted(self, slot: Slot) -> None:
        """An up mount whose mount point shows its mount no more (someone detached it:
        ``umount -l``) while its process serves on, for what jobs hold there: new jobs
        find no cache there. Said once (ERROR), and in the status, until it is back."""
        from casfs.node import guard

        if slot.cfg.mode == "dir" or slot.worker is None or slot.state != "up":
            slot.detached = False
            return
        top = guard.mounts_at(slot.cfg.mountpoint)[-1:]
        shown = bool(top) and not guard.is_guard(top[0]) and (
            top[0].fstype.startswith("fuse") or top[0].fstype == "overlay")
        if shown:
            slot.shown = slot.worker.proc.pid
        elif slot.shown != slot.worker.proc.pid:
            return  # never seen mounted by this check (yet): nothing gone
        if not shown and not slot.detached:
            log.error("%s: its mount at %s is gone (detached: `umount -l`?) while pid %d"
                      " serves what jobs still hold there; new jobs get no cache there. A"
                      " restart keeps the detached mount: stop casfsd, then start it",
                      slot.cfg.name, slot.cfg.mountpoint, slot.worker.proc.pid)
        slot.detached = not shown

    def summary(self) -> str:
        """One line for systemd's STATUS= (``systemctl status casfsd``)."""
        static = [s for s in self.slots if s.cfg.namespace != "*"]
        up = [s for s in static if s.state == "up"]
        parts = []
        pending = 0
        on_demand = ""
        for s in self.slots:
            st = s.last_status or {}
            state = "detached" if s.detached else s.state
            if s.cfg.namespace == "*":  # the node's mount process for on-demand namespaces
                on_demand = (f"; on demand: {len(st.get('namespaces', []))} namespaces at"
                             f" {s.cfg.mountpoint}" if state == "up"
                             else f"; on demand: {state.upper()}")
            elif state != "up":
                parts.append(f"{s.cfg.name} {state.upper()}")
            else:
                parts.append(f"{s.cfg.name}@{st.get('served_seq', '?')}")
            pending += int(st.get("pending_publication") or 0)
            pending += sum(int(n.get("pending_publication") or 0)
                           for n in st.get("namespaces", []))
        failed_pubs = [s.cfg.name for s in self.slots
                       if ((s.last_status or {}).get("last_publish") or {}).get("ok") is False]
        restarts = sum(s.restarts for s in self.slots)
        line = (f"{len(up)}/{len(static)} mounts up: {', '.join(parts)}{on_demand};"
                f" {pending} files pending publication; {restarts} restarts")
        if failed_pubs:
            line += f"; last publication FAILED for {', '.join(failed_pubs)}"
        return line

    def status(self) -> dict[str, Any]:
        """What the daemon control socket answers to ``status``."""
        with self._lock:
            mounts = [{
                "name": s.cfg.name, "family": s.cfg.family, "namespace": s.cfg.namespace,
                "mountpoint": str(s.cfg.mountpoint), "worker_pid": s.pid,
                "state": "detached" if s.detached else s.state,
                "restarts": s.restarts, "last_exit": s.last_exit,
            } for s in self.slots]
        return {
            "pid": os.getpid(), "uptime": round(time.time() - self.started, 1),
            "config": str(self.cfg.source) if self.cfg.source else None,
            "root": str(self.cfg.root), "state_dir": str(self.cfg.state_dir),
            "summary": self.summary(), "mounts": mounts,
        }
