"""The daemon's own control socket, ``<state_dir>/run/casfsd.sock``, and its lock.

Same protocol as the per-mount sockets (casfs.node.control): one JSON request
line, one JSON reply line. It answers ``status`` with the supervisor's view
(which mounts are up, restarting or stopped, worker pids, restart counts), so
``casfs status`` can show a mount that is down, which no per-mount socket can.
The socket is 0600 in a 0700 directory: root's daemon, root's CLI.

``casfsd.lock`` (flock) keeps a second daemon off the same state dir.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socketserver
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from casfs.errors import UsageError
from casfs.node.control import MAX_REQUEST, peer_credentials

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], dict[str, Any]]


def take_daemon_lock(run_dir: Path) -> int:
    """flock ``casfsd.lock``; UsageError naming the holder if another daemon has it."""
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = run_dir / "casfsd.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise UsageError(f"another casfsd (pid {holder}) is running with state dir"
                             f" {run_dir.parent}") from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class _RequestHandler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        self.connection.settimeout(10)
        try:
            line = self.rfile.readline(MAX_REQUEST)
            req = json.loads(line or b"{}")
            if not isinstance(req, dict):
                raise ValueError("request is not an object")
            req["_peer"] = peer_credentials(self.connection)  # never from the client
            reply = self.server.handler(req)
        except Exception as e:  # one bad request must not stop the server
            log.warning("daemon control request failed: %s", e)
            reply = {"ok": False, "error": str(e)}
        with contextlib.suppress(OSError):
            self.wfile.write(json.dumps(reply, default=str).encode() + b"\n")


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, handler: Handler) -> None:
        self.handler = handler
        super().__init__(path, _RequestHandler)


class ControlServer:
    """Serves ``handler`` on ``path`` in a background thread until ``close``."""

    def __init__(self, path: Path, handler: Handler, *, public: bool = False) -> None:
        """``public``: every user may connect (0666, in a 0755 directory): the jobs socket,
        whose handler decides by the peer's credentials (SO_PEERCRED) alone."""
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755 if public else 0o700)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # stale: we hold the daemon lock
        old = os.umask(0o111 if public else 0o177)
        try:
            self._server = _Server(str(path), handler)
        finally:
            os.umask(old)
        self._thread = threading.Thread(target=self._server.serve_forever, name="control",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
