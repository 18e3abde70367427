"""Lazy ingest: a fresh node serves the newest generation at once, its rows follow."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from casfs.index.node_index import NodeIndex
from casfs.node.config import MountConfig
from casfs.node.lowerfeed import LowerFeed
from casfs.node.mount import MountService
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot

N = 60


def publish(root_dir: Path) -> None:
    root = SharedRoot.open(root_dir, create=True)
    entries = [Entry(f"d{i % 7}/f{i}", root.objects.put_bytes(b"x%d" % i).digest,
                     len(b"x%d" % i), 0o644, 1_700_000_000_000_000_000) for i in range(N)]
    gens = root.generations()
    gens.publish("testns", entries[: N // 2], node="a")
    gens.publish("testns", entries[N // 2:], node="a")  # a base and a delta


def config(tmp_path: Path) -> MountConfig:
    return MountConfig(name="t", family="generic", namespace="testns",
                       mountpoint=tmp_path / "mnt", root=tmp_path / "root",
                       state_dir=tmp_path / "state")


def test_fresh_node_serves_at_once_then_from_its_rows(tmp_path: Path) -> None:
    publish(tmp_path / "root")
    svc = MountService(config(tmp_path), hosted=True)
    try:
        assert svc.served_seq == 2 and svc.restored_entries == N
        f = svc.lower.lookup("d3/f10")
        assert isinstance(f, Entry) and f.size == len(b"x10")
        assert svc.wait_indexed(30)
        state = svc.index.ns_state("testns")
        assert state is not None and state["seq"] == 2 and state["entries"] == N
        rows = svc.index.lower_tree("testns", 2)
        assert sum(1 for _ in rows.walk()) == N
        assert rows.lookup("d3/f10") == f == svc.lower.lookup("d3/f10")
        assert svc.refresh_once()["ok"]
    finally:
        svc.close()
    again = MountService(config(tmp_path), hosted=True)  # a restart: rows, no staging
    try:
        assert not again.lower.staged and again.restored_entries == N
        assert again.lower.lookup("d3/f10") == f
    finally:
        again.close()


def test_stopped_indexing_records_no_state_and_is_redone(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """I1-style: an interrupted ingest never leaves a namespace that looks complete."""
    publish(tmp_path / "root")
    started = threading.Event()
    real = NodeIndex.add_entries

    def slow(self: NodeIndex, *a: Any, **kw: Any) -> Any:
        started.set()
        time.sleep(0.02)
        return real(self, *a, **kw)

    monkeypatch.setattr(LowerFeed, "INDEX_CHUNK", 1)
    monkeypatch.setattr(NodeIndex, "add_entries", slow)
    svc = MountService(config(tmp_path), hosted=True)
    svc.feed.index_now()  # (held for the prefetch, which a mount not serving never starts)
    assert started.wait(10)
    svc.close()  # stops the indexer between two rows, then returns
    assert svc.lower.staged  # never switched: its rows are incomplete
    assert svc.index.ns_state("testns") is None
    monkeypatch.setattr(NodeIndex, "add_entries", real)
    again = MountService(config(tmp_path), hosted=True)
    try:
        assert again.restored_entries == N and again.wait_indexed(30)
        assert sum(1 for _ in again.index.lower_tree("testns", 2).walk()) == N
    finally:
        again.close()


def test_a_held_index_waits_for_the_prefetch_or_a_reader(tmp_path: Path) -> None:
    """A mount whose prefetch plans from the staged generation in memory writes its rows
    once asked: not at construction; at once for wait_indexed (or the prefetch's end)."""
    publish(tmp_path / "root")
    svc = MountService(config(tmp_path), hosted=True)
    try:
        assert svc.lower.staged
        time.sleep(0.3)
        assert svc.lower.staged and svc.index.ns_state("testns") is None  # held
        assert svc.wait_indexed(30) and not svc.lower.staged
        assert svc.index.ns_state("testns") is not None
    finally:
        svc.close()
    other = tmp_path / "other"
    publish(other / "root")
    svc = MountService(config(other), hosted=True)
    try:
        svc.start_prefetch()  # a small namespace, fetched whole: rows after it ends
        assert svc.lower.indexed.wait(5) and not svc.lower.staged  # (not the 10 s hold)
    finally:
        svc.close()
