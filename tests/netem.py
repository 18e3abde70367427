"""An emulated network between casfs and its S3 server: a TCP proxy on 127.0.0.1.

The kernel here has no ``sch_netem`` (no ``tc netem``), so tests and benchmarks
put this proxy between a client and SeaweedFS's S3 port instead::

    with NetProxy(srv.port, delay=0.010) as net:      # 10 ms each way: 20 ms RTT
        url = f"s3://bucket/prefix?endpoint={net.endpoint}"
        ...
        net.counts()   # {"get": .., "range_get": .., "head": .., "list": .., "put": .., ...}

What it emulates, per direction (client -> server "up", server -> client "down"):

- **Delay**: a delay line, not a sleep per read. Each chunk read from one side is
  stamped with the time it may leave the other side (arrival + ``delay``, after
  the bandwidth cap below) and queued; a writer task sends it at that time. So a
  large body streams at full speed, only shifted by ``delay``, and many requests
  are in flight at once as on a real link. A new connection pays
  ``handshake_rtts`` round trips before its first request reaches the server
  (1 = TCP; 2 would be TCP + TLS 1.3), as connecting to a real endpoint does.
- **Bandwidth** (``bandwidth`` bytes/s, None = unlimited): one FIFO link per
  direction shared by all connections; a chunk leaves once the link has sent
  everything queued ahead of it.
- **Stall** (``stall(seconds)``): nothing is delivered either way until then;
  what arrives meanwhile is delivered afterwards, nothing is lost.
- **Reset mid-body** (``reset_next(n, after)`` or ``reset_share``): a response
  is cut after ``after`` bytes of its body and the client's connection is reset
  (RST), the upstream connection closed.
- **Refused creates accepted** (``accept_refused_creates``): a create-only PUT the
  server refused (412: the key exists) is answered 200, as a gateway that does not
  pass ``If-None-Match`` on (or a server that ignores it) would have the client
  believe; what the server holds is unchanged.
- **503 SlowDown** (``slowdown_share``): that share of requests is answered by
  the proxy with S3's 503 SlowDown error (an XML body) after one round trip,
  without reaching the server (the request's body is read and dropped; with
  ``Expect: 100-continue`` the proxy answers at once and closes the connection).

It parses just enough HTTP/1.1 to find where each request and response ends
(Content-Length, chunked framing, HEAD/1xx/204/304 without a body, until-close),
so keep-alive and chunked messages pass through byte for byte. Requests are
counted by kind: ``get``, ``range_get`` (a GET with ``Range``), ``head``,
``list`` (a GET on a bucket: ``list-type``/``prefix``/``delimiter`` in the query,
or no key in the path), ``put``, ``delete``, ``post``, ``other``; and bytes each
way as the client sees them. With ``record=True`` every request's kind, start
(its head reached the proxy) and end (the last byte of its response was handed
to the client) are kept (``requests()``), so a benchmark can see how many were
in flight at once and how many round trips ran back to back.

Requests on one connection are assumed not pipelined (no S3 client pipelines);
an injected 503 is queued behind nothing. The proxy runs its own asyncio loop in
a daemon thread; every method here may be called from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

CHUNK = 64 << 10
QUEUE_CHUNKS = 64  # per direction and connection: how far a reader runs ahead of its writer
KINDS = ("get", "range_get", "head", "list", "put", "delete", "post", "other")
_EOF = object()
_RESET = object()
_CLOSE = object()

SLOWDOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                 b"<Message>Please reduce your request rate.</Message>"
                 b"<RequestId>netem</RequestId><HostId>netem</HostId></Error>")


def slowdown_response(close: bool = False) -> bytes:
    head = (b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
            b"Content-Length: %d\r\nRetry-After: 1\r\n" % len(SLOWDOWN_BODY))
    if close:
        head += b"Connection: close\r\n"
    return head + b"\r\n" + SLOWDOWN_BODY


def request_kind(method: str, target: str, headers: dict[str, str]) -> str:
    """The kind of an S3 request (path-style or virtual-host-style)."""
    m = method.upper()
    if m == "GET":
        parts = urlsplit(target)
        query = parts.query
        q = {kv.split("=", 1)[0] for kv in query.split("&") if kv}
        path = parts.path.strip("/")
        if q & {"list-type", "prefix", "delimiter", "continuation-token", "marker"} \
                or "/" not in path:
            return "list"
        return "range_get" if "range" in headers else "get"
    k = m.lower()
    return k if k in KINDS else "other"


@dataclass
class Request:
    kind: str
    method: str
    target: str
    start: float  # time.monotonic() when its head reached the proxy
    end: float | None = None  # when the last byte of its response was handed to the client
    status: int | None = None
    injected: bool = False  # answered by the proxy (503 SlowDown)
    down_bytes: int = 0  # response bytes
    conn: int = 0  # the connection it came on (numbered from 1 as accepted)
    fresh: bool = False  # the first request on its connection (it paid the handshake)


@dataclass
class _Head:
    raw: bytes
    first: str
    headers: dict[str, str]
    final: bool = True  # a response that is not 1xx
    body: bool = False  # a body follows


class _Framer:
    """Splits one direction's byte stream into HTTP/1.1 messages.

    ``feed`` returns events: ("head", _Head), ("body", memoryview), ("end", None),
    ("raw", memoryview) after an upgrade. The bytes of all events, concatenated,
    are the bytes fed: nothing is rewritten.
    """

    def __init__(self, requests: bool, methods: deque[str]) -> None:
        self.requests = requests
        self.methods = methods  # response side: methods of the requests sent, oldest first
        self.state = "head"
        self.buf = bytearray()
        self.left = 0

    def feed(self, data: bytes) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        mv = memoryview(data)
        while mv:
            st = self.state
            if st == "raw" or st == "close":
                out.append(("raw" if st == "raw" else "body", mv))
                break
            if st == "head":
                self.buf += mv
                i = self.buf.find(b"\r\n\r\n")
                if i < 0:
                    if len(self.buf) > 1 << 20:
                        raise ValueError("HTTP head over 1 MiB")
                    break
                n_new = len(mv) - (len(self.buf) - (i + 4))
                raw = bytes(self.buf[:i + 4])
                self.buf.clear()
                mv = mv[n_new:]
                out.extend(self._head(raw))
                continue
            if st in ("body", "chunk_data"):
                n = min(self.left, len(mv))
                out.append(("body", mv[:n]))
                mv = mv[n:]
                self.left -= n
                if self.left == 0:
                    if st == "body":
                        self.state = "head"
                        out.append(("end", None))
                    else:
                        self.state = "chunk_size"
                continue
            # chunk_size or trailers: line-oriented
            self.buf += mv
            i = self.buf.find(b"\r\n")
            if i < 0:
                if len(self.buf) > 64 << 10:
                    raise ValueError("chunk line over 64 KiB")
                out.append(("body", mv))  # all of it belongs to this line
                break
            n_new = len(mv) - (len(self.buf) - (i + 2))
            line = bytes(self.buf[:i])
            self.buf.clear()
            out.append(("body", mv[:n_new]))
            mv = mv[n_new:]
            if st == "chunk_size":
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    self.state = "trailers"
                else:
                    self.state, self.left = "chunk_data", size + 2  # data + CRLF
            elif line == b"":  # trailers: the empty line ends the message
                self.state = "head"
                out.append(("end", None))
        return out

    def _head(self, raw: bytes) -> list[tuple[str, Any]]:
        text = raw.decode("latin-1").lstrip("\r\n")
        lines = text.split("\r\n")
        headers: dict[str, str] = {}
        for ln in lines[1:]:
            if ":" in ln:
                k, v = ln.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        head = _Head(raw, lines[0], headers)
        out = self._frame(head, lines[0], headers)
        head.body = self.state != "head"
        return [("head", head), *out]

    def _frame(self, head: _Head, first: str, headers: dict[str, str]
               ) -> list[tuple[str, Any]]:
        te = headers.get("transfer-encoding", "").lower()
        length = int(headers.get("content-length", "0") or 0)
        if self.requests:
            if first.split(" ", 1)[0].upper() == "CONNECT":
                self.state = "raw"
                return []
            if "chunked" in te:
                self.state = "chunk_size"
                return []
            return self._body(length)
        status = int(first.split(" ", 2)[1])
        head.final = status >= 200
        if status == 101:
            self.state = "raw"
            return []
        if not head.final:  # 100 Continue and friends: the final response follows
            return []
        method = self.methods.popleft() if self.methods else "GET"
        if method == "HEAD" or status in (204, 304):
            return [("end", None)]
        if "chunked" in te:
            self.state = "chunk_size"
            return []
        if "content-length" in headers:
            return self._body(length)
        self.state = "close"  # until the server closes
        return []

    def _body(self, length: int) -> list[tuple[str, Any]]:
        if length <= 0:
            return [("end", None)]
        self.state, self.left = "body", length
        return []


class _Conn:
    def __init__(self, proxy: NetProxy, cr: asyncio.StreamReader, cw: asyncio.StreamWriter,
                 accepted: float) -> None:
        self.p = proxy
        self.cr, self.cw = cr, cw
        self.ur: asyncio.StreamReader | None = None
        self.uw: asyncio.StreamWriter | None = None
        self.methods: deque[str] = deque()
        self.pending: deque[Request] = deque()  # requests sent upstream, awaiting responses
        self.reqf = _Framer(True, self.methods)
        self.resf = _Framer(False, self.methods)
        self.upq: asyncio.Queue[tuple[float, Any]] = asyncio.Queue(QUEUE_CHUNKS)
        self.downq: asyncio.Queue[tuple[float, Any]] = asyncio.Queue(QUEUE_CHUNKS)
        self.floor_up = accepted + proxy.handshake_rtts * 2 * proxy.delay
        self.last_due = [0.0, 0.0]
        self.dropping: Request | None = None  # the request being answered with a 503
        self.close_after_drop = False
        self.cutting: tuple[int, int] | None = None  # (body bytes sent, reset after)
        self.current: Request | None = None  # the response being relayed is for this one
        self.serial = 0
        self.served = 0  # requests seen on it


class NetProxy:
    """A TCP proxy on 127.0.0.1 that emulates a network in front of ``upstream``."""

    def __init__(self, upstream: int | str | tuple[str, int], *, delay: float = 0.010,
                 bandwidth: float | None = None, handshake_rtts: float = 1.0,
                 slowdown_share: float = 0.0, reset_share: float = 0.0,
                 reset_after: int = 1024, seed: int = 0, record: bool = False,
                 port: int = 0, accept_refused_creates: bool = False) -> None:
        if isinstance(upstream, int):
            self.upstream = ("127.0.0.1", upstream)
        elif isinstance(upstream, str):
            u = urlsplit(upstream if "//" in upstream else f"//{upstream}")
            self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        else:
            self.upstream = upstream
        self.delay = delay  # one way, seconds
        self.bandwidth = bandwidth  # bytes/s each way, None: unlimited
        self.handshake_rtts = handshake_rtts
        self.slowdown_share = slowdown_share
        self.reset_share = reset_share
        self.reset_after = reset_after
        self.record = record
        self.accept_refused_creates = accept_refused_creates
        self.rng = random.Random(seed)
        self.port = port
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._accepted = 0  # connections ever accepted (Request.conn)
        self._requests: list[Request] = []
        self.reset_counts()
        self._reset_armed = 0
        self._slowdown_armed = 0
        self._stall_until = 0.0
        self._link_free = [0.0, 0.0]  # up, down: when the shared link is free again
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # --- control (any thread) ----------------------------------------------
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def requests(self) -> list[Request]:
        """Every request since the last ``reset_counts`` (``record=True`` only)."""
        with self._lock:
            return list(self._requests)

    def reset_counts(self) -> dict[str, int]:
        """Zero the counts (and the request log); returns what they were."""
        with self._lock:
            old = dict(self._counts)
            self._counts = dict.fromkeys(
                (*KINDS, "requests", "responses", "bytes_up", "bytes_down", "connections",
                 "slowdown_503", "resets", "upstream_5xx", "creates_faked"), 0)
            self._requests = []
            return old

    def stall(self, seconds: float) -> None:
        """Deliver nothing either way for ``seconds`` from now (queued bytes follow)."""
        self._stall_until = max(self._stall_until, time.monotonic() + seconds)

    def reset_next(self, n: int = 1, after: int | None = None) -> None:
        """Cut the next ``n`` responses that have a body after ``after`` body bytes."""
        if after is not None:
            self.reset_after = after
        self._reset_armed += n

    def slowdown_next(self, n: int = 1) -> None:
        """Answer the next ``n`` requests with 503 SlowDown."""
        self._slowdown_armed += n

    # --- lifecycle -------------------------------------------------------------
    def start(self) -> NetProxy:
        ready = threading.Event()
        err: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(asyncio.start_server(
                    self._handle, "127.0.0.1", self.port, limit=CHUNK * 2))
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as e:  # handed to start()
                err.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=main, name=f"netproxy-{self.upstream[1]}",
                                        daemon=True)
        self._thread.start()
        ready.wait()
        if err:
            raise err[0]
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> NetProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the emulation ---------------------------------------------------------
    def _add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def _due(self, conn: _Conn, direction: int, now: float, nbytes: int,
             floor: float = 0.0) -> float:
        t = max(now, floor)
        bw = self.bandwidth
        if bw:
            t = max(t, self._link_free[direction]) + nbytes / bw
            self._link_free[direction] = t
        due = max(t + self.delay, conn.last_due[direction])
        conn.last_due[direction] = due
        return due

    async def _wait_until(self, due: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            left = max(due, self._stall_until) - loop.time()
            if left <= 0:
                return
            await asyncio.sleep(left)

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        loop = asyncio.get_running_loop()
        conn = _Conn(self, cr, cw, loop.time())
        with self._lock:
            self._counts["connections"] += 1
            self._accepted += 1
            conn.serial = self._accepted
        workers: list[asyncio.Task[None]] = []
        try:
            try:
                conn.ur, conn.uw = await asyncio.open_connection(*self.upstream, limit=CHUNK * 2)
            except OSError:
                return
            workers = [asyncio.create_task(c) for c in (
                self._pump_requests(conn), self._deliver(conn.upq, conn.uw, conn, up=True),
                self._pump_responses(conn), self._deliver(conn.downq, cw, conn, up=False))]
            # the connection is over when the client side is done (closed, reset or
            # answered and closed) or when a side fails (then both are reset)
            pending: set[asyncio.Task[None]] = set(workers)
            while not workers[3].done():
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(not t.cancelled() and t.exception() is not None for t in done):
                    for wr in (cw, conn.uw):
                        if wr is not None:
                            _rst(wr)
                    break
        except (asyncio.CancelledError, Exception):
            pass
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            for wr in (cw, conn.uw):
                if wr is not None:
                    with contextlib.suppress(Exception):
                        wr.close()
            self._tasks.discard(task)

    async def _pump_requests(self, conn: _Conn) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await conn.cr.read(CHUNK)
                now = loop.time()
                if not data:
                    await conn.upq.put((self._due(conn, 0, now, 0, conn.floor_up), _EOF))
                    return
                self._add("bytes_up", len(data))
                out = bytearray()
                for ev, val in conn.reqf.feed(data):
                    if ev == "head":
                        self._request_head(conn, val, out, now)
                        if conn.dropping is not None and conn.close_after_drop:
                            await self._answer_503(conn, now)  # the body never comes
                            return
                    elif ev in ("body", "raw"):
                        if conn.dropping is None:
                            out += val
                    elif ev == "end" and conn.dropping is not None:
                        await self._answer_503(conn, now)
                        if conn.close_after_drop:
                            return
                if out:
                    due = self._due(conn, 0, now, len(out), conn.floor_up)
                    await conn.upq.put((due, bytes(out)))
        except (ConnectionError, ValueError):
            await conn.downq.put((0.0, _RESET))
            raise

    def _request_head(self, conn: _Conn, head: _Head, out: bytearray, now: float) -> None:
        parts = head.first.split(" ")
        method = parts[0].upper()
        target = parts[1] if len(parts) > 1 else "/"
        kind = request_kind(method, target, head.headers)
        req = Request(kind, method, target, time.monotonic(), conn=conn.serial,
                      fresh=conn.served == 0)
        conn.served += 1
        with self._lock:
            self._counts[kind] += 1
            self._counts["requests"] += 1
            if self.record:
                self._requests.append(req)
        if self._slowdown_armed > 0 or (
                self.slowdown_share and self.rng.random() < self.slowdown_share):
            if self._slowdown_armed > 0:
                self._slowdown_armed -= 1
            req.injected = True
            conn.dropping = req
            # with Expect: 100-continue the client waits for us before sending the body
            conn.close_after_drop = "100-continue" in head.headers.get("expect", "").lower()
            return
        conn.methods.append(method)
        conn.pending.append(req)
        out += head.raw

    async def _answer_503(self, conn: _Conn, now: float) -> None:
        req = conn.dropping
        assert req is not None
        conn.dropping = None
        resp = slowdown_response(close=conn.close_after_drop)
        due = self._due(conn, 1, now + self.delay, len(resp))  # there and back
        req.status, req.end, req.down_bytes = 503, due, len(resp)
        self._add("slowdown_503")
        self._add("responses")
        self._add("bytes_down", len(resp))
        await conn.downq.put((due, resp))
        if conn.close_after_drop:
            await conn.downq.put((due, _CLOSE))

    async def _pump_responses(self, conn: _Conn) -> None:
        loop = asyncio.get_running_loop()
        assert conn.ur is not None
        try:
            while True:
                data = await conn.ur.read(CHUNK)
                now = loop.time()
                if not data:
                    await conn.downq.put((self._due(conn, 1, now, 0), _EOF))
                    return
                out = bytearray()
                cut = False
                done: list[Request] = []
                for ev, val in conn.resf.feed(data):
                    if ev == "head":
                        out += self._response_raw(conn, val)
                        self._response_head(conn, val)
                    elif ev == "raw":
                        out += val
                    elif ev == "body":
                        if conn.current is not None:
                            conn.current.down_bytes += len(val)
                        if conn.cutting is not None:
                            sent, after = conn.cutting
                            if sent + len(val) >= after:
                                out += val[:after - sent]
                                cut = True
                                break
                            conn.cutting = (sent + len(val), after)
                        out += val
                    elif ev == "end":
                        conn.cutting = None
                        if conn.current is not None:
                            done.append(conn.current)
                            conn.current = None
                due = self._due(conn, 1, now, len(out))
                if done:
                    for r in done:
                        r.end = due  # loop time is time.monotonic()
                    self._add("responses", len(done))
                if out:
                    self._add("bytes_down", len(out))
                    await conn.downq.put((due, bytes(out)))
                if cut:
                    self._add("resets")
                    await conn.downq.put((due, _RESET))
                    return
        except (ConnectionError, ValueError):
            await conn.downq.put((0.0, _RESET))
            raise

    def _response_raw(self, conn: _Conn, head: _Head) -> bytes:
        """The response head as passed on: a refused create-only PUT (412) made a 200,
        with an ETag, where ``accept_refused_creates``."""
        if not (self.accept_refused_creates and head.final and conn.pending
                and conn.pending[0].method == "PUT" and head.first.split(" ", 2)[1] == "412"):
            return head.raw
        self._add("creates_faked")
        rest = head.raw.split(b"\r\n", 1)[1]
        return b'HTTP/1.1 200 OK\r\nETag: "netem-faked"\r\n' + rest

    def _response_head(self, conn: _Conn, head: _Head) -> None:
        if not head.final:
            return
        req = conn.pending.popleft() if conn.pending else None
        status = int(head.first.split(" ", 2)[1])
        if status >= 500:
            self._add("upstream_5xx")
        if req is not None:
            req.status = status
        conn.current = req
        if head.body and (self._reset_armed > 0 or (
                self.reset_share and self.rng.random() < self.reset_share)):
            if self._reset_armed > 0:
                self._reset_armed -= 1
            conn.cutting = (0, self.reset_after)

    async def _deliver(self, q: asyncio.Queue[tuple[float, Any]], w: asyncio.StreamWriter,
                       conn: _Conn, up: bool) -> None:
        while True:
            due, item = await q.get()
            if item is not _RESET:
                await self._wait_until(due)
            if item is _EOF:
                with contextlib.suppress(OSError, RuntimeError):
                    if w.can_write_eof():
                        w.write_eof()
                if not up:
                    return
                continue
            if item is _CLOSE:
                with contextlib.suppress(Exception):
                    await w.drain()
                return
            if item is _RESET:
                with contextlib.suppress(Exception):
                    await w.drain()
                _rst(w)
                if conn.uw is not None and w is not conn.uw:
                    _rst(conn.uw)
                return
            w.write(item)
            await w.drain()


def _rst(w: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0) rather than a FIN."""
    sock = w.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    w.transport.abort()
