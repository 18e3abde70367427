"""Replaced paths: a later generation's version overrides, everything else first-writer-wins."""

from __future__ import annotations

import dataclasses
import json

import pytest

from casfs.errors import HostileManifestError
from casfs.store import manifest
from casfs.store.entry import Entry
from casfs.store.generations import COMPACT_DELTAS, REPLACE, is_replace
from casfs.store.record import Part, Record
from casfs.store.root import SharedRoot
from casfs.store.snapshot import Snapshot


def put(root: SharedRoot, path: str, data: bytes, replace: bool = False) -> Entry:
    res = root.objects.put_bytes(data)
    return Entry(path, res.digest, res.size, 0o644, 1, {REPLACE: True} if replace else None)


def test_newest_generation_wins_for_replaced_paths_only(root: SharedRoot) -> None:
    gens = root.generations()
    gens.publish("ns", [put(root, "idx", b"v1", True), put(root, "k/a", b"a1")], node="A")
    res = gens.publish("ns", [put(root, "idx", b"v2", True), put(root, "k/a", b"a2")], node="B")
    assert (res.added, res.replaced, res.conflicts) == (1, 1, 1)
    snap = gens.entries("ns")
    assert root.objects.get_bytes(snap.entries["idx"].digest) == b"v2"
    assert root.objects.get_bytes(snap.entries["k/a"].digest) == b"a1"  # first writer stays
    assert snap.record is not None and snap.record.entries == 2
    assert snap.record.requires == (REPLACE,)  # an older reader must not take it for damage
    assert snap.record.logical_bytes == 4
    # The same bytes again: already published, no new generation.
    again = gens.publish("ns", [put(root, "idx", b"v2", True)], node="A")
    assert again.already == 1 and again.seq == snap.record.seq


def test_compaction_keeps_the_newest_version(root: SharedRoot) -> None:
    gens = root.generations()
    for i in range(COMPACT_DELTAS + 2):
        gens.publish("ns", [put(root, "idx", f"v{i}".encode(), True),
                            put(root, f"f{i}", b"x")], node="A")
    rec = gens.latest("ns")
    assert rec is not None and len(rec.deltas) < COMPACT_DELTAS
    snap = gens.snapshot(rec)
    assert root.objects.get_bytes(snap.entries["idx"].digest) == f"v{COMPACT_DELTAS + 1}".encode()
    assert rec.entries == COMPACT_DELTAS + 3 == len(snap.entries)
    assert is_replace(snap.entries["idx"])


def test_a_duplicate_without_replace_is_damage(root: SharedRoot) -> None:
    gens = root.generations()
    gens.publish("ns", [put(root, "idx", b"v1")], node="A")
    gens.publish("ns", [put(root, "other", b"o")], node="A")
    rec = gens.latest("ns")
    assert rec is not None
    # A hand-made delta naming "idx" again without the replace flag.
    data = manifest.encode([put(root, "idx", b"evil")], "delta")
    part = root.objects.put_bytes(data)
    doc = json.loads(rec.to_json())
    doc["deltas"][-1].update(digest=part.digest, size=part.size, entries=1)
    from casfs.store.generations import parse_record
    forged = parse_record(json.dumps(doc).encode(), "ns", rec.seq)
    with pytest.raises(HostileManifestError, match="appears twice"):
        gens.snapshot(forged)


def test_a_delta_with_a_newer_replaced_version_advances_the_held_snapshot(
        root: SharedRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader holding generation N reads N+1, a delta carrying a newer version of a
    replaced path, by merging that delta alone: no full rebuild (the incremental merge
    once lacked the override and fell back to one on every such delta), and the same
    entries as a full build of N+1."""
    publisher = root.generations()
    reader = root.generations()  # a store of its own: it holds its own snapshots
    publisher.publish("ns", [put(root, "idx", b"v1", True), put(root, "k/a", b"a")]
                      + [put(root, f"k/f{i}", b"%d" % i) for i in range(20)], node="A")
    rebuilds: list[int] = []
    loaded: list[str] = []
    full_build, load = reader.snapshot, reader.part_entries

    def counting_build(record: Record | None) -> Snapshot:
        rebuilds.append(record.seq if record else -1)
        return full_build(record)

    def counting_load(part: Part, read: list[Entry] | None = None) -> list[Entry]:
        loaded.append(part.digest)
        return load(part, read)

    monkeypatch.setattr(reader, "snapshot", counting_build)
    monkeypatch.setattr(reader, "part_entries", counting_load)
    _, first, _ = reader.newest_valid("ns")
    assert first is not None and rebuilds == [first.seq]  # nothing held yet: one full build
    for version in (b"v2", b"v3"):
        publisher.publish("ns", [put(root, "idx", version, True),
                                 put(root, f"k/new-{version.decode()}", version)], node="B")
        loaded.clear()
        _, rec, snap = reader.newest_valid("ns")
        assert rec is not None and rec.deltas and rec.base == first.base  # a delta, not a base
        assert rebuilds == [first.seq], "advanced by a full rebuild"
        assert loaded == [rec.deltas[-1].digest]  # the new delta alone was read
        assert snap.record == rec
        assert root.objects.get_bytes(snap.entries["idx"].digest) == version
        fresh = root.generations().snapshot(rec)  # the same record built whole
        assert snap.entries == fresh.entries
        assert snap.dirs == fresh.dirs == {"k"}
        assert len(snap.entries) == rec.entries == 23 + (version == b"v3")


@pytest.mark.expect_log(r"k/a: published with size 3, its bytes are 2: put right")
def test_a_row_whose_size_is_wrong_for_its_digest_is_put_right(root: SharedRoot) -> None:
    """A buggy or hostile writer published the right digest with a wrong size: the path
    is a miss on every node (the fetch checks the size). A node publishing the bytes
    again used to count them "already published", so the miss stayed for good. Now the
    row is put right, as a newer version of the path every reader takes."""
    gens = root.generations()
    good = put(root, "k/a", b"a1")
    gens.publish("ns", [dataclasses.replace(good, size=good.size + 1), put(root, "k/b", b"b")],
                 node="buggy")
    res = gens.publish("ns", [good], node="A")
    assert (res.added, res.repaired, res.already, res.conflicts) == (1, 1, 0, 0)
    snap = root.generations().entries("ns")  # a fresh reader: a full build
    e = snap.entries["k/a"]
    assert (e.digest, e.size) == (good.digest, good.size)
    assert root.objects.get_bytes(e.digest) == b"a1"
    assert snap.record is not None and snap.record.requires == (REPLACE,)
    again = gens.publish("ns", [good], node="B")  # now it is already published
    assert (again.already, again.repaired, again.seq) == (1, 0, snap.record.seq)


def test_a_publication_after_a_drop_builds_on_the_drop(root: SharedRoot) -> None:
    """Retention dropped a path; a job compiles it again and the same store publishes it.
    The drop's generation is the one built on: before, the publication merged into the
    snapshot still holding the path (taken as the newest for PUBLISH_FRESH), found it
    "already published" and published nothing, so the path stayed dropped."""
    gens = root.generations()
    gens.publish("ns", [put(root, "k/a", b"a"), put(root, "k/b", b"b")], node="A")
    assert gens.drop("ns", lambda snap: {"k/a"}, node="A")[1] == ["k/a"]
    res = gens.publish("ns", [put(root, "k/a", b"a")], node="A")
    assert (res.added, res.already) == (1, 0)
    assert set(root.generations().entries("ns").entries) == {"k/a", "k/b"}


def test_a_publication_after_another_nodes_drop_builds_on_the_drop(root: SharedRoot) -> None:
    """The same, across nodes: B's publication builds on the newest seq it found within
    PUBLISH_FRESH (no request); A dropped the path since. With nothing to create, no lost
    race told B of A's generation: it looks (one HEAD) before saying "already"."""
    a, b = root.generations(), SharedRoot.open(root.path).generations()
    a.publish("ns", [put(root, "k/a", b"a"), put(root, "k/b", b"b")], node="A")
    b.publish("ns", [put(root, "k/c", b"c")], node="B")  # B's newest: fresh, with k/a
    assert a.drop("ns", lambda snap: {"k/a"}, node="A")[1] == ["k/a"]
    res = b.publish("ns", [put(root, "k/a", b"a")], node="B")
    assert (res.added, res.already) == (1, 0)
    assert set(root.generations().entries("ns").entries) == {"k/a", "k/b", "k/c"}
    again = b.publish("ns", [put(root, "k/a", b"a")], node="B")  # found, and the same
    assert (again.added, again.already) == (0, 1)
