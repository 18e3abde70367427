"""Taking over a mount process another casfsd started (casfs.node.lifeline).

After ``systemctl restart casfsd``, a casfsd killed outright, or ``kill -USR2``
(casfsd re-executes itself), the mount processes serve on: the new casfsd
finds each configured mount's registry entry, sends ``adopt``, and supervises
the process it names as if it had started it. The process is no child of the
new casfsd after a restart (it is after a re-exec): it is watched through a
pidfd, and its exit status is unknown then.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from casfs.errors import CasfsError
from casfs.node import control
from casfs.node.worker import Worker
from casfs.util.fdwait import readable

log = logging.getLogger(__name__)

ADOPT_TIMEOUT = 5.0


class AdoptedProc:
    """The part of ``subprocess.Popen`` a supervisor uses, for a process it did not start."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.status_known = True
        self._fd: int | None = os.pidfd_open(pid)

    def _reaped(self, status: int) -> int:
        self.returncode = os.waitstatus_to_exitcode(status)
        self._close()
        return self.returncode

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def poll(self) -> int | None:
        if self.returncode is not None or self._fd is None:
            return self.returncode
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)  # our child after a re-exec
            if pid == self.pid:
                return self._reaped(status)
            return None
        except ChildProcessError:
            pass
        if readable(self._fd, 0):  # exited: its status was its parent's to collect
            self.status_known = False
            self.returncode = 0
            self._close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        fd = self._fd
        if self.poll() is None and fd is not None and not readable(fd, timeout):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
        while (rc := self.poll()) is None:  # exited, the zombie not yet reapable: soon
            time.sleep(0.01)
        return rc

    def send_signal(self, sig: int) -> None:
        if self._fd is not None and self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._fd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _ask_adopt(entry: dict[str, Any], sock: Any) -> tuple[AdoptedProc, dict[str, Any]] | None:
    """Send ``adopt`` to the process of a registry entry: (its handle, the reply), or None
    if it is gone. A reply naming another pid is no adoption of this one."""
    try:
        proc = AdoptedProc(int(entry["pid"]))
    except (OSError, KeyError, ValueError, TypeError):
        return None
    try:
        reply = control.request(sock, "adopt", timeout=ADOPT_TIMEOUT)
    except CasfsError as e:
        reply = {"ok": False, "error": e.message}
    if reply.get("ok") and reply.get("pid") != proc.pid:
        reply = {"ok": False, "error": f"pid {reply.get('pid')} answered"}
    return proc, reply


def orphans(run_dir: Path, names: set[str]) -> list[tuple[dict[str, Any], AdoptedProc]]:
    """Mount processes a casfsd left serving whose mount is not in ``names`` (removed
    from the configuration meanwhile), now adopted: (registry entry, process). Processes
    not started by a casfsd (``casfs mount``) refuse adoption and are left alone."""
    out = []
    for e in control.registered(run_dir):
        if e.get("name") in names or not e.get("socket"):
            continue
        asked = _ask_adopt(e, str(e["socket"]))
        if asked is not None and asked[1].get("ok"):
            out.append((e, asked[0]))
    return out


def adopt(cfg: Any, cfg_text: str, build: str) -> tuple[Worker, bool] | None:
    """The running mount process of ``cfg`` (same name, same mount point), now ours, and
    whether it must be replaced (another configuration or another build of casfs).
    None: there is none, or none left: one that refuses (an older release, which stops
    by itself when its lifeline closes) is stopped here, and the caller starts one."""
    entry = next((e for e in control.registered(cfg.run_dir) if e.get("name") == cfg.name),
                 None)
    if entry is None or entry.get("mountpoint") != str(cfg.mountpoint):
        return None
    asked = _ask_adopt(entry, entry.get("socket") or cfg.socket_path)
    if asked is None:
        return None  # gone since
    proc, reply = asked
    pid = proc.pid
    if not reply.get("ok"):
        log.warning("%s: the running mount process (pid %d) cannot be adopted (%s):"
                    " stopping it, then mounting again (jobs see the gap)", cfg.name, pid,
                    reply.get("error"))
        Worker(cfg, proc, Path(os.devnull), None, None).stop()  # type: ignore[arg-type]
        return None
    stats = Path(str(reply.get("stats_out") or cfg.run_dir / f"{cfg.name}.final-stats"))
    why = [w for w, differs in (("its configuration changed", reply.get("config") != cfg_text),
                                ("another casfs build", reply.get("build") != build))
           if differs]
    log.info("%s: adopted the running mount process pid %d (%s at %s)%s", cfg.name, pid,
             cfg.namespace, cfg.mountpoint, f"; replacing it: {', '.join(why)}" if why else "")
    return Worker(cfg, proc, stats, None, None), bool(why)  # type: ignore[arg-type]
