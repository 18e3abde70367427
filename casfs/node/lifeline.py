"""A mount process's tie to its supervisor, and adoption by the next one.

casfsd starts each mount process with a lifeline: a pipe whose write end only
casfsd holds. When it closes (casfsd exited, was killed, or re-executed
itself), a mount process started with ``--adopt-grace S`` serves on for up to
S seconds, waiting for a new casfsd to adopt it: the next casfsd finds it by
its registry entry (``<run>/<name>.json``) and sends ``adopt`` on its control
socket. The adopter's pid (SO_PEERCRED: the socket is root's, 0600) becomes
the new lifeline, watched through a pidfd. Nobody adopts it in time: it shuts
down as before (final publication, unmount). Jobs never see the supervisor
change: the FUSE connection is this process's, not casfsd's.

Without a grace (``casfs mount``, ``casfs run``: the caller is the only user)
the lifeline's end shuts the process down at once. A process that stepped
aside for a successor (casfs.node.handover) no longer needs a supervisor: it
drains what jobs hold and exits by itself.

The adopt reply names what the adopter needs to supervise, and to decide
whether this process must be replaced (casfs.daemon.supervisor): its pid, its
configuration as it was given, the code it runs (``build``), where it writes
its final stats.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

ADOPT_VERSION = 1  # the adopt reply's format (docs/format.md)


class Lifeline:
    def __init__(self, fd: int, grace: float, identity: dict[str, Any],
                 on_gone: Callable[[], object] | None = None) -> None:
        self.grace = grace
        # what the end of the lifeline does: a clean shutdown (final publication, unmount)
        self.on_gone = on_gone or (lambda: os.kill(os.getpid(), signal.SIGTERM))
        self.identity = identity  # config, stats_out, build, version: the adopt reply
        self.detached = False
        self.adopter: int | None = None
        self._fd = fd
        self._is_pidfd = False
        self._next: int | None = None  # a new adopter's pidfd, for the watcher to take
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()

    def start(self) -> None:
        threading.Thread(target=self._watch, name="lifeline", daemon=True).start()

    # --- the watcher ------------------------------------------------------------------
    def _wait(self, fd: int | None, timeout: float | None) -> str:
        """'closed' (the supervisor is gone), 'adopted' (a new one sent adopt) or
        'timeout'."""
        p = select.poll()
        p.register(self._wake_r, select.POLLIN)
        if fd is not None:
            p.register(fd, select.POLLIN)
        while True:
            ready = p.poll(None if timeout is None else int(timeout * 1000))
            if not ready:
                return "timeout"
            for rfd, _ in ready:
                if rfd == self._wake_r:
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 64)
                    return "adopted"
                if self._is_pidfd:
                    return "closed"  # a pidfd turns readable when its process exits
                try:
                    if not os.read(rfd, 64):
                        return "closed"
                except OSError:
                    return "closed"

    def _take_next(self) -> None:
        with self._lock:
            nxt, self._next = self._next, None
        if nxt is None:
            return
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd, self._is_pidfd = nxt, True

    def _watch(self) -> None:
        while True:
            what = self._wait(self._fd, None)
            if what == "adopted":
                self._take_next()
                continue
            if self.detached:
                log.info("the supervisor is gone; this process serves what jobs hold"
                         " open until they let go, then exits")
                return
            if self.grace <= 0:
                log.warning("the parent process is gone: shutting down")
                break
            log.info("the supervisor (pid %s) is gone: serving on, waiting up to %gs for a"
                     " new casfsd to adopt this mount", self.adopter or "parent", self.grace)
            if self._wait(None, self.grace) == "adopted":
                self._take_next()
                continue
            log.warning("no casfsd adopted this mount within %gs: shutting down", self.grace)
            break
        self.on_gone()

    # --- adoption ---------------------------------------------------------------------
    def adopt(self, peer: dict[str, int] | None) -> dict[str, Any]:
        if self.detached:
            return {"ok": False, "error": "this mount process stepped aside for a successor"}
        if peer is None or peer.get("uid") not in (0, os.geteuid()):
            return {"ok": False, "error": "only root or this process's owner may adopt it"}
        pid = int(peer["pid"])
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as e:
            return {"ok": False, "error": f"cannot watch the adopter (pid {pid}): {e}"}
        with self._lock:
            old, self._next = self._next, pidfd
            self.adopter = pid
        if old is not None:
            os.close(old)
        os.write(self._wake_w, b"a")
        log.info("adopted by pid %d", pid)
        return {"ok": True, "adopt_version": ADOPT_VERSION, "pid": os.getpid(),
                **self.identity}


_current: Lifeline | None = None


def watch(fd: int, grace: float, identity: dict[str, Any]) -> Lifeline:
    """Watch the lifeline ``fd`` (this process's one)."""
    global _current
    _current = Lifeline(fd, grace, identity)
    _current.start()
    return _current


def adopt(req: dict[str, Any]) -> dict[str, Any]:
    """The control command ``adopt``: the caller supervises this process from now on."""
    if _current is None or _current.grace <= 0:
        return {"ok": False, "error": "this mount process was not started by casfsd: it"
                                      " has no supervisor to be adopted from"}
    return _current.adopt(req.get("_peer"))


def detach() -> None:
    """Stepped aside (casfs.node.handover): the supervisor's end no longer stops us."""
    if _current is not None:
        _current.detached = True
