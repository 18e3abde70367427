"""tests/netem.py: the emulated network's delay, bandwidth cap, stall, resets, 503s and counts.

Timing checks here are loose bounds on what the proxy itself adds (a delay line
that keeps its schedule, a cap that holds), not speed goals: those live in bench/.
"""

from __future__ import annotations

import http.client
import statistics
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from netem import NetProxy, request_kind


def _pattern(n: int) -> bytes:
    return (bytes(range(251)) * (n // 251 + 1))[:n]


class _Handler(BaseHTTPRequestHandler):
    """``/bytes/N``: N bytes (Content-Length); ``/chunked/N``: N bytes in chunks of 1,000
    with a trailer; PUT/POST: read the body (either framing), answer its length."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes

    def log_message(self, *a: Any) -> None:
        pass

    def _payload(self) -> bytes:
        return _pattern(int(self.path.rsplit("/", 1)[1].split("?")[0]))

    def do_GET(self) -> None:
        data = self._payload()
        self.send_response(200)
        if self.path.startswith("/chunked/"):
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Trailer", "X-Sum")
            self.end_headers()
            for i in range(0, len(data), 1000):
                part = data[i:i + 1000]
                self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\nX-Sum: %d\r\n\r\n" % sum(data))
        else:
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self._payload())))
        self.end_headers()

    def do_PUT(self) -> None:
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        out = str(len(body)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_POST = do_PUT


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client (the proxy) that reset mid-body: expected here, not a traceback


@pytest.fixture(scope="module")
def http_port() -> Iterator[int]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def _get(c: http.client.HTTPConnection, path: str, method: str = "GET",
         **kw: Any) -> tuple[int, bytes]:
    c.request(method, path, **kw)
    r = c.getresponse()
    return r.status, r.read()


def test_rtt_is_twice_the_delay_and_a_new_connection_pays_a_handshake(http_port: int) -> None:
    delay = 0.025
    with NetProxy(http_port, delay=delay) as net:
        c = http.client.HTTPConnection("127.0.0.1", net.port)
        t0 = time.monotonic()
        assert _get(c, "/bytes/10") == (200, bytes(range(10)))
        first = time.monotonic() - t0
        rtts = []
        for _ in range(10):
            t0 = time.monotonic()
            status, body = _get(c, "/bytes/100")
            rtts.append(time.monotonic() - t0)
            assert status == 200 and len(body) == 100
        c.close()
        assert net.counts()["connections"] == 1
    med = statistics.median(rtts)
    assert 2 * delay <= med < 2 * delay + 0.015, rtts
    assert 4 * delay <= first < 4 * delay + 0.03, first  # TCP handshake + request


def test_zero_delay_adds_little(http_port: int) -> None:
    with NetProxy(http_port, delay=0.0) as net:
        c = http.client.HTTPConnection("127.0.0.1", net.port)
        _get(c, "/bytes/10")
        rtts = []
        for _ in range(20):
            t0 = time.monotonic()
            _get(c, "/bytes/10")
            rtts.append(time.monotonic() - t0)
        c.close()
    assert statistics.median(rtts) < 0.01, rtts


def test_large_body_streams_at_full_speed_behind_the_delay(http_port: int) -> None:
    """A delay line, not a sleep per chunk: 8 MiB in 128 chunks costs ~1 RTT, not 128."""
    delay = 0.02
    with NetProxy(http_port, delay=delay) as net:
        c = http.client.HTTPConnection("127.0.0.1", net.port)
        _get(c, "/bytes/10")
        t0 = time.monotonic()
        status, body = _get(c, f"/bytes/{8 << 20}")
        took = time.monotonic() - t0
        c.close()
    assert status == 200 and len(body) == 8 << 20
    assert took < 2 * delay + 1.0, took  # 128 chunks x 20 ms would be 2.6 s


def test_bandwidth_cap_holds(http_port: int) -> None:
    bw = 4 << 20  # bytes/s
    size = 3 << 20
    with NetProxy(http_port, delay=0.0, bandwidth=bw) as net:
        c = http.client.HTTPConnection("127.0.0.1", net.port)
        _get(c, "/bytes/10")
        t0 = time.monotonic()
        _, body = _get(c, f"/bytes/{size}")
        took = time.monotonic() - t0
        c.close()
    assert len(body) == size
    rate = size / took
    assert 0.8 * bw <= rate <= 1.2 * bw, (rate, bw)


def test_stall_holds_traffic_then_delivers_it(http_port: int) -> None:
    with NetProxy(http_port, delay=0.0) as net:
        c = http.client.HTTPConnection("127.0.0.1", net.port)
        _get(c, "/bytes/10")
        net.stall(0.6)
        t0 = time.monotonic()
        assert _get(c, "/bytes/5000")[1] == _pattern(5000)
        took = time.monotonic() - t0
        c.close()
    assert 0.55 <= took < 1.5, took


def test_slowdown_share_over_200_requests(http_port: int) -> None:
    share = 0.2
    with NetProxy(http_port, delay=0.0, slowdown_share=share, seed=3) as net:
        c = http.client.HTTPConnection("127.0.0.1", net.port)
        statuses = []
        for i in range(200):
            if i % 4 == 0:  # a body the proxy must read and drop on a 503
                status, body = _get(c, "/put", "PUT", body=b"x" * 3000)
                assert status == 503 or body == b"3000"
            else:
                status, body = _get(c, "/bytes/300")
                assert status == 503 or len(body) == 300
            if status == 503:
                assert b"<Code>SlowDown</Code>" in body
            statuses.append(status)
        c.close()
        counts = net.counts()
    n503 = statuses.count(503)
    # binomial(200, 0.2): sd 5.7; 4 sd either way
    assert 40 - 23 <= n503 <= 40 + 23, n503
    assert counts["slowdown_503"] == n503
    assert counts["requests"] == 200 and counts["responses"] == 200
    assert counts["connections"] == 1  # the connection stayed up through the 503s


def test_slowdown_with_expect_100_continue_closes(http_port: int) -> None:
    import socket

    with NetProxy(http_port, delay=0.0, slowdown_share=1.0) as net:
        s = socket.create_connection(("127.0.0.1", net.port))
        s.sendall(b"PUT /k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                  b"Expect: 100-continue\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        s.close()
    assert data.startswith(b"HTTP/1.1 503") and b"Connection: close" in data


def test_reset_mid_body_is_a_connection_error(http_port: int) -> None:
    with NetProxy(http_port, delay=0.005) as net:
        c = http.client.HTTPConnection("127.0.0.1", net.port)
        assert len(_get(c, "/bytes/200000")[1]) == 200000
        net.reset_next(1, after=50_000)
        with pytest.raises((ConnectionError, http.client.IncompleteRead)):
            _get(c, "/bytes/200000")
        c.close()
        # the next connection is whole again
        c = http.client.HTTPConnection("127.0.0.1", net.port)
        assert len(_get(c, "/bytes/200000")[1]) == 200000
        c.close()
        counts = net.counts()
    assert counts["resets"] == 1 and counts["connections"] == 2


def test_reset_of_a_chunked_response(http_port: int) -> None:
    with NetProxy(http_port, delay=0.0) as net:
        c = http.client.HTTPConnection("127.0.0.1", net.port)
        net.reset_next(1, after=20_000)
        with pytest.raises((ConnectionError, http.client.IncompleteRead)):
            _get(c, "/chunked/100000")
        c.close()


def test_keepalive_chunked_and_head_pass_through_intact(http_port: int) -> None:
    with NetProxy(http_port, delay=0.002) as net:
        c = http.client.HTTPConnection("127.0.0.1", net.port)
        for n in (1, 999, 1000, 25_000):
            c.request("GET", f"/chunked/{n}")
            r = c.getresponse()
            body = r.read()
            assert body == _pattern(n)
            assert r.getheader("X-Sum") is None or True  # trailers are not surfaced
        c.request("HEAD", "/bytes/12345")
        r = c.getresponse()
        assert r.getheader("Content-Length") == "12345" and r.read() == b""
        # a chunked request body
        c.putrequest("PUT", "/up")
        c.putheader("Transfer-Encoding", "chunked")
        c.endheaders()
        for part in (b"a" * 10, b"b" * 70_000, b"c"):
            c.send(b"%x\r\n%s\r\n" % (len(part), part))
        c.send(b"0\r\n\r\n")
        r = c.getresponse()
        assert r.read() == b"70011"
        assert _get(c, "/bytes/7")[1] == bytes(range(7))
        c.close()
        counts = net.counts()
    assert counts["connections"] == 1
    assert counts["requests"] == counts["responses"] == 7
    assert (counts["get"], counts["head"], counts["put"]) == (5, 1, 1)


def test_request_kinds() -> None:
    assert request_kind("GET", "/b/k/x.bin", {}) == "get"
    assert request_kind("GET", "/b/k/x.bin", {"range": "bytes=0-9"}) == "range_get"
    assert request_kind("GET", "/b?list-type=2&prefix=a%2F", {}) == "list"
    assert request_kind("GET", "/b/", {}) == "list"
    assert request_kind("GET", "/?list-type=2", {}) == "list"  # virtual-host style
    assert request_kind("HEAD", "/b/k", {}) == "head"
    assert request_kind("PUT", "/b/k", {}) == "put"
    assert request_kind("DELETE", "/b/k", {}) == "delete"
    assert request_kind("POST", "/b/k?uploads", {}) == "post"


def test_counts_are_exact_through_seaweedfs(seaweed_server: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A scripted sequence through the proxy to a real S3 server, counted by kind."""
    import obstore
    from obstore.store import S3Store
    from seaweed import ACCESS_KEY, SECRET_KEY

    with NetProxy(seaweed_server.port, delay=0.001, record=True) as net:
        store = S3Store("casfs-test", prefix=f"netem-{time.monotonic_ns()}",
                        endpoint=net.endpoint, region="us-east-1",
                        access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
                        client_options={"allow_http": True},
                        retry_config={"max_retries": 0})
        blobs = {f"k/{i}": bytes([i]) * (1000 + 50_000 * i) for i in range(3)}
        for k, v in blobs.items():
            obstore.put(store, k, v)
        assert bytes(obstore.get(store, "k/2").bytes()) == blobs["k/2"]
        assert bytes(obstore.get(store, "k/1").bytes()) == blobs["k/1"]
        assert bytes(obstore.get_range(store, "k/2", start=10, end=20)) == blobs["k/2"][10:20]
        assert obstore.head(store, "k/0")["size"] == 1000
        assert obstore.head(store, "k/1")["size"] == 51_000
        listed = [m["path"] for page in obstore.list(store, "k/") for m in page]
        assert len(listed) == 3
        obstore.delete(store, "k/0")  # object_store deletes in bulk: POST ?delete
        counts = net.counts()
        reqs = net.requests()
    assert {k: counts[k] for k in ("put", "get", "range_get", "head", "list", "delete",
                                   "post", "other")} == {
        "put": 3, "get": 2, "range_get": 1, "head": 2, "list": 1, "delete": 0,
        "post": 1, "other": 0}
    assert counts["requests"] == counts["responses"] == 10
    assert counts["slowdown_503"] == counts["resets"] == counts["upstream_5xx"] == 0
    assert counts["bytes_up"] > sum(map(len, blobs.values()))
    assert counts["bytes_down"] > len(blobs["k/2"]) + len(blobs["k/1"])
    assert [r.kind for r in reqs] == ["put"] * 3 + ["get", "get", "range_get", "head", "head",
                                                    "list", "post"]
    assert "delete" in reqs[-1].target
    assert all(r.end is not None and r.end >= r.start + 0.002 for r in reqs)
    assert [r.status for r in reqs] == [200] * 5 + [206] + [200] * 4
