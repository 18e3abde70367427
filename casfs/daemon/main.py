"""``casfsd``: the per-node daemon serving every configured cache mount.

    casfsd --config /etc/casfs/casfs.toml

Lifecycle: load and check the whole configuration (a bad one exits 2 with one
line naming the key, before anything is mounted); take the state dir's daemon
lock; start every mount's worker; tell systemd ``READY=1``; supervise (restart
dead workers, refresh ``STATUS=``, ping systemd's watchdog while the supervision
loop turns); on SIGHUP (``systemctl reload``) reload the configuration file and
apply what changed (``Daemon.reload``); on SIGTERM or SIGINT send ``STOPPING=1``,
stop every worker (final publication, unmount) and exit 0.

Restarts never reach jobs (casfs.node.lifeline): on SIGUSR2 casfsd re-executes
itself (the release now installed), and on the SIGTERM of a ``systemctl
restart`` it exits; either way its mount processes serve on, and the new casfsd
adopts them at start, handing over those that run another build or
configuration (``Supervisor.replace_outdated``).
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from casfs import __version__, families
from casfs.daemon import config as dconfig
from casfs.daemon.controlsock import ControlServer, ServerLimits, take_daemon_lock
from casfs.daemon.jobs import JobsSocket
from casfs.daemon.notify import Notifier
from casfs.daemon.signals import SignalRelay
from casfs.daemon.supervisor import QUERY_TIMEOUT, Supervisor
from casfs.errors import CasfsError
from casfs.node import logfmt
from casfs.node.control import ALIVE_TOUCH
from casfs.util import owned

log = logging.getLogger(__name__)

PROG = "casfsd"
# How long a mount process serves on without casfsd, for the next one to adopt it:
# longer than systemd's RestartSec (5 s) plus a start.
ADOPT_GRACE = 60.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="casfs node daemon: serves the cache"
                                " mounts of one node (docs/operations.md).")
    p.add_argument("--version", action="version", version=f"casfsd {__version__}")
    p.add_argument("--config", "-c", metavar="FILE",
                   help="TOML configuration (docs/configuration.md); without it, one mount"
                        f" per family of {', '.join(families.DEFAULT_DAEMON)} with the"
                        " zero-config defaults")
    p.add_argument("--root", metavar="DIR", help="shared root (overrides store.root)")
    p.add_argument("--state-dir", metavar="DIR", help="node state dir (overrides node.state_dir)")
    p.add_argument("--log-level", choices=sorted(logfmt.LEVELS), help="overrides log.level")
    p.add_argument("--log-format", choices=logfmt.FORMATS,
                   help="overrides log.format (journal: <N> priority prefixes)")
    p.add_argument("--metrics-listen", metavar="HOST:PORT",
                   help="overrides metrics.listen ('' turns the endpoint off)")
    p.add_argument("--check", action="store_true",
                   help="check the configuration, print the mounts it defines, and exit")
    return p


def _spawn(cfg: Any, **kw: Any) -> Any:
    """Start a configured mount, or the node's mount process for on-demand namespaces."""
    from casfs.node import worker
    from casfs.node.host import HostConfig, spawn_host

    if isinstance(cfg, HostConfig):
        return spawn_host(cfg, **kw)
    return worker.spawn(cfg, **kw)


def _say_error(message: str, fmt: str) -> None:
    prefix = "<3>" if logfmt.resolve_format(fmt) == logfmt.JOURNAL else ""
    print(f"{prefix}{PROG}: error: {message}", file=sys.stderr, flush=True)


# What a reload applies (DaemonConfig fields): the log level, and what reaches the mounts'
# configurations (a changed mount restarts) or is read afresh each time (retention).
# Every other field is what the sockets, the state and the serving threads were built
# on: changing it needs a restart, and a reload that does is refused (a field added
# later is refused too until someone decides it can change live).
RELOADABLE = frozenset({"source", "log_level", "mounts", "defaults", "cache_max_bytes",
                        "lease_grace", "reclaim_after", "unused_for_days",
                        "retention_interval"})
KEY_NAMES = {
    "root": "store.root", "state_dir": "node.state_dir", "mount_base": "node.mount_base",
    "serve_base": "node.on_demand/node.serve_base", "log_format": "log.format",
    "metrics_listen": "metrics.listen", "metrics": "[metrics]", "tenants": "[tenants]",
    "jobs": "[jobs]",
}


def restart_only_changes(old: dconfig.DaemonConfig, new: dconfig.DaemonConfig) -> list[str]:
    """The keys that differ between ``old`` and ``new`` and only a restart applies."""
    return [KEY_NAMES.get(f.name, f.name) for f in dataclasses.fields(old)
            if f.name not in RELOADABLE and getattr(old, f.name) != getattr(new, f.name)]


def _needs_fuse(cfg: dconfig.DaemonConfig) -> bool:
    return cfg.serve_base is not None or any(m.options.mode != "dir" for m in cfg.mounts)


class Daemon:
    def __init__(self, cfg: dconfig.DaemonConfig, notifier: Notifier | None = None,
                 load: Callable[[], dconfig.DaemonConfig] | None = None) -> None:
        """``load`` re-reads the configuration at a reload (default: ``cfg.source`` again,
        without command-line overrides)."""
        self.cfg = cfg
        self.notifier = notifier or Notifier.from_environment()
        self.stop_requested = threading.Event()
        self.reload_requested = threading.Event()
        self.reexec_requested = False  # SIGUSR2: run the release now installed, jobs untouched
        self._sockets: list[ControlServer] = []  # their alive marks, touched by _tick
        self._touched = time.monotonic()
        self._load = load or (lambda: dconfig.load(cfg.source))
        from casfs.node import standby

        fmt = logfmt.resolve_format(cfg.log_format)
        self.jobs = JobsSocket(cfg.tenants, cfg.jobs, self._forward)
        self.supervisor = Supervisor(cfg, _spawn, spawn_options={
            "log_to_stderr": True, "log_format": fmt,
            "log_level": cfg.log_level, "die_with_parent": True, "adopt_grace": ADOPT_GRACE,
        }, standby=lambda: standby.start(log_format=fmt, log_level=self.cfg.log_level,
                                         adopt_grace=ADOPT_GRACE),
            handover=True,  # planned restarts hand over (casfs.node.handover)
            adopt=True,  # a restarted casfsd adopts the running mount processes
            hold=True)  # a crashed fuse mode worker's connection is served on

    def _on_signal(self, signum: int) -> None:
        if not self.stop_requested.is_set():
            log.info("%s: stopping", signal.Signals(signum).name)
        self.stop_requested.set()

    def _on_usr2(self, signum: int) -> None:
        if not self.stop_requested.is_set():
            log.info("SIGUSR2: re-executing casfsd; the mounts serve on")
            self.reexec_requested = True
        self.stop_requested.set()

    def _handing_on(self) -> bool:
        """This exit is a restart (USR2, or systemd's restart job): leave the mounts."""
        from casfs.daemon import sdjob

        return self.reexec_requested or sdjob.restart_pending()

    def _on_hup(self, signum: int) -> None:
        self.reload_requested.set()  # the supervision loop reloads (Daemon.reload)

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._touched >= ALIVE_TOUCH:
            self._touched = now
            for server in self._sockets:
                server.touch()
        if self.reload_requested.is_set():
            self.reload_requested.clear()
            self.reload()

    def reload(self) -> bool:
        """Re-read the configuration and apply it: the log level at once (casfsd's own
        lines; mount processes take it when they next start), mounts removed, added or
        changed (each changed one restarted; the others keep serving), retention. A file
        that does not load, or that changes what only a restart applies (every field
        not ``RELOADABLE``), is refused with one ERROR line: the running configuration
        stays. True if applied."""
        where = str(self.cfg.source) if self.cfg.source else "the built-in defaults"
        self.notifier.reloading(f"reloading {where}")
        try:
            try:
                new = self._load()
            except CasfsError as e:
                return self._refuse(e.message if where in e.message else f"{where}: {e.message}")
            fixed = restart_only_changes(self.cfg, new)
            if fixed:
                return self._refuse(f"{', '.join(fixed)} changed, which only a restart applies"
                                    " (systemctl restart casfsd)")
            if _needs_fuse(new) and not _needs_fuse(self.cfg):
                from casfs.node.worker import check_fuse

                try:
                    check_fuse()
                except CasfsError as e:
                    return self._refuse(e.message)
            done = []
            if new.log_level != self.cfg.log_level:
                logging.getLogger().setLevel(logfmt.LEVELS[new.log_level])
                self.supervisor.set_log_level(new.log_level)
                done.append(f"log level {self.cfg.log_level} -> {new.log_level}")
            done += self.supervisor.reconfigure(new)
            if (new.unused_for_days, new.retention_interval) != (self.cfg.unused_for_days,
                                                                 self.cfg.retention_interval):
                done.append("retention")
            self.cfg = new
            log.info("reloaded %s: %s", where, "; ".join(done) or "nothing changed")
            return True
        finally:
            sup = self.supervisor
            with sup.busy(QUERY_TIMEOUT * len(sup.slots) + 5):
                sup.refresh_status()
            self.notifier.ready(sup.summary())

    def _refuse(self, why: str) -> bool:
        log.error("reload refused: %s; still serving the configuration loaded before", why)
        return False

    def _watchdog_loop(self, interval: float) -> None:
        """WATCHDOG=1 every quarter of systemd's interval, while the supervision loop turns
        (or is in a bounded wait): a casfsd wedged for half the interval stops pinging,
        and systemd aborts it (SIGABRT: faulthandler writes every thread's stack to the
        journal) and restarts it."""
        while not self.stop_requested.wait(interval / 4):
            if self.supervisor.alive(stalled_after=interval / 2):
                self.notifier.watchdog()

    def _jobs(self, req: dict[str, Any]) -> dict[str, Any]:
        """The socket every user may reach: leases only, served as the peer's tenant,
        within the [jobs] bounds (casfs.daemon.jobs)."""
        return self.jobs.handle(req)

    def _control(self, req: dict[str, Any]) -> dict[str, Any]:
        cmd = req.get("cmd")
        if cmd == "status":
            return {"ok": True, **self.supervisor.status()}
        if cmd in ("lease", "release"):
            return self._forward(str(cmd), req)
        return {"ok": False, "error": f"unknown command {cmd!r}"}

    def _forward(self, cmd: str, req: dict[str, Any]) -> dict[str, Any]:
        """A job's lease goes to the node's mount process, with the job's credentials."""
        from casfs.node import control

        hc = self.cfg.host_config()
        if hc is None:
            return {"ok": False, "error": "this casfsd serves no namespaces on demand"
                                          " (node.on_demand = false)"}
        fwd = {k: v for k, v in req.items() if k not in ("cmd", "_peer", "for_peer")}
        fwd["for_peer"] = req.get("_peer")
        try:
            # connect_wait: casfsd replaces this process on upgrades and restarts (its
            # socket is absent for a moment then); a lease must not fail for that.
            return control.request(hc.socket_path, cmd, timeout=120, connect_wait=10.0, **fwd)
        except CasfsError as e:
            return {"ok": False, "error": f"the node's mount process is not serving: {e.message}"}

    def _retention_loop(self) -> None:
        """store.unused_for_days: a retention pass every retention_interval (jittered, so
        the daemons of a cluster do not all rewrite a namespace at once)."""
        import random

        while not self.stop_requested.wait(self.cfg.retention_interval
                                           * random.uniform(0.5, 1.0)):
            if self.cfg.unused_for_days > 0:  # a reload may turn it on or off
                retention_once(self.cfg)

    def run(self) -> int:
        from casfs.node.worker import check_fuse

        # FUSE (/dev/fuse, the 'fuse' extra's pyfuse3) only where a mount needs it: a node
        # whose mounts are all dir mode, with no on-demand mount process, runs without.
        if _needs_fuse(self.cfg):
            check_fuse()
        _raise_fd_limit()  # every open jobs-socket connection is a file descriptor
        owned.private_dir(self.cfg.state_dir, "state dir")  # before anything made in it
        lock_fd = take_daemon_lock(self.cfg.run_dir)
        # Handled in a thread, never in a signal handler (casfs.daemon.signals: a handler
        # setting stop_requested deadlocked against the main loop's wait on it).
        signals = SignalRelay({signal.SIGTERM: self._on_signal, signal.SIGINT: self._on_signal,
                               signal.SIGHUP: self._on_hup, signal.SIGUSR2: self._on_usr2})
        control = metrics = jobs = None
        restarting = False  # the sockets stay for the next casfsd: jobs wait for it
        sup = self.supervisor
        try:
            control = ControlServer(self.cfg.control_socket, self._control)
            self._sockets.append(control)
            if self.cfg.serve_base is not None:
                lim = self.cfg.jobs
                jobs = ControlServer(
                    self.cfg.jobs_socket, self._jobs, public=True, name="jobs",
                    limits=ServerLimits(
                        connections=lim.connections,
                        connections_per_tenant=lim.connections_per_tenant,
                        requests_per_tenant=lim.requests_per_tenant, workers=lim.workers,
                        request_timeout=lim.request_timeout),
                    tenant_of=self.jobs.tenant_key, on_refused=self.jobs.warnings.warn)
                self._sockets.append(jobs)
            if self.cfg.metrics_listen is not None:
                from casfs.daemon.metrics import serve_metrics

                metrics = serve_metrics(sup, self.cfg.metrics_listen)
            names = ", ".join(f"{m.name} at {m.path}" for m in self.cfg.mounts)
            self.notifier.status(f"mounting {names}")
            log.info("casfsd %s starting: %s; root %s; state %s", __version__, names,
                     self.cfg.root, self.cfg.state_dir)
            threading.Thread(target=self._retention_loop, name="retention",
                             daemon=True).start()
            # Standbys first: their interpreters start (~0.25 CPU-s each) while the
            # mounts fetch, not beside the first job after READY (2 cores: the job's
            # start was 15-20 % slower with them importing beside it).
            sup.refill_standby()
            sup.start()
            sup.stop_orphans()  # left serving by a casfsd for a mount removed since
            if sup.replace_outdated():  # adopted from a casfsd of another build or config
                log.info("adopted mount processes replaced: every mount runs casfs %s",
                         __version__)
            sup.refill_standby()  # a standby used by an adoption above, replaced
            if not self.stop_requested.is_set():
                sup.refresh_status()
                summary = sup.summary()
                self.notifier.ready(summary)
                log.info("ready: %s", summary)
                wd = self.notifier.watchdog_interval
                if wd:
                    log.debug("watchdog: a ping every %.1fs (systemd's interval %.1fs)",
                              wd / 4, wd)
                    threading.Thread(target=self._watchdog_loop, args=(wd,), name="watchdog",
                                     daemon=True).start()
                sup.run(self.stop_requested, on_status=self.notifier.status, tick=self._tick)
            if self._handing_on():
                restarting = True
                self.notifier.reloading("restarting: the mounts serve on")
                n = sup.leave()
                log.info("exiting for a restart: %d mount processes serve on for the next"
                         " casfsd to adopt", n)
                return 0
            self.notifier.stopping("stopping: final publication, then unmount")
            sup.stop()
            log.info("stopped")
            return 0
        finally:
            if not sup.stopping:
                sup.stop()
            if metrics is not None:
                metrics.shutdown()
            if control is not None:
                control.close(keep_path=restarting)
            if jobs is not None:
                jobs.close(keep_path=restarting)
            os.close(lock_fd)
            self.notifier.close()
            signals.close()


def _raise_fd_limit() -> None:
    """The soft RLIMIT_NOFILE up to the hard one (1024 by default under systemd: fewer than
    the connections the jobs socket admits, [jobs] connections). Children inherit it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (OSError, ValueError) as e:
            log.warning("cannot raise the open-file limit from %d: %s", soft, e)


def retention_once(cfg: dconfig.DaemonConfig) -> dict[str, list[str]]:
    """One retention pass over the root (errors are logged: the daemon keeps serving)."""
    import time

    from casfs.index.node_index import NodeIndex
    from casfs.promote.retention import drop_unused
    from casfs.store.root import SharedRoot

    try:
        with NodeIndex.open(cfg.state_dir) as idx:
            node = idx.node_id
        # With the node's tenant policy: records it rewrites are sealed (tenant,
        # signature) like those it publishes, and untrusted namespaces are skipped.
        rep = drop_unused(SharedRoot.open(cfg.root, tenants=cfg.tenants).generations(),
                          unused_for_s=cfg.unused_for_days * 86400, now=time.time(), node=node)
    except (CasfsError, OSError) as e:
        log.warning("retention pass failed (next one later): %s", e)
        return {}
    for ns, paths in rep.dropped.items():
        log.info("retention: %s@%d: dropped %d files unused for %g days", ns, rep.seqs[ns],
                 len(paths), cfg.unused_for_days)
    return rep.dropped


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ov = dconfig.Overrides(root=args.root, state_dir=args.state_dir, log_level=args.log_level,
                           log_format=args.log_format, metrics_listen=args.metrics_listen)
    fmt = args.log_format or logfmt.AUTO
    try:
        cfg = dconfig.load(Path(args.config) if args.config else None, ov)
    except CasfsError as e:
        _say_error(e.message, fmt)
        return e.exit_code
    logfmt.setup(logfmt.LEVELS[cfg.log_level], cfg.log_format, prog=PROG)
    # systemd's watchdog aborts a wedged casfsd with SIGABRT: every thread's stack goes
    # to stderr (the journal) before it dies
    faulthandler.enable()
    if args.check:
        for m in cfg.mounts:
            print(f"{m.name}: {m.family} {m.namespace} at {m.path}")
        print(f"configuration OK: {len(cfg.mounts)} mounts, root {cfg.root},"
              f" state dir {cfg.state_dir}")
        return 0
    # Its children (mount processes, workers) find the node state dir here too: an S3
    # root's staging directory lies in it (casfs.store.s3backend.staging_dir_for)
    os.environ["CASFS_STATE_DIR"] = str(cfg.state_dir)
    try:
        daemon = Daemon(cfg, load=lambda: dconfig.load(cfg.source, ov))
        rc = daemon.run()
    except CasfsError as e:
        _say_error(e.message, cfg.log_format)
        return e.exit_code
    if daemon.reexec_requested:
        reexec(daemon.notifier)
    return rc


def reexec(notifier: Notifier) -> None:
    """Become the casfsd now installed: the same interpreter and command line, the same
    pid (systemd's main process still; the systemd variables put back)."""
    notifier.restore_environment()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, sys.orig_argv)


if __name__ == "__main__":
    sys.exit(main())
