"""Retries against an S3 root back off with jitter (issue 23: 64 nodes must not retry
in lockstep).

obstore (Rust object_store) jitters every wait after the first one, and waits
exactly ``init_backoff`` the first time; casfs draws ``init_backoff`` per
backend, so two nodes that meet the same 503 retry at different instants. The
second test measures it at the wire: every request answered 503 SlowDown by
tests/netem.py's proxy, the gap between a request and its first retry.
"""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path

import pytest
from netem import NetProxy

from casfs.store import s3backend
from casfs.store.s3backend import INIT_BACKOFF_S, S3Backend, retry_backoff
from casfs.util.location import S3Location, parse_location


def test_first_backoff_is_drawn_per_backend() -> None:
    rng = random.Random(1)
    waits = [retry_backoff(rng)["init_backoff"].total_seconds() for _ in range(64)]
    lo, hi = INIT_BACKOFF_S
    assert all(lo <= w <= hi for w in waits)
    assert len({round(w, 3) for w in waits}) > 32  # spread, not one instant
    assert max(waits) - min(waits) > (hi - lo) / 2


def test_retries_of_two_backends_do_not_line_up(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("CASFS_STATE_DIR", str(tmp_path))
    sink = socket.socket()  # the proxy answers every request itself: nothing reaches this
    sink.bind(("127.0.0.1", 0))
    sink.listen(64)
    try:
        with NetProxy(sink.getsockname()[1], delay=0.0, slowdown_share=1.0,
                      record=True) as net:
            gaps = []
            for _ in range(6):
                net.reset_counts()
                loc = parse_location(f"s3://bkt/p?endpoint={net.endpoint}")
                assert isinstance(loc, S3Location)
                s3backend._CLIENTS.clear()  # each a node's own process: its own client
                b = S3Backend(loc, timeout=10.0, retries=1, staging_dir=tmp_path)
                want = b.retry_config["backoff"]["init_backoff"].total_seconds()
                t0 = time.monotonic()
                with pytest.raises(OSError):
                    b.info("objects/x")
                assert time.monotonic() - t0 < 5
                starts = sorted(r.start for r in net.requests())
                assert len(starts) == 2, starts  # the request and one retry, both 503
                gaps.append(starts[1] - starts[0])
                assert gaps[-1] >= want - 0.005
                b.close()
    finally:
        sink.close()
    assert max(gaps) - min(gaps) > 0.01, gaps  # six backends, six different instants


def test_a_503_on_the_root_marker_is_retried_within_the_open_bound(
        s3_url: str, tmp_path: Path) -> None:
    """A mount's first request (the root marker, under ``open_timeout``) answered 503:
    retried, the root opens (was: no retry, the node served local state only and a
    fresh node's whole job missed; found by ``bench.fleet --faults``)."""
    from casfs.store.root import SharedRoot

    SharedRoot.open(s3_url, create=True)
    loc = parse_location(s3_url)
    assert isinstance(loc, S3Location) and loc.endpoint
    with NetProxy(loc.endpoint, delay=0.0) as net:
        url = s3_url.replace(loc.endpoint, net.endpoint)
        net.slowdown_next(1)
        t0 = time.monotonic()
        SharedRoot.open(url, open_timeout=3.0)
        assert time.monotonic() - t0 < 3.0
        assert net.counts()["slowdown_503"] == 1
