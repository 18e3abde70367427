"""Dir mode's jobs of one namespace share one process; the last one out stops it.

Without FUSE there is no node mount process handing out leases: the first
``casfs run --mode dir`` of a namespace spawns the dir-mode process (it
restores, watches with inotify, promotes and publishes), and a second job of
the namespace on the node shares its directory. As in fuse mode, the last job
out publishes and releases: whichever job ends last stops the process, which
publishes everything stable (SIGTERM: the final publication), and until then
the files any of the jobs writes are watched and promoted.

Two flock'd files next to the mount registry, keyed by the served directory:

- ``<key>.join``: held exclusive while a job joins (finds the running process
  or spawns one) and while a job leaves (finds whether it is the last, and if
  so stops the process). The two never interleave while the stopping job lives,
  so a job never spawns a second process beside it (and for when the stopping
  job is gone, see below).
- ``<key>.users``: each job holds it shared while it runs. A leaving job drops
  its share and, under the join lock, tries it exclusive without waiting:
  success means no other job is left.

A job killed outright drops its share with its process (the kernel releases
flocks), so the jobs left still find the last one among them. The spawner
that is not the last leaves the process running (it lives in its own session)
for the last job, which stops it by pid: the registry's pid, checked to be a
casfs worker whose ``--stats-out`` names the entry (``/proc/<pid>/cmdline``,
``serves``) through a pidfd, so a reused pid is never signalled, and never
joined either.

A process being stopped is never joined. The final publication takes seconds,
and the join lock does not always cover it: the stopping ``casfs run`` may be
killed meanwhile (a scheduler's SIGTERM/SIGKILL), or give up after SIGKILL
while the process lingers, or the process was stopped by someone else. A job
joining it then would have its files written after the final scan, never
watched nor published. So the stopping job writes ``<key>.stopping`` (the
pid) before it signals, and the process marks its registry entry
``"stopping": true`` once its shutdown starts; a joining job that finds either
waits (under the join lock, at most ``shutdown_timeout`` + 15 s) for that
process to exit, then spawns a fresh one; one that is still there after that
is not joined either (the job falls back to a private directory, as when no
process can be spawned).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from casfs.util.fdwait import readable

log = logging.getLogger(__name__)

WORKER_MODULE = b"casfs.node.worker"


class DirShare:
    """One job's membership of a dir-mode directory (``run_dir``: the registry's)."""

    def __init__(self, run_dir: Path, mountpoint: Path) -> None:
        key = hashlib.sha256(os.fsencode(mountpoint)).hexdigest()[:20]
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._join = run_dir / f"dirshare-{key}.join"
        self._users = run_dir / f"dirshare-{key}.users"
        self._pid = run_dir / f"dirshare-{key}.pid"  # the process a casfs run spawned
        self._stop = run_dir / f"dirshare-{key}.stopping"  # the process a job is stopping
        self._fd: int | None = None  # our shared lock on ``_users`` while the job runs

    def _open(self, path: Path) -> int:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)

    @contextlib.contextmanager
    def joining(self) -> Iterator[None]:
        """Hold the join lock: find or spawn the process, then ``enter``."""
        fd = self._open(self._join)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def spawned(self, pid: int | None = None) -> int | None:
        """Record the pid of the process this job spawned (under ``joining``); without
        ``pid``, the one recorded: only that one is the jobs' to stop (a ``casfs mount``
        of the same directory is not)."""
        if pid is not None:
            from casfs.util.atomic import write_atomic

            write_atomic(self._pid, str(pid).encode())
            self._stop.unlink(missing_ok=True)
            return pid
        try:
            return int(self._pid.read_bytes())
        except (OSError, ValueError):
            return None

    def stopping(self, pid: int | None = None) -> int | None:
        """Record that the process ``pid`` is being stopped (under ``joining``, before
        signalling it); without ``pid``, the one recorded."""
        if pid is not None:
            from casfs.util.atomic import write_atomic

            try:
                write_atomic(self._stop, str(pid).encode())
            except OSError as e:  # best effort: the process marks its own entry too
                log.warning("recording that pid %d stops: %s", pid, e)
            return pid
        try:
            return int(self._stop.read_bytes())
        except (OSError, ValueError):
            return None

    def is_stopping(self, info: dict[str, Any]) -> bool:
        """Whether registry entry ``info``'s process is stopping (never join it)."""
        return bool(info.get("stopping")) or self.stopping() == int(info["pid"])

    def enter(self) -> None:
        """Count this job in (call under ``joining``)."""
        if self._fd is None:
            fd = self._open(self._users)
            fcntl.flock(fd, fcntl.LOCK_SH)
            self._fd = fd

    def drop(self) -> None:
        """Count this job out without deciding anything (it never served)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @contextlib.contextmanager
    def leaving(self) -> Iterator[bool]:
        """Count this job out; yields whether it was the last (then stop the process
        inside the block: nobody joins until it is gone)."""
        with self.joining():
            self.drop()
            fd = self._open(self._users)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    last = True
                except BlockingIOError:
                    last = False
                yield last
            finally:
                os.close(fd)


def serves(run_dir: Path, info: dict[str, Any]) -> bool:
    """Whether registry entry ``info``'s pid is the casfs worker that wrote it: a
    ``casfs.node.worker`` whose ``--stats-out`` is the entry's name in ``run_dir``.

    An entry outlives a process killed outright, and its pid may be reused by
    anything, another casfs worker included (of another namespace or mount):
    such a process is neither joined nor stopped."""
    try:
        pid, name = int(info["pid"]), str(info["name"])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except (OSError, KeyError, TypeError, ValueError):
        return False
    if WORKER_MODULE not in args or b"--stats-out" not in args[:-1]:
        return False
    out = os.fsdecode(args[args.index(b"--stats-out") + 1])
    if os.path.basename(out) != f"{name}.final-stats":
        return False
    try:
        return os.path.samefile(os.path.dirname(out), run_dir)
    except OSError:
        return False


def wait_exit(pid: int, timeout: float) -> bool:
    """Wait at most ``timeout`` seconds for process ``pid`` (not our child) to exit."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return readable(pidfd, timeout)
    finally:
        os.close(pidfd)


def stop_registered(run_dir: Path, info: dict[str, Any], timeout: float) -> dict[str, Any] | None:
    """Stop the dir-mode process of registry entry ``info`` (not our child): SIGTERM,
    wait for its exit (its final publication), SIGKILL after ``timeout``; its final
    stats, None if it left none."""
    pid = int(info["pid"])
    stats = run_dir / f"{info['name']}.final-stats"
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        pidfd = None
    if pidfd is not None:
        try:
            if serves(run_dir, info):  # checked after the pidfd pins the process
                signal.pidfd_send_signal(pidfd, signal.SIGTERM)
                if not readable(pidfd, timeout):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    readable(pidfd, 10)
        except ProcessLookupError:
            pass
        finally:
            os.close(pidfd)
    try:  # written before it exits
        return dict(json.loads(stats.read_bytes()))
    except (OSError, ValueError):
        return None
