"""A mount start that fails after it took the namespace's lock leaves nothing behind:
the same process (a node's host, serving on-demand namespaces for many tenants all
its life) can start that namespace again once the cause is gone (review: the host
kept refusing it, "already mounted", until casfsd restarted it). And an unexpected
exception from reading the store at the start is a miss, not a refused start."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, NoReturn

import pytest
import trio
from waiting import wait_until

from casfs.node import nsregistry
from casfs.node.config import MountConfig
from casfs.node.host import HostConfig, NodeHost
from casfs.node.lowerfeed import LowerFeed
from casfs.node.mount import MountService
from casfs.store.entry import Entry
from casfs.store.generations import GenerationStore
from casfs.store.root import SharedRoot


def publish(root_dir: Path, ns: str, n: int = 5) -> None:
    root = SharedRoot.open(root_dir, create=True)
    entries = [Entry(f"d/f{i}", root.objects.put_bytes(b"x%d" % i).digest, len(b"x%d" % i),
                     0o644, 1_700_000_000_000_000_000) for i in range(n)]
    root.generations().publish(ns, entries, node="a")


def config(tmp_path: Path) -> MountConfig:
    return MountConfig(name="t", family="generic", namespace="hn",
                       mountpoint=tmp_path / "mnt", root=tmp_path / "root",
                       state_dir=tmp_path / "state")


def indexers(ns: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"casfs-index-{ns}" and t.is_alive()]


def lock_free(cfg: MountConfig) -> bool:
    """Whether another open of the namespace's lock file could take it now."""
    from casfs.util.flock import try_flock

    fd = nsregistry.lock_file(cfg.run_dir, cfg.namespace, "lock")
    try:
        return try_flock(fd)
    finally:
        os.close(fd)


def test_a_start_failing_after_the_lock_gives_everything_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    publish(tmp_path / "root", "hn")  # a fresh node: the indexer thread is started
    real = LowerFeed.start

    def start_then_fail(self: LowerFeed, held: bool = False) -> NoReturn:
        real(self, held)
        raise OverflowError("int too large to convert")

    monkeypatch.setattr(LowerFeed, "start", start_then_fail)
    with pytest.raises(OverflowError):
        MountService(config(tmp_path), hosted=True)
    assert not indexers("hn")  # stopped and joined
    # (a worker forked that moment holds the lock's file a few ms, until its exec)
    wait_until(lambda: lock_free(config(tmp_path)), "the namespace's lock given back", 10)
    monkeypatch.setattr(LowerFeed, "start", real)  # the cause is gone
    svc = MountService(config(tmp_path), hosted=True)  # (was: "namespace hn is already
    try:                                               #  mounted from .../state")
        assert svc.served_seq == 1 and svc.wait_indexed(30)
        assert isinstance(svc.lower.lookup("d/f3"), Entry)
    finally:
        svc.close()


@pytest.mark.expect_log(r"cannot read generations of hn: OverflowError")
def test_an_unexpected_error_reading_the_store_at_the_start_is_a_miss(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile document that some check let through as an exception other than
    CasfsError or OSError: the namespace starts with what the node knows (nothing
    here), every lookup a miss, and the next refresh serves the store's newest."""
    publish(tmp_path / "root", "hn")

    def hostile(self: GenerationStore, *a: Any, **kw: Any) -> NoReturn:
        raise OverflowError("cannot convert float infinity to integer")

    with monkeypatch.context() as m:
        m.setattr(GenerationStore, "latest_seq", hostile)
        svc = MountService(config(tmp_path), hosted=True)  # (was: the start refused)
    try:
        assert svc.served_seq == 0 and svc.lower.lookup("d/f3") is None
        assert svc.counters.snapshot()["refresh_errors"] == 1
        assert svc.refresh_once()["ok"] and svc.served_seq == 1
        assert isinstance(svc.lower.lookup("d/f3"), Entry)
    finally:
        svc.close()


def host_cfg(tmp_path: Path) -> HostConfig:
    return HostConfig(base=tmp_path / "ns", root=tmp_path / "root",
                      state_dir=tmp_path / "state", publish_interval=3600.0,
                      refresh_interval=3600.0, shutdown_timeout=30.0)


def run_host(tmp_path: Path, body: Any) -> None:
    """``body(host)`` in a trio run with the host's nursery, no FUSE session (the
    mux routes to an unmounted session: attach and detach work as served)."""
    host = NodeHost(host_cfg(tmp_path))

    async def main() -> None:
        async with trio.open_nursery() as n:
            host._nursery = n
            await body(host)
            n.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        host.mux.handles.close()
        host.drain.close()
        if host._lock_fd is not None:
            os.close(host._lock_fd)


def test_a_host_attaches_a_namespace_again_after_its_start_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside MountService (its lower feed's start) and after it (the host's own
    steps: routed, journalled, recorded, then its tasks failed to start)."""
    publish(tmp_path / "root", "u1~hn")
    real_start, real_tasks = LowerFeed.start, NodeHost._ns_tasks

    def start_then_fail(self: LowerFeed, held: bool = False) -> NoReturn:
        real_start(self, held)
        raise OverflowError("int too large to convert")

    async def no_tasks(self: NodeHost, s: Any, task_status: Any = None) -> NoReturn:
        raise OverflowError("int too large to convert")

    async def body(host: NodeHost) -> None:
        for where, obj, name, fake in (("feed", LowerFeed, "start", start_then_fail),
                                       ("host", NodeHost, "_ns_tasks", no_tasks)):
            with monkeypatch.context() as m:
                m.setattr(obj, name, fake)
                with pytest.raises(OverflowError):
                    await host.attach("u1", "generic", "hn")
            assert real_tasks is NodeHost._ns_tasks and real_start is LowerFeed.start, where
            assert not host.served and host.mux.served() == [], where
            assert not indexers("u1~hn"), where
            assert list(host.cfg.run_dir.glob("*.inodes")) == [], where  # no journal left
            if host.cfg.served_file.exists():  # (written once the host routed it)
                recorded = host.cfg.served_file.read_text()
                assert '"served": []' in recorded and "hn" not in recorded, where
            else:
                assert where == "feed"
            s = await host.attach("u1", "generic", "hn")  # (was: "already mounted")
            assert s.svc.served_seq == 1 and isinstance(s.svc.lower.lookup("d/f3"), Entry)
            assert host.mux.served() == [("u1", "hn")]
            assert await host.detach(("u1", "hn")) is not None, where

    run_host(tmp_path, body)


@pytest.mark.expect_log(r"cannot read generations of u1~hn: OverflowError")
def test_a_host_serves_a_namespace_whose_store_read_failed_oddly_as_a_miss(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    publish(tmp_path / "root", "u1~hn")

    def hostile(self: GenerationStore, *a: Any, **kw: Any) -> NoReturn:
        raise OverflowError("cannot convert float infinity to integer")

    async def body(host: NodeHost) -> None:
        with monkeypatch.context() as m:
            m.setattr(GenerationStore, "latest_seq", hostile)
            s = await host.attach("u1", "generic", "hn")  # (was: refused: no cache)
        assert s.svc.served_seq == 0 and s.svc.lower.lookup("d/f3") is None
        assert host.mux.served() == [("u1", "hn")]
        await host.detach(("u1", "hn"))

    run_host(tmp_path, body)
