"""casfs.node.preopen: a namespace's first reads of an object store root, begun before
its mount exists, taken once by the mount (on a real S3 root: SeaweedFS)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from casfs.index.node_index import NodeIndex
from casfs.node import preopen
from casfs.node.config import MountConfig
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot
from casfs.util.location import parse_location


def _cfg(root: str | Path, tmp: Path, ns: str = "ns") -> MountConfig:
    return MountConfig(name=f"t/{ns}", family="triton", namespace=ns, mountpoint=tmp / "mnt",
                       root=parse_location(str(root)), state_dir=tmp / "state",
                       fetch_timeout=5.0)


@pytest.fixture(scope="module")
def s3_root(seaweed_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One S3 root for the module (creating one checks the store's atomic creates: ~5 s
    on SeaweedFS); each test has a namespace of its own."""
    aws = tmp_path_factory.mktemp("aws")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in seaweed_server.env().items():
            mp.setenv(k, v)
        mp.setenv("AWS_CONFIG_FILE", str(aws / "no-aws-config"))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(aws / "no-aws-credentials"))
        url = f"s3://casfs-test/preopen-{os.getpid()}?endpoint={seaweed_server.endpoint}"
        SharedRoot.open(url, create=True)
        yield url


def _publish(url: str, ns: str, files: dict[str, bytes]) -> int:
    root = SharedRoot.open(url)
    entries = []
    for path, data in sorted(files.items()):
        res = root.objects.put_bytes(data)
        entries.append(Entry(path, res.digest, res.size, 0o644, 1_700_000_000_000_000_000))
    return root.generations().publish(ns, entries, node="writer").seq


def test_a_fresh_nodes_preopen_reads_the_newest_generation_once(s3_root: str,
                                                                tmp_path: Path) -> None:
    seq = _publish(s3_root, "fresh", {"a": b"1", "b/c": b"22"})
    cfg = _cfg(s3_root, tmp_path, "fresh")
    assert preopen.begin(cfg)
    assert not preopen.begin(cfg)  # one per namespace
    counters = preopen.counters(cfg)  # the mount's, before it takes the pre-open
    o = preopen.take(cfg)
    assert o is not None and preopen.take(cfg) is None  # taken once
    root = o.result(10.0)
    assert o.counters is counters and root.counters is counters
    assert o.gens is not None and o.gens.root is root
    assert o.newest is not None
    newest, got = o.newest
    assert newest == seq and got is not None  # no index on this node: read whole
    rec, snap = got
    assert rec is not None and rec.seq == seq and sorted(snap.entries) == ["a", "b/c"]


def test_a_node_with_an_index_reads_no_manifest_ahead(s3_root: str, tmp_path: Path) -> None:
    """The node may hold the generation already: only the newest seq is found ahead."""
    seq = _publish(s3_root, "indexed", {"a": b"1"})
    NodeIndex.open(tmp_path / "state").close()
    cfg = _cfg(s3_root, tmp_path, "indexed")
    assert preopen.begin(cfg)
    o = preopen.take(cfg)
    assert o is not None
    o.result(10.0)
    assert o.newest == (seq, None)


def test_posix_roots_are_not_preopened(tmp_path: Path) -> None:
    root = tmp_path / "root"
    SharedRoot.open(root, create=True)
    cfg = _cfg(root, tmp_path)
    assert not preopen.begin(cfg)
    assert preopen.take(cfg) is None


def test_a_stale_preopen_is_not_taken(s3_root: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _publish(s3_root, "stale", {"a": b"1"})
    cfg = _cfg(s3_root, tmp_path, "stale")
    monkeypatch.setattr(preopen, "FRESH", 0.0)
    assert preopen.begin(cfg)
    with preopen._lock:
        o = preopen._opened[preopen._key(cfg)]
    assert o.done.wait(10.0)
    assert preopen.take(cfg) is None  # ended more than FRESH seconds ago


def test_a_preopen_never_taken_is_dropped(s3_root: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A lease that never came: the pre-open (its client, the manifest it parsed) is
    not kept for the life of the mount process."""
    import time

    _publish(s3_root, "untaken", {"a": b"1"})
    cfg = _cfg(s3_root, tmp_path, "untaken")
    monkeypatch.setattr(preopen, "FRESH", 0.0)
    assert preopen.begin(cfg)
    deadline = time.monotonic() + 20
    while preopen._key(cfg) in preopen._opened and time.monotonic() < deadline:
        time.sleep(0.1)
    assert preopen._key(cfg) not in preopen._opened


def test_an_unanswered_preopen_reads_as_the_bounded_opens_timeout(tmp_path: Path) -> None:
    """A pre-open still waiting at the mount's bound fails in the words of the mount's
    own bounded open (`root-open:<root>:<tenant>:<namespace>: no answer within`): an
    operator greps for one line whichever path opened the root."""
    o = preopen.Opened(("s3://b/p?endpoint=http://h:1", "ns", "alice"))
    with pytest.raises(TimeoutError) as e:
        o.result(0.01)
    assert str(e.value) == ("root-open:s3://b/p?endpoint=http://h:1:alice:ns: "
                            "no answer within 0.01 s")


def test_a_failed_preopen_is_the_mounts_failure(tmp_path: Path) -> None:
    """Nobody answers at the endpoint: the mount's connect gets the opening's error
    (and serves local state, as when it opens the root itself)."""
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = _cfg(f"s3://casfs-test/x?endpoint=http://127.0.0.1:{port}", tmp_path)
    assert preopen.begin(cfg)
    o = preopen.take(cfg)
    assert o is not None
    with pytest.raises(Exception) as e:
        o.result(30.0)
    assert "127.0.0.1" in str(e.value) or "reach" in str(e.value), e.value


def test_a_mount_process_reads_its_namespace_while_it_imports(s3_root: str,
                                                              tmp_path: Path) -> None:
    """A mount process of its own (``casfs run`` in dir or overlay mode) begins its
    namespace's reads before importing what serving needs (casfs.node.worker's loader),
    and its mount takes them."""
    import dataclasses

    from casfs.node import worker

    _publish(s3_root, "own", {"a": b"1"})
    cfg = dataclasses.replace(_cfg(s3_root, tmp_path, "own"), mode="dir", name="own")
    w = worker.spawn(cfg)
    try:
        assert (cfg.mountpoint / "a").read_bytes() == b"1"
    finally:
        stats = w.stop()
    assert stats is not None and stats["counters"].get("root_preopened") == 1, stats
