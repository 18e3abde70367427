"""One job's caches without casfsd's help: how ``casfs run`` gets them and lets them go.

In fuse mode the job leases its namespaces from the node's mount process (casfsd's
jobs socket, or the host another ``casfs run`` of this user started, or one it
starts itself: casfs.node.client); without FUSE it falls back to dir mode, where
the jobs of a namespace share one dir-mode process (casfs.node.dirshare), the
last one out stopping it; overlay mode runs one process per namespace. Anything
that cannot be served gives the job private, temporary directories with one
warning line: the job always runs.

At the end: a killed job's namespaces hold what it changed just before
(casfs.node.publishing), and each family's final figures come back for the
summary line (casfs.cli.summary).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from casfs.errors import CasfsError, FuseUnavailableError
from casfs.node import client, control, dirshare, worker
from casfs.node.config import HostConfig, MountConfig

Stats = list[tuple[str, dict[str, Any] | None]]


def killed(rc: int) -> bool:
    """Whether a job's exit status says a signal ended it (directly, or a shell's
    128+N for its child): then what it was writing may be half-written."""
    return rc < 0 or 128 < rc <= 128 + 64


def _why(e: BaseException) -> str:
    return e.message if isinstance(e, CasfsError) else str(e)


def _warn(line: str) -> None:
    print(f"casfs: warning: {line}", file=sys.stderr)


@dataclasses.dataclass
class DirJob:
    """This job's part in a dir-mode directory (``own``: the process it spawned, if
    it found none serving)."""

    family: str
    cfg: MountConfig
    share: dirshare.DirShare
    own: worker.Worker | None = None


@dataclasses.dataclass
class JobCaches:
    """Where a job's caches are served and what to release when it ends."""

    caches: list[dict[str, Any]]
    paths: dict[str, str] = dataclasses.field(default_factory=dict)
    lease: tuple[Path, str] | None = None  # (socket, lease id) of a fuse-mode lease
    workers: list[worker.Worker] = dataclasses.field(default_factory=list)
    shares: list[DirJob] = dataclasses.field(default_factory=list)
    private: Path | None = None  # temporary directories: nothing served
    job_lease: str | None = None

    def follow(self, pid: int) -> None:
        """The job's own process holds the namespaces too (its lease follows ours)."""
        if self.lease is not None:
            self.job_lease = client.follow(self.lease[0], self.caches, pid, self.lease[1])

    def finish(self, rc: int, ended: float) -> Stats:
        """Release everything (a killed job's last writes held first); each family's
        final figures, or None where a process died."""
        stats: Stats = []
        if self.lease is not None:
            if self.job_lease is not None:
                # said just below; the job has exited, so its lease may be reaped already
                client.release(self.lease[0], self.job_lease, wait=False, reaped_ok=True)
            got: dict[str, dict[str, Any]] = {}
            for st in client.release(*self.lease, wait=True, killed=killed(rc)):
                ns = str(st.get("namespace"))
                got[ns] = got[ns.split("~", 1)[-1]] = st  # (a tenant's are "<tenant>~ns")
            stats = [(c["family"], got.get(c["namespace"])) for c in self.caches]
        if killed(rc):
            _tell_torn([w.cfg.socket_path for w in self.workers]
                       + [Path(m["socket"]) for js in self.shares
                          if (m := serving_dir(js.cfg)) is not None], ended)
        for w in self.workers:  # all at once: each stop is a final publication and an
            if w.proc.poll() is None:  # unmount (~0.45 s), and they do not wait on each other
                w.proc.terminate()
        stats += [(w.cfg.family, w.stop()) for w in self.workers]
        stats += [(js.family, leave_dir(js)) for js in self.shares]
        return stats

    def cleanup(self) -> None:
        if self.private is not None:
            shutil.rmtree(self.private, ignore_errors=True)


def serve(caches: list[dict[str, Any]], names: list[str], mode: str, state: Path, *,
          start: HostConfig | None, config_for: Callable[[dict[str, Any]], MountConfig],
          default_families: list[str] | None, verbose: int = 0) -> JobCaches:
    """Serve ``caches`` for a job of this process in ``mode``; never raises for a cache
    that cannot be served (private directories instead). ``config_for`` makes a dir or
    overlay mode's MountConfig for one cache; ``default_families``: the families a
    process each is started for when the job named none (dir and overlay modes)."""
    jc = JobCaches(caches)
    if mode == "fuse":
        try:
            reply, sock = client.lease(state, caches, os.getpid(), start=start, run=True)
            jc.lease = (sock, reply["lease"])
            jc.paths = {c["family"]: c["path"] for c in reply["caches"]}
        except FuseUnavailableError as e:
            _warn(f"{e.message}; serving the caches as plain directories (dir mode)")
            mode = "dir"
        except (CasfsError, OSError) as e:
            jc.paths, jc.private = private_dirs(names, f"no cache can be served ({_why(e)})")
    if mode not in ("dir", "overlay"):
        return jc
    todo = caches if default_families is None else [
        c for c in caches if c["family"] in default_families]
    jc.caches = todo if default_families is not None else caches
    try:
        for c in todo:
            cfg = dataclasses.replace(config_for(c), mode=mode)
            if mode == "dir":
                # No FUSE, so no node mount process and no leases: the jobs of the
                # namespace share one dir-mode process, the last one out stops it.
                jc.shares.append(join_dir(cfg, c["family"], verbose))
            else:
                jc.workers.append(worker.spawn(cfg, verbose=verbose))
            jc.paths[c["family"]] = str(cfg.mountpoint)
    except (CasfsError, OSError) as e:
        for w in jc.workers:
            w.stop()
        for js in jc.shares:
            leave_dir(js)
        jc.workers, jc.shares = [], []
        jc.paths, jc.private = private_dirs(names, f"no cache can be served ({_why(e)})")
    return jc


def private_dirs(names: list[str], why: str) -> tuple[dict[str, str], Path]:
    tmp = Path(tempfile.mkdtemp(prefix="casfs-private-"))
    _warn(f"{why}; the caches of this run are private and temporary ({tmp})")
    out = {}
    for fam in names:
        (tmp / fam).mkdir()
        out[fam] = str(tmp / fam)
    return out, tmp


def _tell_torn(sockets: list[Path], ended: float) -> None:
    """The job was killed: dir and overlay mode's processes hold what it changed just
    before (fuse mode's node mount process learns it from the lease's release)."""
    for sock in sockets:
        try:
            control.request(sock, "torn", timeout=10.0, late=max(0.0, time.time() - ended))
        except CasfsError as e:
            _warn(f"a killed job's files may be published: {e.message}")


# --- dir mode: one process per namespace, shared by the node's jobs ----------------------
def serving_dir(cfg: MountConfig) -> dict[str, Any] | None:
    """The registry entry of a running dir-mode process of ``cfg``'s namespace at its path
    (its pid checked to be the worker that wrote it: an entry left by a process killed
    outright may name a reused pid)."""
    for m in control.registered(cfg.run_dir):
        if (m.get("namespace") == cfg.namespace and m.get("mountpoint") == str(cfg.mountpoint)
                and dirshare.serves(cfg.run_dir, m)):
            return m
    return None


def join_dir(cfg: MountConfig, family: str, verbose: int) -> DirJob:
    share = dirshare.DirShare(cfg.run_dir, cfg.mountpoint)
    with share.joining():
        other = serving_dir(cfg)
        if other is not None and share.is_stopping(other):
            # Its final publication has started: what this job wrote would never be
            # watched. Wait for it to exit (nobody joins meanwhile: we hold the join
            # lock), then spawn a fresh one.
            timeout = cfg.shutdown_timeout + 15
            print(f"casfs: {family}: the dir-mode process at {cfg.mountpoint} (pid"
                  f" {other['pid']}) is stopping; waiting for it to exit", file=sys.stderr)
            if not dirshare.wait_exit(int(other["pid"]), timeout):
                raise CasfsError(f"the dir-mode process at {cfg.mountpoint} (pid"
                                 f" {other['pid']}) is stopping and did not exit within"
                                 f" {timeout:.0f}s")
            other = serving_dir(cfg)
            if other is not None and share.is_stopping(other):
                raise CasfsError(f"the dir-mode process at {cfg.mountpoint} (pid"
                                 f" {other['pid']}) is stopping")
        own = None
        if other is None:
            own = worker.spawn(cfg, verbose=verbose)
            share.spawned(own.proc.pid)
        else:
            print(f"casfs: {family}: sharing {cfg.mountpoint} with another job's dir-mode"
                  f" process (pid {other['pid']}); the last job to end publishes",
                  file=sys.stderr)
        share.enter()
    return DirJob(family, cfg, share, own)


def leave_dir(js: DirJob) -> dict[str, Any] | None:
    """Count this job out of its dir-mode directory; the last one out stops the process
    (final publication) and gets its final stats, the others a "shared" line."""
    with js.share.leaving() as last:
        if not last:
            if js.own is not None:
                js.own.release()  # it keeps serving the jobs left; the last one stops it
            return {"shared": True, "namespace": js.cfg.namespace}
        if js.own is not None and js.own.proc.poll() is None:
            js.share.stopping(js.own.proc.pid)  # should this job die now: never joined
            return js.own.stop()
        # The one serving now (the one this job shared, or a replacement another job
        # spawned after it died), if a casfs run spawned it: a casfs mount's is not ours.
        other = serving_dir(js.cfg)
        if other is not None and js.share.spawned() == int(other["pid"]):
            js.share.stopping(int(other["pid"]))
            return dirshare.stop_registered(js.cfg.run_dir, other,
                                            js.cfg.shutdown_timeout + 15)
        if js.own is not None:
            return js.own.stop()  # it died: its stats if it left any
        return {"shared": True, "namespace": js.cfg.namespace} if other is not None else None
