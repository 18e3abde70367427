"""An S3 endpoint whose top-level LIST pages never end: refused within a bound.

A review (2026-12-06) saw obstore's delimiter listing follow such a server for good (a
process growing ~55 MB/s, every CLI command and gc hanging). The listings by name of
the layout's top levels (``namespaces``, ``objects``, ``packs``) now page themselves.
A small HTTP server here answers ListObjectsV2 the way a broken gateway or a bucket
stuffed by a hostile writer would; the real server's answers are in
test_backend_conformance.py.
"""

from __future__ import annotations

import http.server
import itertools
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from casfs.store import s3backend
from casfs.store.s3backend import S3Backend
from casfs.util.location import S3Location
from tests.store.fakes3 import aim_at

PAGE = 1000


class _Lister(http.server.BaseHTTPRequestHandler):
    """ListObjectsV2: ``pages`` pages of PAGE common prefixes each (None: for ever), or of
    nothing if ``empty``, the continuation token fresh each page unless ``repeat``."""

    pages: int | None = None
    repeat = False
    empty = False
    served = 0
    counter = itertools.count()

    def log_message(self, *a: Any) -> None:
        pass

    def do_GET(self) -> None:
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        assert q.get("list-type") == ["2"], self.path
        prefix = q.get("prefix", [""])[0]
        cls = type(self)
        cls.served += 1
        n = next(cls.counter)
        more = cls.pages is None or cls.served < cls.pages
        token = "same" if cls.repeat else f"t{n}"
        cps = "" if cls.empty else "".join(
            f"<CommonPrefixes><Prefix>{prefix}ns{n:06d}-{i:04d}/</Prefix></CommonPrefixes>"
            for i in range(PAGE))
        body = ('<?xml version="1.0" encoding="UTF-8"?><ListBucketResult'
                ' xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name>'
                f"<Prefix>{prefix}</Prefix><KeyCount>{0 if cls.empty else PAGE}</KeyCount>"
                f"<MaxKeys>{PAGE}</MaxKeys><Delimiter>/</Delimiter>"
                f"<IsTruncated>{'true' if more else 'false'}</IsTruncated>"
                + (f"<NextContinuationToken>{token}</NextContinuationToken>" if more else "")
                + cps + "</ListBucketResult>").encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def lister(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Lister]]:
    handler = type("Lister", (_Lister,), {"served": 0, "counter": itertools.count()})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    aim_at(monkeypatch, srv.server_address[1])
    try:
        yield handler
    finally:
        srv.shutdown()
        srv.server_close()


def _listed(backend: S3Backend, prefix: str) -> list[str] | BaseException:
    """What ``backend.list(prefix)`` gave, or raised, within 60 s (a thread: the code
    before followed the pages for good)."""
    out: list[list[str] | BaseException] = []

    def go() -> None:
        try:
            out.append(list(backend.list(prefix)))
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(60)
    assert out, f"listing {prefix} still running after 60 s"
    return out[0]


def _backend(tmp_path: Path, prefix: str = "") -> S3Backend:
    return S3Backend(S3Location("b", prefix=prefix), timeout=10, retries=0,
                     staging_dir=tmp_path / "staging")


def test_a_top_level_listing_whose_pages_never_end_is_refused(
        lister: type[_Lister], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3backend, "MAX_LISTED", 20 * PAGE)
    for top in ("namespaces", "objects", "packs"):
        lister.served = 0
        got = _listed(_backend(tmp_path), top)
        assert isinstance(got, OSError) and "more than 20000 names" in str(got), got
        assert lister.served <= 21  # the bound's pages, no more


def test_a_repeated_continuation_token_is_refused_at_once(
        lister: type[_Lister], tmp_path: Path) -> None:
    lister.repeat = True
    got = _listed(_backend(tmp_path), "namespaces")
    assert isinstance(got, OSError) and "repeats its continuation token" in str(got), got
    assert lister.served == 2


def test_a_listing_of_many_pages_that_ends_names_every_entry(
        lister: type[_Lister], tmp_path: Path) -> None:
    lister.pages = 3
    got = _listed(_backend(tmp_path, prefix="team/cache"), "namespaces")
    assert isinstance(got, list), got
    assert len(got) == 3 * PAGE and got == sorted(got)
    assert got[0] == "ns000000-0000" and got[-1] == "ns000002-0999"
    assert lister.served == 3


def test_a_listing_whose_pages_hold_nothing_for_ever_is_refused(
        lister: type[_Lister], tmp_path: Path) -> None:
    """Empty pages, each with a fresh token: obstore's stream hands nothing back until it
    holds a key, so the code before asked for good (~1,300 requests/s here), below the
    top level (a mount process's listings) as at it."""
    lister.empty = True
    backend = _backend(tmp_path)  # timeout 10 s: no key in 20 s is refused
    for prefix in ("namespaces/a/generations", "namespaces"):
        lister.served = 0
        got = _listed(backend, prefix)
        assert isinstance(got, OSError), got
        assert "no key in 20 s" in str(got) or "more than" in str(got), got
        served = lister.served
        time.sleep(1)
        assert lister.served <= served + 2  # and its requests stop
