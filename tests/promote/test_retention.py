"""Retention by use: files nobody opened or published for N days leave the namespace."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from casfs.promote.retention import drop_unused
from casfs.store import reads
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot

DAY = 86400.0
KEY = "7NKZN2IV7ZBONWLCSFOQYCSFLUEILF3Z7JGCKATQOW63BQKAVLRQ"


def put(root: SharedRoot, path: str, data: bytes) -> Entry:
    res = root.objects.put_bytes(data)
    return Entry(path, res.digest, res.size, 0o644, 1)


def group(root: SharedRoot, *children: str) -> Entry:
    doc = {"child_paths": {c.rsplit("/", 1)[1]: f"casfs:{c}" for c in children}}
    return put(root, f"{KEY}/__grp__k.json", json.dumps(doc).encode())


def test_unused_files_and_their_commit_records_are_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = SharedRoot.open(tmp_path / "root", create=True)
    gens = root.generations()
    t0 = time.time()
    ns = "triton-0123456789abcdef"
    monkeypatch.setattr("casfs.store.generations.time.time", lambda: t0 - 30 * DAY)
    gens.publish(ns, [put(root, f"{KEY}/k.cubin", b"cubin"), put(root, f"{KEY}/k.json", b"{}"),
                      group(root, f"{KEY}/k.cubin", f"{KEY}/k.json"),
                      put(root, "cuda_utils.so", b"so"), put(root, "old.bin", b"old")],
                 node="a")
    monkeypatch.setattr("casfs.store.generations.time.time", lambda: t0 - 1 * DAY)
    gens.publish(ns, [put(root, "recent.bin", b"new")], node="a")  # published recently
    monkeypatch.undo()
    # A warm node read the launcher and the kernel's json (not its cubin) 2 days ago.
    reads.record(root.backend, ns, "b", ["cuda_utils.so", f"{KEY}/k.json"], t0 - 2 * DAY)
    reads.record(root.backend, ns, "c", ["old.bin"], t0 - 20 * DAY)  # too long ago

    dry = drop_unused(gens, unused_for_s=7 * DAY, now=t0, node="gc", dry_run=True)
    assert dry.dropped[ns] == [f"{KEY}/__grp__k.json", f"{KEY}/k.cubin", "old.bin"]
    assert gens.latest(ns).seq == 2  # type: ignore[union-attr]
    rep = drop_unused(gens, unused_for_s=7 * DAY, now=t0, node="gc")
    # The unread cubin goes, and with it the group naming it: no group without a child.
    assert rep.dropped[ns] == dry.dropped[ns] and rep.seqs[ns] == 3
    snap = gens.entries(ns)
    assert sorted(snap.entries) == sorted(["cuda_utils.so", f"{KEY}/k.json", "recent.bin"])
    assert snap.record is not None and snap.record.entries == 3
    # The read records are compacted into one (gc's), without those older than the cut-off.
    names = list(root.backend.list(f"namespaces/{ns}/reads"))
    assert len(names) == 1 and names[0].split("-")[1] == "gc"
    assert reads.read_since(root.backend, ns, t0 - 7 * DAY) == {"cuda_utils.so",
                                                                f"{KEY}/k.json"}
    # Nothing more to drop; a namespace with no generation that old is left alone.
    assert drop_unused(gens, unused_for_s=7 * DAY, now=t0, node="gc").dropped == {}
    assert drop_unused(gens, unused_for_s=60 * DAY, now=t0, node="gc").dropped == {}


def test_a_read_record_covers_its_epoch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A path a mount recorded at the start of its epoch may be reopened, unrecorded,
    until the epoch ends (``until``): a cut-off inside that epoch keeps it."""
    root = SharedRoot.open(tmp_path / "root", create=True)
    gens = root.generations()
    t0 = time.time()
    ns = "generic-0123456789abcdef"
    monkeypatch.setattr("casfs.store.generations.time.time", lambda: t0 - 10 * DAY)
    gens.publish(ns, [put(root, "hot.bin", b"hot"), put(root, "done.bin", b"done"),
                      put(root, "cold.bin", b"cold")], node="a")
    monkeypatch.undo()
    reads.record(root.backend, ns, "b", ["hot.bin"], t0 - 7 * DAY - 1800,
                 until=t0 - 7 * DAY + 1800)
    reads.record(root.backend, ns, "c", ["done.bin"], t0 - 7 * DAY - 1800)  # a last record
    assert reads.read_since(root.backend, ns, t0 - 7 * DAY) == {"hot.bin"}
    rep = drop_unused(gens, unused_for_s=7 * DAY, now=t0, node="gc")
    assert rep.dropped[ns] == ["cold.bin", "done.bin"]


def test_compaction_keeps_each_paths_latest_use(tmp_path: Path) -> None:
    root = SharedRoot.open(tmp_path / "root", create=True)
    ns, t0 = "generic-0123456789abcdef", time.time()
    for i in range(5):  # hourly records of two nodes
        reads.record(root.backend, ns, "b", ["a", "b"], t0 - 10 * 3600 + i * 3600)
    reads.record(root.backend, ns, "c", ["a"], t0 - 3600, until=t0 - 1800)
    reads.record(root.backend, ns, "c", ["old"], t0 - 30 * DAY)
    assert reads.compact(root.backend, ns, "gc", t0 - 7 * DAY, t0) == 7
    assert len(list(root.backend.list(f"namespaces/{ns}/reads"))) == 1
    # One record now; each path keeps its latest use: a cut-off between them tells.
    assert reads.read_since(root.backend, ns, t0 - 7 * DAY) == {"a", "b"}
    assert reads.read_since(root.backend, ns, t0 - 6 * 3600) == {"a", "b"}
    assert reads.read_since(root.backend, ns, t0 - 6 * 3600 + 1) == {"a"}
    assert reads.read_since(root.backend, ns, t0 - 1800) == {"a"}
    assert reads.read_since(root.backend, ns, t0 - 1799) == set()
    reads.record(root.backend, ns, "d", ["b"], t0)  # written after a compaction: kept
    assert reads.compact(root.backend, ns, "gc", t0 - 7 * DAY, t0) == 2
    assert reads.read_since(root.backend, ns, t0 - 1) == {"b"}


def test_a_used_record_past_the_parse_bound_is_kept_with_its_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit record past families.MAX_PARSED_BYTES (published before the bound) is
    never read: kept while used, with everything beside it (what it may name); was
    dropped as unreadable, every job then recompiling."""
    from casfs.families.base import MAX_PARSED_BYTES

    root = SharedRoot.open(tmp_path / "root", create=True)
    gens = root.generations()
    t0 = time.time()
    ns = "triton-0123456789abcdef"
    doc = {"child_paths": {"k.cubin": f"casfs:{KEY}/k.cubin"}, "pad": "y" * MAX_PARSED_BYTES}
    big = put(root, f"{KEY}/__grp__k.json", json.dumps(doc).encode())
    monkeypatch.setattr("casfs.store.generations.time.time", lambda: t0 - 30 * DAY)
    gens.publish(ns, [put(root, f"{KEY}/k.cubin", b"cubin"), big, put(root, "old.bin", b"o")],
                 node="a")
    monkeypatch.undo()
    reads.record(root.backend, ns, "b", [f"{KEY}/__grp__k.json"], t0 - 2 * DAY)
    rep = drop_unused(gens, unused_for_s=7 * DAY, now=t0, node="gc", dry_run=True)
    assert rep.dropped[ns] == ["old.bin"]  # the unread cubin beside it stays


@pytest.mark.expect_log(r"ignoring read record \S+: read record: not valid JSON")
def test_read_records_with_times_past_any_number_are_ignored(tmp_path: Path) -> None:
    """A 401-digit "until" overflowed float() and aborted read_since and compact (gc
    --unused-for) for the namespace; NaN/Infinity are not JSON. Each such record is
    ignored, the rest still count."""
    root = SharedRoot.open(str(tmp_path / "root"), create=True)
    ns, t0 = "ns", time.time()
    reads.record(root.backend, ns, "good", ["a.so"], t0)
    bad = [b'"until":1' + b"0" * 400, b'"until":Infinity', b'"until":NaN',
           b'"until":1e400', b'"until":1,"untils":[-1' + b"0" * 400 + b"]",
           b'"time":' + b"9" * 400]
    for i, field in enumerate(bad):
        root.backend.create_exclusive(f"namespaces/{ns}/reads/{int(t0):012d}-evil-{i:08x}",
                                      b'{"casfs_reads":1,"paths":["b.so"],' + field + b"}")
    assert reads.read_since(root.backend, ns, t0 - 3600) == {"a.so"}
    assert reads.compact(root.backend, ns, "gc", t0 - 3600, t0) == 1 + len(bad)
    assert reads.read_since(root.backend, ns, t0 - 3600) == {"a.so"}
