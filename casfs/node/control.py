"""The local control socket of a running mount, and its client.

Protocol: one JSON object per line each way. Request ``{"cmd": "status" |
"stats" | "publish" | "refresh" | "adopt" (casfs.node.lifeline) | ...}``; reply
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``. The socket lives in the node state dir's
``run/`` (mode 0700 dir, 0600 socket: root's daemon, root's CLI), next to a
``<name>.json`` registry file naming the mount point, so ``casfs stats
MOUNTPOINT`` can find it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import trio  # imported where used: the CLI asks mounts without loading trio

from casfs.errors import DaemonStuckError, DaemonUnavailableError, UsageError
from casfs.node import lifeline
from casfs.util import atomic, unixpath

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
MAX_REQUEST = 64 << 10
_TRANSIENT_ACCEPT = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM,
                     errno.ECONNABORTED, errno.EPROTO, errno.EINTR}


async def serve_control(sock_path: Path, handler: Handler,
                        task_status: trio.TaskStatus[None] | None = None) -> None:
    import trio

    sock_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileNotFoundError):
        sock_path.unlink()
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        with unixpath.reachable(sock_path) as where:
            await listener.bind(where)
    finally:
        os.umask(old)
    listener.listen(16)
    try:
        ours = os.stat(sock_path).st_ino
    except OSError:
        ours = None
    if task_status is not None:
        task_status.started()
    try:
        async with trio.open_nursery() as nursery:
            warned = False
            while True:
                try:
                    conn, _ = await listener.accept()
                except OSError as e:
                    # Out of fds or memory (or a client gone before accept): this task
                    # runs in the mount's nursery, and an exception here would end the
                    # FUSE loop. Refuse this client, keep serving the job.
                    if e.errno not in _TRANSIENT_ACCEPT:
                        raise
                    if not warned:
                        log.warning("control socket: cannot accept a client: %s", e)
                        warned = True
                    await trio.sleep(0.1)
                    continue
                warned = False
                nursery.start_soon(_serve_one, conn, handler)
    finally:
        listener.close()
        # Only our own: after a handover the path is the successor's socket.
        with contextlib.suppress(OSError):
            if os.stat(sock_path).st_ino == ours:
                sock_path.unlink()


async def _serve_one(conn: trio.socket.SocketType, handler: Handler) -> None:
    import trio

    with conn:
        buf = b""
        with trio.move_on_after(10):
            while b"\n" not in buf and len(buf) < MAX_REQUEST:
                chunk = await conn.recv(4096)
                if not chunk:
                    break
                buf += chunk
        try:
            req = json.loads(buf.split(b"\n", 1)[0] or b"{}")
            if not isinstance(req, dict):
                raise ValueError("request is not an object")
            req["_peer"] = peer_credentials(conn)  # set here only: a client cannot forge it
            if req.get("cmd") == "adopt":  # the process's, whatever it serves
                reply = lifeline.adopt(req)
            else:
                reply = await handler(req)
        except UsageError as e:  # refused: the client is told why and says so itself
            log.info("control request refused: %s", e)
            reply = {"ok": False, "error": str(e)}
        except Exception as e:  # one bad request must not stop the server
            log.warning("control request failed: %s", e)
            reply = {"ok": False, "error": str(e)}
        data = json.dumps(reply, default=str).encode() + b"\n"
        with contextlib.suppress(OSError):
            while data:
                sent = await conn.send(data)
                data = data[sent:]


def peer_credentials(conn: Any) -> dict[str, int] | None:
    """pid, uid, gid of the process at the other end of a unix socket (SO_PEERCRED)."""
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid, uid, gid = struct.unpack("3i", raw)
    return {"pid": pid, "uid": uid, "gid": gid}


@contextlib.contextmanager
def _registry_lock(run_dir: Path, name: str) -> Iterator[None]:
    """Writers and removers of ``name``'s entry, one at a time: a predecessor removing
    its own entry at exit must not read it, then unlink the successor's written since."""
    import fcntl

    fd = os.open(run_dir / f"{name}.json.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_registry(run_dir: Path, name: str, info: dict[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _registry_lock(run_dir, name):
        # Not fsynced: an entry describes a live process (a reboot makes it stale
        # anyway; readers check the pid), and on a fresh node's disk an fsync waited
        # 65 ms behind the fetched namespace's writeback, between the mount and READY.
        atomic.write_atomic(run_dir / f"{name}.json", json.dumps(info, indent=1).encode(),
                            sync=False)


def remove_registry(run_dir: Path, name: str, pid: int | None = None) -> None:
    """Remove ``name``'s registry entry; with ``pid``, only if it is that process's (a
    mount process that handed over leaves its successor's entry)."""
    path = run_dir / f"{name}.json"
    if not run_dir.is_dir():
        return
    with _registry_lock(run_dir, name):
        if pid is not None:
            try:
                if json.loads(path.read_bytes()).get("pid") != pid:
                    return
            except (OSError, ValueError, AttributeError):
                pass
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def running(pid: int) -> bool:
    """``pid`` exists and is not a zombie.

    A mount process killed outright stays a zombie until its parent reaps it
    (forever under a container init that never does): it answers nothing and
    will not exit again, so it is not a running mount.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's: alive
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True  # no /proc to ask: kill(0) said it exists
    # comm (field 2) may hold spaces and parentheses: the state follows the last ')'.
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def registered(run_dir: Path) -> list[dict[str, Any]]:
    """Registry entries of mounts whose process is alive (zombies are not)."""
    out = []
    for p in sorted(run_dir.glob("*.json")) if run_dir.is_dir() else []:
        try:
            info = json.loads(p.read_bytes())
            if not running(int(info["pid"])):
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue
        out.append(info)
    return out


# Connecting to a socket path a handover is moving (the predecessor gone, the successor's
# socket not bound yet) fails with one of these; nothing was sent, so trying again is safe.
_NOT_YET_BOUND = (errno.ENOENT, errno.ECONNREFUSED)


def alive_mark(sock: Path) -> Path:
    """Beside casfsd's sockets: made when one binds them, touched while it runs and as it
    exits for a restart, removed with the socket by a stop. A socket that refuses beside
    a fresh mark is a casfsd restarting (on its own, or by systemd after a crash): jobs
    wait for it (casfs.node.client)."""
    return sock.with_name(sock.name + ".alive")


ALIVE_TOUCH = 30.0  # seconds between a running casfsd's touches of its marks


# A listener whose backlog is full answers a connect EAGAIN at once (a timeout makes the
# socket non-blocking, and a Unix socket does not wait then): a review's connect flood by
# one tenant made other tenants' `casfs env` fail ("nobody serves"). Tried again, with
# jitter, for at least this long.
BUSY_WAIT = 5.0


def _connect(sock_path: str | Path, timeout: float, wait: float) -> socket.socket:
    start = time.monotonic()
    # (never past the caller's own bound: a lease's timeout is the whole of its wait)
    deadline, busy_deadline = start + wait, start + min(max(wait, BUSY_WAIT), timeout)
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            with unixpath.reachable(sock_path) as where:
                s.connect(where)
            return s
        except OSError as e:
            s.close()
            now = time.monotonic()
            if e.errno == errno.EAGAIN and now < busy_deadline:
                time.sleep(random.uniform(0.002, 0.02))
                continue
            if e.errno not in _NOT_YET_BOUND or now >= deadline:
                raise
        time.sleep(0.05)


def request(sock_path: str | Path, cmd: str, timeout: float = 60.0, connect_wait: float = 0.0,
            **kw: Any) -> dict[str, Any]:
    """Send one request to a mount's control socket; DaemonUnavailableError if nobody answers.
    ``connect_wait``: seconds to keep trying while the path names no listening socket (a
    process replacing the mount process binds it a moment after its predecessor left)."""
    try:
        s = _connect(sock_path, timeout, connect_wait)
    except TimeoutError:
        raise DaemonStuckError(f"no answer on {sock_path} within {timeout:.3g}s") from None
    except OSError as e:
        raise DaemonUnavailableError(f"no answer on {sock_path}: {e.strerror or e}") from None
    try:
        s.sendall(json.dumps({"cmd": cmd, **kw}).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    except TimeoutError:
        raise DaemonStuckError(f"no answer on {sock_path} within {timeout:.3g}s") from None
    except OSError as e:
        raise DaemonUnavailableError(f"no answer on {sock_path}: {e.strerror or e}") from None
    finally:
        s.close()
    try:
        reply = json.loads(buf)
    except ValueError:
        raise DaemonUnavailableError(f"garbled answer on {sock_path}") from None
    if not isinstance(reply, dict):
        raise DaemonUnavailableError(f"garbled answer on {sock_path}")
    return reply
