"""casfsd's sockets: its own control socket, the jobs socket, and its lock.

Same protocol as the per-mount sockets (casfs.node.control): one JSON request
line, one JSON reply line. The control socket, ``<state_dir>/run/casfsd.sock``,
answers ``status`` with the supervisor's view (which mounts are up,
restarting or stopped, worker pids, restart counts), so ``casfs status`` can
show a mount that is down, which no per-mount socket can. It is 0600 in a
0700 directory: root's daemon, root's CLI. The jobs socket (casfs.daemon.jobs)
is every user's.

Both are served by one event loop thread per socket (``selectors``): an open
connection costs a file descriptor and a few hundred bytes, never a thread.
A connection must send its request within ``request_timeout`` or is closed;
complete requests are answered by a small pool of worker threads, at most
``requests_per_tenant`` of one tenant's at once (the others wait their turn,
so one tenant's slow or many requests never take every worker); connections
beyond ``connections`` in all or ``connections_per_tenant`` for one tenant
are answered one refusal line and closed at once.

``casfsd.lock`` (flock) keeps a second daemon off the same state dir.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import functools
import json
import logging
import os
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from casfs.errors import UsageError
from casfs.node.control import MAX_REQUEST, alive_mark, peer_credentials
from casfs.util import unixpath

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


@dataclass(frozen=True)
class ServerLimits:
    """What one socket's clients may cost (the jobs socket: ``[jobs]``)."""

    connections: int = 1024  # defaults: root's control socket (root's CLI only)
    connections_per_tenant: int = 1024
    requests_per_tenant: int = 16
    workers: int = 16
    request_timeout: float = 10.0


LINGER = 1.0  # seconds a refused connection may still send its request (then EOF)
LINGER_MAX = 64  # refused connections lingering at once; beyond, closed at once

TenantOf = Callable[[dict[str, int] | None], str]
Refused = Callable[[str, str, str], object]  # (tenant, bound, line): casfsd logs it


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    peer: dict[str, int] | None
    tenant: str
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
    out: bytes = b""
    state: str = "read"  # read | waiting | busy | write


def _reply_line(reply: dict[str, Any]) -> bytes:
    return json.dumps(reply, default=str).encode() + b"\n"


class ControlServer:
    """Serves ``handler`` on ``path`` from one event loop thread until ``close``."""

    def __init__(self, path: Path, handler: Handler, *, public: bool = False,
                 limits: ServerLimits | None = None, tenant_of: TenantOf | None = None,
                 on_refused: Refused | None = None, name: str = "control") -> None:
        """``public``: every user may connect (0666, in a 0755 directory): the jobs socket,
        whose handler decides by the peer's credentials (SO_PEERCRED) alone.
        ``tenant_of``: whom a connection counts against (default: its uid)."""
        self.path = path
        self.handler = handler
        self.limits = limits or ServerLimits()
        self.name = name
        self._tenant_of = tenant_of or (lambda p: f"u{p['uid']}" if p else "?")
        self._on_refused = on_refused or (lambda tenant, kind, line: log.warning(
            "%s socket: refused tenant %s: %s", name, tenant, line))
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755 if public else 0o700)
        # Bound beside it, then renamed over it: the path never goes missing. A casfsd
        # that exits for a restart leaves its socket (close(keep_path)), so a job asking
        # meanwhile is refused, not told nobody serves, and waits for the next casfsd
        # (casfs.node.client); we hold the daemon lock, so whatever is there is stale.
        fresh = path.with_name(f".{path.name}.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            fresh.unlink()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o111 if public else 0o177)
        try:
            with unixpath.reachable(fresh) as where:  # a long state dir path fits too
                self._listener.bind(where)
        finally:
            os.umask(old)
        # The kernel's bound (4096 by default), not 128: one tenant's connect loop
        # fills a small backlog faster than the accept thread drains it.
        self._listener.listen(socket.SOMAXCONN)
        os.rename(fresh, path)
        self.touch()
        self._listener.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, self._accept)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._sel.register(self._wake_r, selectors.EVENT_READ, self._woken)
        self._conns: set[_Conn] = set()
        self._lingering: dict[socket.socket, float] = {}  # refused, their line sent
        self._per_tenant: collections.Counter[str] = collections.Counter()
        self._busy: collections.Counter[str] = collections.Counter()
        self._waiting: dict[str, collections.deque[tuple[_Conn, bytes]]] = {}
        self._done: queue.SimpleQueue[tuple[_Conn, bytes]] = queue.SimpleQueue()
        self._work: queue.SimpleQueue[tuple[_Conn, bytes] | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._idle_workers = 0
        self._pool_lock = threading.Lock()
        self._next_expiry = float("inf")
        self._accept_paused_until = 0.0
        self._accept_warned = False
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # --- the event loop ----------------------------------------------------------------
    def _loop(self) -> None:
        while not self._closing:
            now = time.monotonic()
            wait = min(self._next_expiry, self._accept_paused_until or float("inf")) - now
            try:
                events = self._sel.select(max(0.0, min(wait, 1.0)))
            except OSError:
                if self._closing:
                    return
                raise
            for key, mask in events:
                try:
                    key.data(key, mask)
                except Exception:  # one client must never stop the server
                    log.exception("%s socket: serving a client failed", self.name)
            now = time.monotonic()
            if self._accept_paused_until and now >= self._accept_paused_until:
                self._accept_paused_until = 0.0
                self._sel.register(self._listener, selectors.EVENT_READ, self._accept)
            if now >= self._next_expiry:
                self._expire(now)

    def _woken(self, key: selectors.SelectorKey, mask: int) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        while True:
            try:
                conn, data = self._done.get_nowait()
            except queue.Empty:
                return
            self._finished(conn, data)

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full: already woken
            os.write(self._wake_w, b"x")

    def _accept(self, key: selectors.SelectorKey, mask: int) -> None:
        lim = self.limits
        for _ in range(256):  # then let the others' events in
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as e:
                # Out of fds or memory: stop accepting for a moment (the listener would
                # wake the loop at once, forever), keep serving what is open.
                if not self._accept_warned:
                    log.warning("%s socket: cannot accept a client: %s", self.name, e)
                    self._accept_warned = True
                self._sel.unregister(self._listener)
                self._accept_paused_until = time.monotonic() + 0.1
                return
            self._accept_warned = False
            sock.setblocking(False)
            peer = peer_credentials(sock)
            try:
                tenant = self._tenant_of(peer)
            except Exception as e:  # a bug: count it as its uid's
                log.warning("%s socket: whose is this connection (%s)? %s", self.name, peer, e)
                tenant = f"u{peer['uid']}" if peer else "?"
            if len(self._conns) >= lim.connections:
                self._refuse(sock, tenant, "connections",
                             f"casfsd has {len(self._conns)} connections open, the most it"
                             f" serves (jobs.connections = {lim.connections}): try again")
            elif self._per_tenant[tenant] >= lim.connections_per_tenant:
                self._refuse(sock, tenant, "connections_per_tenant",
                             f"tenant {tenant} has {self._per_tenant[tenant]} connections"
                             f" open, the most it may (jobs.connections_per_tenant ="
                             f" {lim.connections_per_tenant}): refused")
            else:
                conn = _Conn(sock, peer, tenant, time.monotonic() + lim.request_timeout)
                self._conns.add(conn)
                self._per_tenant[tenant] += 1
                self._next_expiry = min(self._next_expiry, conn.deadline)
                self._sel.register(sock, selectors.EVENT_READ, functools.partial(
                    self._readable, conn))

    def _refuse(self, sock: socket.socket, tenant: str, kind: str, line: str) -> None:
        """Answer one refusal line and close. The client's request may not have come
        yet, and its send would then fail (EPIPE) before it reads the line: wait a
        moment for it, unless many refused connections already wait (a flood)."""
        self._on_refused(tenant, kind, line)
        with contextlib.suppress(OSError):
            sock.send(_reply_line({"ok": False, "error": line, "bound": kind}))
        try:
            sock.recv(MAX_REQUEST)
            asked = True  # its request (or EOF) came: it reads the line, or is gone
        except (BlockingIOError, InterruptedError):
            asked = False
        except OSError:
            asked = True
        if asked or len(self._lingering) >= LINGER_MAX:
            sock.close()
            return
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + LINGER
        self._lingering[sock] = deadline
        self._next_expiry = min(self._next_expiry, deadline)
        self._sel.register(sock, selectors.EVENT_READ, functools.partial(self._lingered, sock))

    def _lingered(self, sock: socket.socket, key: selectors.SelectorKey | None = None,
                  mask: int = 0) -> None:
        with contextlib.suppress(OSError):
            sock.recv(MAX_REQUEST)
        self._lingering.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(sock)
        sock.close()

    def _readable(self, conn: _Conn, key: selectors.SelectorKey, mask: int) -> None:
        try:
            chunk = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        conn.buf += chunk
        if not chunk and not conn.buf:
            self._drop(conn)  # gone without a word
            return
        if chunk and b"\n" not in chunk and len(conn.buf) < MAX_REQUEST:
            return
        self._sel.unregister(conn.sock)
        line = bytes(conn.buf.split(b"\n", 1)[0][:MAX_REQUEST])
        conn.buf = bytearray()
        self._dispatch(conn, line)

    def _dispatch(self, conn: _Conn, line: bytes) -> None:
        if self._busy[conn.tenant] >= self.limits.requests_per_tenant:
            conn.state = "waiting"  # this tenant's turn comes when one of its own ends
            self._waiting.setdefault(conn.tenant, collections.deque()).append((conn, line))
            return
        conn.state = "busy"
        self._busy[conn.tenant] += 1
        self._submit(conn, line)

    def _finished(self, conn: _Conn, data: bytes) -> None:
        self._busy[conn.tenant] -= 1
        if self._busy[conn.tenant] <= 0:
            del self._busy[conn.tenant]
        waiting = self._waiting.get(conn.tenant)
        if waiting:
            nxt, line = waiting.popleft()
            if not waiting:
                del self._waiting[conn.tenant]
            self._dispatch(nxt, line)
        if conn not in self._conns:
            return
        conn.out = data
        conn.state = "write"
        conn.deadline = time.monotonic() + self.limits.request_timeout
        self._next_expiry = min(self._next_expiry, conn.deadline)
        if self._send(conn):
            self._sel.register(conn.sock, selectors.EVENT_WRITE,
                               functools.partial(self._writable, conn))

    def _send(self, conn: _Conn) -> bool:
        """Send what it can; whether more is left."""
        try:
            n = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            self._drop(conn)
            return False
        conn.out = conn.out[n:]
        if conn.out:
            return True
        self._drop(conn)  # one request, one reply
        return False

    def _writable(self, conn: _Conn, key: selectors.SelectorKey, mask: int) -> None:
        if not self._send(conn):
            return

    def _expire(self, now: float) -> None:
        nxt = float("inf")
        for sock, deadline in list(self._lingering.items()):
            if deadline <= now:
                self._lingered(sock)
            else:
                nxt = min(nxt, deadline)
        for conn in list(self._conns):
            if conn.state not in ("read", "write"):
                continue
            if conn.deadline > now:
                nxt = min(nxt, conn.deadline)
                continue
            if conn.state == "read":
                line = (f"no request within {self.limits.request_timeout:g}s"
                        " (jobs.request_timeout): closed")
                self._on_refused(conn.tenant, "request_timeout", line)
                with contextlib.suppress(OSError):
                    conn.sock.send(_reply_line({"ok": False, "error": line}))
            self._drop(conn)
        self._next_expiry = nxt

    def _drop(self, conn: _Conn) -> None:
        if conn not in self._conns:
            return
        self._conns.discard(conn)
        self._per_tenant[conn.tenant] -= 1
        if self._per_tenant[conn.tenant] <= 0:
            del self._per_tenant[conn.tenant]
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()

    # --- the workers ---------------------------------------------------------------------
    def _submit(self, conn: _Conn, line: bytes) -> None:
        with self._pool_lock:
            if self._idle_workers <= 0 and len(self._workers) < self.limits.workers:
                t = threading.Thread(target=self._worker, name=f"{self.name}-worker",
                                     daemon=True)
                self._workers.append(t)
                self._idle_workers += 1
                t.start()
            self._idle_workers -= 1
        self._work.put((conn, line))

    def _worker(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            conn, line = item
            try:
                data = _reply_line(self._answer(conn, line))
            finally:
                with self._pool_lock:
                    self._idle_workers += 1
            self._done.put((conn, data))
            self._wake()

    def _answer(self, conn: _Conn, line: bytes) -> dict[str, Any]:
        try:
            req = json.loads(line or b"{}")
            if not isinstance(req, dict):
                raise ValueError("request is not an object")
            req["_peer"] = conn.peer  # never from the client
            return self.handler(req)
        except Exception as e:  # one bad request must not stop the server
            log.warning("daemon control request failed: %s", e)
            return {"ok": False, "error": str(e)}

    # --- the end ---------------------------------------------------------------------------
    def touch(self) -> None:
        """Say this socket's casfsd is alive (casfs.node.control.alive_mark)."""
        with contextlib.suppress(OSError):
            alive_mark(self.path).write_text(f"{os.getpid()} {time.time():.0f}\n")

    def close(self, *, keep_path: bool = False) -> None:
        """``keep_path``: a restart: leave the socket's path and its mark, touched (the
        next casfsd is on its way: casfs.node.client waits then; see __init__). The mark
        first: a job this one refuses or drops from here on finds it fresh."""
        if keep_path:
            self.touch()
        self._closing = True
        self._wake()
        self._thread.join(5)
        for _ in self._workers:
            self._work.put(None)
        for conn in list(self._conns):
            self._drop(conn)
        for sock in list(self._lingering):
            self._lingered(sock)
        self._sel.close()
        self._listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        if not keep_path:
            for gone in (self.path, alive_mark(self.path)):
                with contextlib.suppress(FileNotFoundError):
                    gone.unlink()
