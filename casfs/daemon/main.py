"""``casfsd``: the per-node daemon serving every configured cache mount.

    casfsd --config /etc/casfs/casfs.toml

Lifecycle: load and check the whole configuration (a bad one exits 2 with one
line naming the key, before anything is mounted); take the state dir's daemon
lock; start every mount's worker; tell systemd ``READY=1``; supervise (restart
dead workers, refresh ``STATUS=``); on SIGTERM, SIGINT or SIGHUP send
``STOPPING=1``, stop every worker (final publication, unmount) and exit 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from casfs import __version__, families
from casfs.daemon import config as dconfig
from casfs.daemon.controlsock import ControlServer, ServerLimits, take_daemon_lock
from casfs.daemon.jobs import JobsSocket
from casfs.daemon.notify import Notifier
from casfs.daemon.supervisor import Supervisor
from casfs.errors import CasfsError
from casfs.node import logfmt

log = logging.getLogger(__name__)

PROG = "casfsd"


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


class Daemon:
    def __init__(self, cfg: dconfig.DaemonConfig, notifier: Notifier | None = None) -> None:

        self.cfg = cfg
        self.notifier = notifier or Notifier.from_environment()
        self.stop_requested = threading.Event()
        from casfs.node import standby

        fmt = logfmt.resolve_format(cfg.log_format)
        self.jobs = JobsSocket(cfg.tenants, cfg.jobs, self._forward)
        self.supervisor = Supervisor(cfg, _spawn, spawn_options={
            "log_to_stderr": True, "log_format": fmt,
            "log_level": cfg.log_level, "die_with_parent": True,
        }, standby=lambda: standby.start(log_format=fmt, log_level=cfg.log_level))

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self.stop_requested.is_set():
            log.info("%s: stopping", signal.Signals(signum).name)
        self.stop_requested.set()

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
            return control.request(hc.socket_path, cmd, timeout=120, **fwd)
        except CasfsError as e:
            return {"ok": False, "error": f"the node's mount process is not serving: {e.message}"}

    def _retention_loop(self) -> None:
        """store.unused_for_days: a retention pass every retention_interval (jittered, so
        the daemons of a cluster do not all rewrite a namespace at once)."""
        import random

        while not self.stop_requested.wait(self.cfg.retention_interval
                                           * random.uniform(0.5, 1.0)):
            retention_once(self.cfg)

    def run(self) -> int:
        from casfs.node.worker import check_fuse

        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, self._on_signal)
        # FUSE (/dev/fuse, the 'fuse' extra's pyfuse3) only where a mount needs it: a node
        # whose mounts are all dir mode, with no on-demand mount process, runs without.
        if self.cfg.serve_base is not None or any(m.options.mode != "dir"
                                                  for m in self.cfg.mounts):
            check_fuse()
        _raise_fd_limit()  # every open jobs-socket connection is a file descriptor
        lock_fd = take_daemon_lock(self.cfg.run_dir)
        control = metrics = jobs = None
        sup = self.supervisor
        try:
            control = ControlServer(self.cfg.control_socket, self._control)
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
            if self.cfg.metrics_listen is not None:
                from casfs.daemon.metrics import serve_metrics

                metrics = serve_metrics(sup, self.cfg.metrics_listen)
            names = ", ".join(f"{m.name} at {m.path}" for m in self.cfg.mounts)
            self.notifier.status(f"mounting {names}")
            log.info("casfsd %s starting: %s; root %s; state %s", __version__, names,
                     self.cfg.root, self.cfg.state_dir)
            if self.cfg.unused_for_days > 0:
                threading.Thread(target=self._retention_loop, name="retention",
                                 daemon=True).start()
            sup.start()
            sup.refill_standby()  # ready for the first restart
            if not self.stop_requested.is_set():
                sup.refresh_status()
                summary = sup.summary()
                self.notifier.ready(summary)
                log.info("ready: %s", summary)
                sup.run(self.stop_requested, on_status=self.notifier.status)
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
                control.close()
            if jobs is not None:
                jobs.close()
            os.close(lock_fd)
            self.notifier.close()


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
    if args.check:
        for m in cfg.mounts:
            print(f"{m.name}: {m.family} {m.namespace} at {m.path}")
        print(f"configuration OK: {len(cfg.mounts)} mounts, root {cfg.root},"
              f" state dir {cfg.state_dir}")
        return 0
    try:
        return Daemon(cfg).run()
    except CasfsError as e:
        _say_error(e.message, cfg.log_format)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
