"""A namespace on one node: its lock, the record that it is served, and the reclaim protocol.

- **The lock** ``<state>/run/ns-<namespace>.lock``: one mount (or reclaim) of a
  namespace per state dir at a time (``take_lock``).
- **The served record** ``<state>/served/<namespace>.json``: the MountConfig
  and when it was last served, written at a mount's start and end; what
  ``casfs.node.reclaim`` lists to find idle namespaces.
- **The reclaim protocol.** A reclaim holds ``ns-<namespace>.reclaim`` as long
  as it holds the namespace's lock; a mount that finds the lock taken by a
  reclaim waits for it (at most ``shutdown_timeout``), holding
  ``ns-<namespace>.wanted`` shared, so that a reclaim not past its publication
  keeps the node state for it (docs/architecture.md, reclaim).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from pathlib import Path

from casfs.errors import UsageError
from casfs.node.config import MountConfig
from casfs.util import atomic
from casfs.util.flock import try_flock

log = logging.getLogger(__name__)

SERVED_DIR = "served"


# --- the served record ------------------------------------------------------------
def record_path(state_dir: Path, namespace: str) -> Path:
    return state_dir / SERVED_DIR / f"{namespace}.json"


def record_served(cfg: MountConfig) -> None:
    """Note that ``cfg``'s namespace is served now (at start and at the end of a mount)."""
    path = record_path(cfg.state_dir, cfg.namespace)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = {"config": json.loads(cfg.to_json()), "last_served": time.time()}
        atomic.write_atomic(path, json.dumps(data).encode())
    except OSError as e:
        log.warning("%s: cannot record that it is served: %s", cfg.name, e)


def last_served(cfg: MountConfig) -> float | None:
    try:
        return float(json.loads(record_path(cfg.state_dir, cfg.namespace).read_bytes())
                     ["last_served"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def idle_namespaces(state_dir: Path, idle_after: float, now: float | None = None,
                    ) -> list[tuple[MountConfig, float]]:
    """(config, last served) of namespaces not served for ``idle_after`` seconds."""
    now = time.time() if now is None else now
    out = []
    for p in sorted((state_dir / SERVED_DIR).glob("*.json")):
        try:
            data = json.loads(p.read_bytes())
            cfg = MountConfig.from_json(json.dumps(data["config"]))
            last = float(data["last_served"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("ignoring unreadable %s: %s", p, e)
            continue
        if now - last >= idle_after and cfg.mode != "dir":
            out.append((cfg, last))
    return out


# --- lock files -------------------------------------------------------------------
def lock_file(run_dir: Path, ns: str, what: str) -> int:
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return os.open(run_dir / f"ns-{ns}.{what}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _held(run_dir: Path, ns: str, what: str, how: int) -> bool:
    """Whether another holds a lock on ``ns-<ns>.<what>`` that excludes ``how``."""
    fd = lock_file(run_dir, ns, what)
    try:
        return not try_flock(fd, how)
    finally:
        os.close(fd)  # releases what it took


def reclaim_in_progress(run_dir: Path, ns: str) -> bool:
    """A reclaim of ``ns`` holds its lock (a mount waits for it instead of failing)."""
    return _held(run_dir, ns, "reclaim", fcntl.LOCK_SH)


def want(run_dir: Path, ns: str) -> int:
    """Say that a mount waits for ``ns`` while the fd returned is open."""
    fd = lock_file(run_dir, ns, "wanted")
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # a reclaim's check holds EX for an instant only
    except BaseException:
        os.close(fd)
        raise
    return fd


def wanted(run_dir: Path, ns: str) -> bool:
    return _held(run_dir, ns, "wanted", fcntl.LOCK_EX)


def hold_draining(run_dir: Path, ns: str) -> int:
    """``ns-<ns>.draining``, held shared by every process that handed ``ns`` over and
    still serves what jobs hold open of it (casfs.node.handover): no reclaim meanwhile."""
    fd = lock_file(run_dir, ns, "draining")
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return fd


def draining(run_dir: Path, ns: str) -> bool:
    return _held(run_dir, ns, "draining", fcntl.LOCK_EX)


HANDOVER_LOCK_WAIT = 10.0  # a successor waits this long for a handing-over mount's lock
# A lock just let go of may still look held for a moment: a process of ours that forks
# (a worker's spawn, from another thread) copies every fd, this lock's too, until its
# child execs (O_CLOEXEC). A namespace released and served again at once (a lease
# right after a release; a restart) waits this long before calling it mounted.
FORK_WINDOW = 2.0


def take_lock(cfg: MountConfig, wait_for_reclaim: bool = True) -> int:
    """The namespace's lock, as an fd to keep open while the namespace is served.

    Held by another mount (or by anything, for the reclaim itself:
    ``wait_for_reclaim`` False): UsageError at once, unless a mount is handing
    the namespace over (a ``draining`` lock is held): then it waits for the lock,
    at most HANDOVER_LOCK_WAIT. Held by a reclaim of the namespace: waits for it,
    at most ``shutdown_timeout``, holding ``ns-<ns>.wanted`` shared meanwhile.
    A reclaim never takes a namespace that a draining process still serves.
    """
    ns = cfg.namespace
    fd = lock_file(cfg.run_dir, ns, "lock")
    wanted_fd: int | None = None
    try:
        deadline = time.monotonic() + cfg.shutdown_timeout
        handover_until = time.monotonic() + HANDOVER_LOCK_WAIT
        fork_until = time.monotonic() + FORK_WINDOW
        while not try_flock(fd):
            if (wait_for_reclaim and time.monotonic() < handover_until
                    and draining(cfg.run_dir, ns)):
                time.sleep(0.02)
                continue
            if not wait_for_reclaim or not reclaim_in_progress(cfg.run_dir, ns):
                # The reclaim releases the namespace's lock before its own: free now,
                # unless another mount took it.
                if try_flock(fd):
                    break
                if wait_for_reclaim and time.monotonic() < fork_until:
                    time.sleep(0.02)
                    continue
                raise UsageError(f"namespace {ns} is already mounted from {cfg.state_dir}")
            if wanted_fd is None:
                wanted_fd = want(cfg.run_dir, ns)
                log.info("%s: %s is being reclaimed: waiting for it (at most %.0fs)",
                         cfg.name, ns, cfg.shutdown_timeout)
            if time.monotonic() > deadline:
                raise UsageError(f"namespace {ns} is being reclaimed on this node (for"
                                 f" over {cfg.shutdown_timeout:.0f}s); try again")
            time.sleep(0.05)
    except BaseException:
        os.close(fd)
        raise
    finally:
        if wanted_fd is not None:
            os.close(wanted_fd)
    if not wait_for_reclaim and draining(cfg.run_dir, ns):
        os.close(fd)
        raise UsageError(f"namespace {ns} is still served by a mount process that handed it"
                         " over (it drains what jobs hold open)")
    return fd
