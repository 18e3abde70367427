"""A job's side of the serving model: find the node's mount process, take a lease.

Order: casfsd's control socket (it forwards to its mount process, which it
supervises), else the socket of a mount process that another ``casfs run``
started, else (``start``) start one that exits when its last job is gone.
Two jobs racing to start one: the mount process holds a lock, the loser's
start fails, and it takes a lease on the winner's.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from casfs.errors import CasfsError, DaemonStuckError, DaemonUnavailableError, UsageError
from casfs.node import control, leases
from casfs.node.config import HostConfig
from casfs.util.envnum import env_float

log = logging.getLogger(__name__)

HOST_NAME = "host"
START_TRIES = 5
RESTART_WAIT = 20.0  # seconds a job waits for a restarting casfsd (its socket refusing)
RESTART_MARK_FRESH = 120.0  # an older mark: that casfsd is not coming back
DEFAULT_LEASE_TIMEOUT = 120.0


def lease_timeout() -> float:
    """How long a job waits for its lease before it runs with a private cache
    (``CASFS_LEASE_TIMEOUT`` seconds; an attach may wait out a reclaim's publication)."""
    return env_float("CASFS_LEASE_TIMEOUT", DEFAULT_LEASE_TIMEOUT)


def daemon_socket(state_dir: Path) -> Path:
    return state_dir / "run" / "casfsd.sock"


def host_socket(state_dir: Path) -> Path:
    return state_dir / "run" / f"{HOST_NAME}.sock"


# casfsd's socket for every user's jobs (casfs.daemon: <node.mount_base>/casfsd.sock).
JOBS_SOCKET = Path("/run/casfs/casfsd.sock")


def jobs_socket() -> Path:
    env = os.environ.get("CASFS_SOCKET")
    return Path(env) if env else JOBS_SOCKET


def _ask(sock: Path, cmd: str, timeout: float, *, stuck_raises: bool = False,
         connect_wait: float = 0.0, **kw: Any) -> dict[str, Any] | None:
    """The reply, or None when nobody serves that socket (``stuck_raises``: a process
    that took the request and said nothing for ``timeout`` raises DaemonStuckError;
    ``connect_wait``: seconds to retry a socket that is there but refuses)."""
    try:
        if not sock.exists():
            return None
    except OSError:  # another user's state dir
        return None
    try:
        return control.request(sock, cmd, timeout=timeout, connect_wait=connect_wait, **kw)
    except DaemonStuckError:
        if stuck_raises:
            raise
        return None
    except DaemonUnavailableError:
        return None


def _restarting(sock: Path) -> bool:
    """Whether the casfsd of ``sock`` was alive lately (its mark is fresh): one refusing
    now is restarting. A mark dated ahead of the clock (a clock stepped back) is not."""
    try:
        age = time.time() - control.alive_mark(sock).stat().st_mtime
    except OSError:
        return False
    return -5.0 < age < RESTART_MARK_FRESH


def lease(state_dir: Path, caches: list[dict[str, Any]], pid: int, *,
          start: HostConfig | None = None, timeout: float | None = None,
          run: bool = False) -> tuple[dict[str, Any], Path]:
    """Lease ``caches`` for process ``pid``; (reply, socket that granted it).

    ``start``: the mount process to start when none serves the node.
    DaemonUnavailableError when none serves and ``start`` is None. ``run``:
    ``casfs run``'s lease, always released: ``pid`` dying first means it was killed.
    """
    last: str | None = None
    # ``timeout`` bounds the whole wait: a stopped or wedged mount process accepts the
    # request and never answers, and asking it again would hold the job as long once
    # more (was: START_TRIES times, 10 minutes before the job started).
    if timeout is None:
        timeout = lease_timeout()
    deadline = time.monotonic() + timeout
    stuck: set[Path] = set()
    waited: set[Path] = set()
    attempt = 0
    while attempt < START_TRIES:
        retry = False
        # casfsd's own socket (root's CLI), the jobs socket every user reaches, then
        # the mount process another casfs run of this user started.
        for sock in (daemon_socket(state_dir), jobs_socket(), host_socket(state_dir)):
            left = deadline - time.monotonic()
            if sock in stuck or left <= 0:
                continue
            try:
                reply = _ask(sock, "lease", left, stuck_raises=True, caches=caches, pid=pid,
                             run=run)
                # casfsd's sockets outlive it across a restart, an upgrade or a crash
                # (re-execution: 0.3-6 s; systemd's restart after a crash: 5 s and a
                # start), refusing meanwhile beside a fresh mark: waited for once, not
                # taken for "nobody serves" (a review saw 9 of 72 `casfs env` fail
                # across two re-executions). No mark, or one older than
                # RESTART_MARK_FRESH (stopped, or dead for good): told at once.
                if reply is None and sock not in waited and _restarting(sock):
                    waited.add(sock)
                    until = time.monotonic() + min(deadline - time.monotonic(), RESTART_WAIT)
                    while reply is None and time.monotonic() < until:
                        time.sleep(0.05)  # (a connection the exiting one dropped: again)
                        reply = _ask(sock, "lease", left, stuck_raises=True, caches=caches,
                                     pid=pid, run=run,
                                     connect_wait=max(0.0, until - time.monotonic()))
            except DaemonStuckError as e:
                stuck.add(sock)
                last = f"{e.message} (a stopped or stuck mount process?)"
                continue
            if reply is None:
                continue
            if reply.get("ok"):
                return reply, sock
            last = str(reply.get("error"))
            if reply.get("retry"):  # being replaced (casfs.node.host): in a moment
                retry = True
                break
            if "stopping" not in last:
                raise CasfsError(f"the node's mount process refused: {last}")
        if retry and time.monotonic() < deadline:
            time.sleep(0.1)
            continue
        attempt += 1
        if start is None or stuck:
            raise DaemonUnavailableError(last or "no casfs mount process serves this node")
        try:
            from casfs.node.worker import spawn_host

            spawn_host(start)
            continue  # it serves (READY): ask it at once
        except UsageError as e:
            last = e.message  # another job started one first: use it
        except CasfsError as e:
            if "already runs" not in e.message and "stopping" not in e.message:
                raise
            last = e.message
        time.sleep(0.2 * attempt)
    raise CasfsError(f"could not reach this node's mount process: {last}")


def start_early(state_dir: Path, start: HostConfig) -> threading.Thread | None:
    """Start the node's mount process in a thread when nothing serves this node yet.

    ``casfs run`` calls this before it reads the job's fingerprint, so the mount
    process's start-up (imports, the FUSE mount) overlaps the probe of the job's
    interpreter. Join the thread before ``lease``; a failed start here is only
    logged: ``lease`` starts one again and reports why it cannot.
    """
    socks = (daemon_socket(state_dir), jobs_socket(), host_socket(state_dir))
    try:
        if any(s.exists() for s in socks):
            return None  # something serves (or did): lease() finds out which
    except OSError:
        return None

    def run() -> None:
        from casfs.node.worker import spawn_host

        try:
            spawn_host(start)
        except (CasfsError, OSError) as e:
            log.debug("early start of the mount process: %s", e)

    t = threading.Thread(target=run, name="casfs-start-host", daemon=True)
    t.start()
    return t


def follow(sock: Path, caches: list[dict[str, Any]], pid: int, run_lease: str, *,
           timeout: float = 60.0) -> str | None:
    """A second lease on ``caches``, held by process ``pid`` (the job) and following
    ``casfs run``'s lease ``run_lease``, from the mount process behind ``sock``
    (which already serves them); its id, or None (logged).

    ``casfs run`` holds its job's caches by its own pid; this lease holds them by
    the job's too, so a wrapper killed outright (SIGKILL, an OOM kill) does not
    release the namespace under a job that runs on.
    """
    reply = _ask(sock, "lease", timeout, caches=caches, pid=pid, follows=run_lease)
    if reply is None or not reply.get("ok"):
        # A job that ended before its lease was asked for (a short one) has nothing
        # to hold: casfs run's own lease covered it.
        say = log.warning if leases.alive(pid, None) else log.debug
        say("leasing the caches for the job (pid %d): %s", pid,
            (reply or {}).get("error", "the mount process is gone"))
        return None
    return str(reply["lease"])


def release(sock: Path, lease_id: str, *, wait: bool, timeout: float = 300.0,
            killed: bool = False, reaped_ok: bool = False) -> list[dict[str, Any]]:
    """Give the lease back; the per-namespace stats the mount process reports.
    ``killed``: the job was killed by a signal (what it wrote last is not published).
    ``reaped_ok``: the lease's holder has exited, so the mount process may have dropped
    the lease already (its lease check): "no such lease" is then no warning."""
    deadline = time.monotonic() + timeout
    reply = _ask(sock, "release", timeout, lease=lease_id, wait=wait, killed=killed)
    while reply is not None and reply.get("retry") and time.monotonic() < deadline:
        time.sleep(0.1)  # being replaced (casfs.node.host): the successor answers soon
        reply = _ask(sock, "release", max(1.0, deadline - time.monotonic()), lease=lease_id,
                     wait=wait, killed=killed)
    if reply is None or not reply.get("ok"):
        why = (reply or {}).get("error", "the mount process is gone")
        say = log.debug if reaped_ok and why == "no such lease" else log.warning
        say("releasing lease %s: %s", lease_id, why)
        return []
    return list(reply.get("namespaces", []))


def lease_pid_default() -> int:
    """The process a ``casfs env`` lease follows: the shell that runs it."""
    return os.getppid()
