"""An S3 endpoint whose bodies are longer than they say: read no further than declared.

A review (stop 55) had a hostile server answer a 100-byte record with
``Content-Length: 100`` and ``Transfer-Encoding: chunked`` (hyper lets the
chunked body win; obstore's size is the Content-Length) and 768 MiB behind it,
and a pack range with a correct ``Content-Range`` and a 768 MiB body: the old
reads gathered it all (the node's host process at 1.5 GB, fetch workers at 9 GB).
What the server declared, or what was asked for, is all that is read now.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs.store.s3backend import S3Backend
from casfs.util.location import S3Location
from tests.store.fakes3 import aim_at

OFFERED = 256 << 20
KEY = "objects/ab/" + "c" * 62
HEAD = b"Last-Modified: Mon, 01 Jan 2024 00:00:00 GMT\r\nETag: \"e\"\r\n"


class _Liar:
    """One answer a connection: ``mode`` "chunked" (a 100-byte Content-Length, chunked
    body of OFFERED bytes) or "range" (a 206 for the range asked, OFFERED bytes long)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.mode = "chunked"
        self.sent = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        with c, c.makefile("rb") as f:
            head = [f.readline()]
            while head[-1] not in (b"\r\n", b""):
                head.append(f.readline())
            rng = next((h.split(b"=", 1)[1].strip() for h in head
                        if h.lower().startswith(b"range:")), b"0-99")
            chunk = b"y" * (1 << 20)
            try:
                if self.mode == "chunked":
                    c.sendall(b"HTTP/1.1 200 OK\r\n" + HEAD + b"Content-Length: 100\r\n"
                              b"Transfer-Encoding: chunked\r\n\r\n")
                    frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
                    for _ in range(OFFERED // len(chunk)):
                        c.sendall(frame)
                        self.sent += len(chunk)
                    c.sendall(b"0\r\n\r\n")
                else:
                    a, b = (int(x) for x in rng.split(b"-"))
                    c.sendall(b"HTTP/1.1 206 Partial Content\r\n" + HEAD
                              + b"Content-Range: bytes %d-%d/%d\r\n" % (a, b, 1 << 40)
                              + b"Content-Length: %d\r\n\r\n" % OFFERED)
                    for _ in range(OFFERED // len(chunk)):
                        c.sendall(chunk)
                        self.sent += len(chunk)
            except OSError:
                pass  # the reader hung up: what it should do


@pytest.fixture
def liar(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Liar]:
    srv = _Liar()
    aim_at(monkeypatch, srv.port)
    try:
        yield srv
    finally:
        srv.sock.close()


def _backend(tmp_path: Path) -> S3Backend:
    return S3Backend(S3Location("b"), timeout=10, retries=0, staging_dir=tmp_path / "staging")


def test_a_small_object_whose_chunked_body_goes_on_is_refused_unread(
        liar: _Liar, tmp_path: Path) -> None:
    with pytest.raises(OSError, match="sent more than the 100 bytes it declared"):
        _backend(tmp_path).open(KEY).read()
    # the old read gathered all 256 MiB; now the connection is dropped past the 100
    # bytes (what the kernel's socket buffers took before that is all that was sent)
    assert liar.sent < OFFERED // 4, liar.sent


def test_a_range_whose_body_is_longer_than_asked_is_refused_unread(
        liar: _Liar, tmp_path: Path) -> None:
    liar.mode = "range"
    with pytest.raises(OSError, match="sent more than the 1000 bytes it declared"):
        _backend(tmp_path).read_range(KEY, 16, 1000)
    assert liar.sent < OFFERED // 4, liar.sent
