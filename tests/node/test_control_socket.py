"""The control socket runs in the mount's nursery: anything it raises ends the FUSE loop."""

from __future__ import annotations

import json
import os
import resource
import socket
from pathlib import Path
from typing import Any

import pytest
import trio

from casfs.node.control import serve_control


# (A fetch worker's watchdog left by an earlier test in this process may want a spare
# while the fds are gone: said in one line.)
@pytest.mark.expect_log(r"control socket: cannot accept a client: .*Too many open files",
                        r"cannot start the .*: .*Too many open files")
def test_running_out_of_fds_refuses_a_client_but_keeps_serving(tmp_path: Path) -> None:
    """An accept that meets EMFILE (a mount process out of fds) once ended the whole
    mount: now that client waits in the backlog and is served once fds are free."""
    sock_path = tmp_path / "control.sock"

    async def handler(req: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "echo": req.get("cmd")}

    def ask(client: socket.socket) -> dict[str, Any]:
        client.sendall(b'{"cmd": "status"}\n')
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = client.recv(4096)
            if not chunk:
                break
            buf += chunk
        reply: dict[str, Any] = json.loads(buf)
        return reply

    async def main() -> dict[str, Any]:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_control, sock_path, handler)
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.settimeout(30)
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            hog: list[int] = []
            resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8,
                                                        hard))
            try:
                while True:  # every fd taken: the server's accept gets EMFILE
                    try:
                        hog.append(os.open(os.devnull, os.O_RDONLY))
                    except OSError:
                        break
                client.connect(str(sock_path))  # queued in the listen backlog
                await trio.sleep(0.5)  # the server tries to accept meanwhile
            finally:
                for fd in hog:
                    os.close(fd)
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            with client:
                reply = await trio.to_thread.run_sync(ask, client)
            nursery.cancel_scope.cancel()
        return reply

    assert trio.run(main) == {"ok": True, "echo": "status"}


def test_a_request_waits_for_a_socket_bound_a_moment_later(tmp_path: Path) -> None:
    """A mount process being replaced leaves its socket path empty (or naming a closed
    socket) for a moment: with ``connect_wait`` the request connects once the successor
    listens; without it, it fails at once as before (casfsd forwards leases this way)."""
    import threading
    import time

    from casfs.errors import DaemonUnavailableError
    from casfs.node.control import request

    sock_path = tmp_path / "host.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock_path))
    stale.close()  # a predecessor's path: ECONNREFUSED
    with pytest.raises(DaemonUnavailableError):
        request(sock_path, "status", timeout=5)

    async def handler(req: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "echo": req.get("cmd")}

    def successor() -> None:
        time.sleep(0.4)

        async def main() -> None:
            with trio.move_on_after(10):
                async with trio.open_nursery() as nursery:
                    await nursery.start(serve_control, sock_path, handler)
                    await trio.sleep(1)
        trio.run(main)

    t = threading.Thread(target=successor)
    t.start()
    t0 = time.monotonic()
    reply = request(sock_path, "status", timeout=5, connect_wait=10)
    assert reply == {"ok": True, "echo": "status"}
    assert time.monotonic() - t0 >= 0.3  # it did wait for the successor
    t.join()
