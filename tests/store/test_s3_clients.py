"""One object-store client per process for a root: a second opening of the same root
(a host's next namespace, a worker's next request) reuses its warm connections; a
changed environment (rotated credentials) gets a new client."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netem import NetProxy

from casfs.store.root import SharedRoot


@pytest.fixture
def net(seaweed_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
        ) -> Iterator[NetProxy]:
    for k, v in seaweed_server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    with NetProxy(seaweed_server.port, delay=0.002, record=True) as proxy:
        yield proxy


def test_a_root_opened_again_reuses_the_connection(
        net: NetProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"s3://casfs-test/clients-{os.getpid()}-{tmp_path.name[-40:]}?endpoint={net.endpoint}"
    SharedRoot.open(url, create=True)
    first = SharedRoot.open(url)
    assert first.generations().latest_seq("ns") is None
    net.reset_counts()
    again = SharedRoot.open(url)  # another namespace's attach in the same process
    assert again.generations().latest_seq("ns") is None
    reqs = net.requests()
    assert reqs and not [q for q in reqs if q.fresh], [(q.kind, q.conn) for q in reqs]
    assert net.counts()["connections"] == 0
    # Credentials rotated in the environment: a client built with the new ones.
    monkeypatch.setenv("AWS_SESSION_TOKEN", "")
    net.reset_counts()
    assert SharedRoot.open(url).generations().latest_seq("ns") is None
    assert net.counts()["connections"] >= 1
