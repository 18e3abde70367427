"""Publisher against a real store and a real LMDB index (no mount)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from casfs.families import rules as family_rules
from casfs.index.node_index import NodeIndex
from casfs.promote.publisher import Publisher
from casfs.promote.tracker import WriteTracker
from casfs.store.entry import Entry
from casfs.store.objects import object_key
from casfs.store.record import seq_name
from casfs.store.root import SharedRoot
from casfs.util.counters import Counters


def setup(tmp_path: Path) -> tuple[SharedRoot, NodeIndex, Publisher, WriteTracker]:
    root = SharedRoot.open(tmp_path / "root", create=True)
    index = NodeIndex.open(tmp_path / "state")
    tracker = WriteTracker()
    pub = Publisher(generations=root.generations(), index=index, key="ns", namespace="ns",
                    counters=Counters(), rules=family_rules("triton"), fingerprint=None,
                    max_bytes=None,
                    on_lost=tracker.modified)
    return root, index, pub, tracker


def two_generations(root: SharedRoot) -> None:
    """ns@1 (a file "a") and ns@2 (a file "b"), published by node "n"."""
    gens = root.generations()
    for seq, (rel, data) in enumerate((("a", b"first"), ("b", b"second")), 1):
        obj = root.objects.put_bytes(data)
        gens.publish("ns", [Entry(rel, obj.digest, obj.size, 0o644, 1)], node="n")
        assert gens.seqs("ns")[-1] == seq


def promote(root: SharedRoot, index: NodeIndex, path: str, data: bytes) -> Entry:
    put = root.objects.put_bytes(data)
    e = Entry(path, put.digest, put.size, 0o644, 1)
    index.add_promoted("ns", e)
    return e


def test_objects_collected_while_pending_go_back_to_promotion(tmp_path: Path) -> None:
    root, index, _, tracker = setup(tmp_path)
    keep = promote(root, index, "a/keep", b"kept")
    lost = promote(root, index, "a/lost", b"collected by gc while this node was away")
    (root.path / object_key(lost.digest)).unlink()
    # Published later by another process (the node was away): what it did not store
    # itself moments ago is checked on the root.
    root = SharedRoot.open(tmp_path / "root")
    pub = Publisher(generations=root.generations(), index=index, key="ns", namespace="ns",
                    counters=Counters(), rules=family_rules("triton"), fingerprint=None,
                    max_bytes=None, on_lost=tracker.modified)
    out = pub.publish()
    assert out.ok and out.result is not None and out.result.added == 1
    snap = root.generations().entries("ns")
    assert set(snap.entries) == {"a/keep"}  # never a record naming a missing object
    assert snap.entries["a/keep"].digest == keep.digest
    assert index.get_promoted("ns", "a/lost") is None
    assert tracker.pending() == 1  # re-promoted from the upper file next round
    assert pub.counters.get("promoted_objects_lost") == 1


def test_group_with_a_child_from_another_writer_is_dropped(tmp_path: Path) -> None:
    root, index, pub, _ = setup(tmp_path)
    theirs = root.objects.put_bytes(b"their cubin")
    root.generations().publish(
        "ns", [Entry("K/k.cubin", theirs.digest, theirs.size, 0o644, 1)], node="other")
    promote(root, index, "K/k.cubin", b"our cubin, other bytes")
    promote(root, index, "K/k.json", b"{}")
    group = {"child_paths": {"k.cubin": "/m/K/k.cubin", "k.json": "/m/K/k.json"}}
    promote(root, index, "K/__grp__k.json", json.dumps(group).encode())
    out = pub.publish()
    assert out.ok and out.result is not None
    snap = root.generations().entries("ns").entries
    assert "K/__grp__k.json" not in snap  # would mix two writers' kernel files
    assert snap["K/k.cubin"].digest == theirs.digest  # first writer wins
    assert out.result.conflicts == 2  # our cubin, and our group
    assert pub.counters.get("groups_dropped") == 1


def test_group_with_all_children_ours_is_published(tmp_path: Path) -> None:
    root, index, pub, _ = setup(tmp_path)
    promote(root, index, "K/k.cubin", b"cubin")
    group = {"child_paths": {"k.cubin": "/m/K/k.cubin"}}
    promote(root, index, "K/__grp__k.json", json.dumps(group).encode())
    assert pub.publish().ok
    assert set(root.generations().entries("ns").entries) == {"K/k.cubin", "K/__grp__k.json"}
    assert list(index.pending("ns")) == []


@pytest.mark.expect_log(r"skipping damaged generation ns@\d+: .*not valid JSON")
def test_a_damaged_newest_record_does_not_stop_publication(tmp_path: Path) -> None:
    root, index, pub, _ = setup(tmp_path)
    gens = root.generations()
    two_generations(root)
    rec2 = root.path / "namespaces" / "ns" / "generations" / "000000000002"
    rec2.chmod(0o644)
    rec2.write_text("{damaged")
    promote(root, index, "c", b"third")
    out = pub.publish()
    assert out.ok and out.result is not None and out.result.seq == 3
    rec3 = gens.record("ns", 3)
    assert rec3.parent == 1  # built on the newest readable generation
    assert set(gens.entries("ns").entries) == {"a", "c"}
    assert root.counters.get("bad_generations") >= 1


@pytest.mark.expect_log(
    r"skipping (unresolved \(young, object missing\)|damaged) generation ns@\d+: .*is missing",
)
def test_a_young_record_with_a_missing_manifest_is_waited_for(tmp_path: Path) -> None:
    import os
    import time

    import pytest

    from casfs.errors import CasfsError
    from casfs.store import generations

    root, index, pub, _ = setup(tmp_path)
    gens = root.generations()
    two_generations(root)
    rec2 = gens.record("ns", 2)
    manifest = root.path / object_key(rec2.parts[-1].digest)
    manifest.rename(tmp_path / "hidden")  # as if not visible yet on this NFS client
    promote(root, index, "c", b"third")
    gens = root.generations()
    with pytest.raises(CasfsError):
        gens.publish("ns", list(index.pending("ns")), node="n")  # retried later, not skipped
    assert gens.seqs("ns") == [1, 2]
    key = root.path / "namespaces" / "ns" / "generations" / "000000000002"
    old = time.time() - generations.MISSING_GRACE - 5
    os.utime(key, (old, old))  # still missing long after: the record is damaged
    out = pub.publish()
    assert out.ok and out.result is not None and out.result.seq == 3


@pytest.mark.expect_log(
    r"skipping (unresolved \(young, object missing\)|damaged) generation ns@\d+: .*is missing",
)
def test_a_record_stamped_far_in_the_future_does_not_defer_publication(
        tmp_path: Path) -> None:
    """Young is judged by the record's mtime: one a year ahead (a skewed writer, a
    hostile touch) with its manifest missing deferred every publication for ever,
    each saying "at most 600s"."""
    import os
    import time

    from casfs.store import generations

    root, index, pub, _ = setup(tmp_path)
    gens = root.generations()
    two_generations(root)
    (root.path / object_key(gens.record("ns", 2).parts[-1].digest)).unlink()
    key = root.path / "namespaces" / "ns" / "generations" / "000000000002"
    ahead = time.time() + 365 * 86400
    os.utime(key, (ahead, ahead))
    assert not gens._young("ns", 2)
    soon = time.time() + generations.MISSING_GRACE / 2  # a writer a few minutes ahead
    os.utime(key, (soon, soon))
    assert gens._young("ns", 2)  # still waited for
    os.utime(key, (ahead, ahead))
    promote(root, index, "c", b"third")
    out = pub.publish()
    assert out.ok and out.result is not None and out.result.seq == 3, out


def test_objects_this_process_just_stored_are_not_checked_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A promotion's objects and packs, published by the process that stored them
    moments ago: no request asks whether they exist (a round trip each on S3)."""
    from casfs.store import objects as objects_mod
    from casfs.store.digests import digest_bytes
    from casfs.store.packloc import pack_key
    from casfs.store.packs import write_pack

    root, index, pub, _ = setup(tmp_path)
    loose = promote(root, index, "a/loose", b"loose bytes")
    member = root.objects.encode(b"packed bytes")
    d = digest_bytes(b"packed bytes")
    loc = write_pack(root.objects, [(d, member)])[d]
    index.add_promoted_many("ns", [Entry("a/packed", d, 12, 0o644, 1)], {d: loc},
                            root.root_id)
    asked: list[str] = []
    info = root.backend.info
    monkeypatch.setattr(root.backend, "info", lambda k: asked.append(k) or info(k))
    out = pub.publish()
    assert out.ok and out.result is not None and out.result.added == 2, out
    assert not {object_key(loose.digest), pack_key(loc[0])} & set(asked), asked
    assert pub.counters.get("promoted_objects_lost") == 0
    # Later (or suspended past it) they are checked again.
    monkeypatch.setattr(objects_mod, "STORED_FRESH_S", 0.0)
    assert not root.objects.recently_stored(object_key(loose.digest))


def test_the_profile_is_computed_on_the_base_record_beside_the_manifests_upload(
        tmp_path: Path) -> None:
    """A record's options (the access profile: a read and a write of its own) come from
    the record the publication builds on, computed while the manifest goes up, not
    before it, and the gc marks are listed meanwhile too: round trips saved on an
    object store."""
    import threading

    root, index, pub, _ = setup(tmp_path)
    first = promote(root, index, "a/one", b"one")
    assert pub.publish().ok
    promote(root, index, "a/two", b"two")
    pub.gens._condemned = None  # the marks not listed lately (they are kept a while)
    part_stored, marks_listed = threading.Event(), threading.Event()
    put, listing = root.backend.put_if_absent, root.backend.list
    beside_marks: list[bool] = []

    def watched(key: str, staged: Path) -> bool:
        beside_marks.append(marks_listed.wait(5))  # the gc marks are read meanwhile too
        created = put(key, staged)
        part_stored.set()  # (the only object this publication stores: its manifest part)
        return created

    def listed(prefix: str) -> Any:
        if prefix.startswith("gc/marks"):
            marks_listed.set()
        return listing(prefix)

    root.backend.put_if_absent = watched  # type: ignore[method-assign]
    root.backend.list = listed  # type: ignore[method-assign]
    seen: list[Any] = []

    def options(published: list[Entry], base: Any) -> dict[str, Any]:
        seen.append((base.seq if base is not None else None, [e.path for e in published],
                     part_stored.wait(5)))
        return {}

    pub.options_for = options
    out = pub.publish()
    assert out.ok and out.result is not None and out.result.seq == 2
    assert seen == [(1, ["a/two"], True)], seen
    assert beside_marks == [True]
    assert first.digest


def test_a_lost_publication_race_is_retried_and_counted(tmp_path: Path) -> None:
    """Another node takes the seq this publication was about to create: the publisher
    builds on that node's generation, publishes the next one, and counts the lost race
    (``publish_races_lost``: how contended a namespace is, for operators and the fleet
    bench)."""
    root, index, pub, _ = setup(tmp_path)
    promote(root, index, "K/ours", b"ours")
    other = SharedRoot.open(tmp_path / "root")
    first = other.objects.put_bytes(b"first")  # the namespace has a generation already
    other.generations().publish(
        "ns", [Entry("K/first", first.digest, first.size, 0o644, 1)], node="other")
    theirs = other.objects.put_bytes(b"theirs")
    backend = pub.gens.backend
    create = backend.create_exclusive
    raced: list[str] = []

    def create_after_the_other_node(key: str, data: bytes) -> bool:
        if "/generations/" in key and not raced:  # the other node's record lands first
            raced.append(key)
            other.generations().publish(
                "ns", [Entry("K/theirs", theirs.digest, theirs.size, 0o644, 1)], node="other")
        return bool(create(key, data))

    info = backend.info
    looked: list[str] = []

    def counted_info(key: str) -> Any:
        if "/generations/" in key:
            looked.append(key)
        return info(key)

    objects = pub.gens.objects
    put_bytes = objects.put_bytes
    puts: list[bytes] = []

    def counted_put(data: bytes) -> Any:
        puts.append(data)
        return put_bytes(data)

    backend.create_exclusive = create_after_the_other_node  # type: ignore[method-assign]
    backend.info = counted_info  # type: ignore[method-assign]
    objects.put_bytes = counted_put  # type: ignore[method-assign]
    out = pub.publish()
    assert raced, "the publication never created a record"
    assert out.ok and out.result is not None
    assert out.result.attempts == 2
    assert pub.counters.get("publish_races_lost") == 1
    # Round trips a lost race costs: the seq it lost and the ones past it are looked at
    # once, not again by the retry's read (at a fleet's start, N publishers at once paid
    # k+2 HEADs twice per lost race, k newer records). Seq 2, which both went for: once
    # before the create, once after (a create refused for a record nobody can see must
    # not pass for a race lost); seq 3 once.
    assert looked == [f"namespaces/ns/generations/{seq_name(s)}" for s in (2, 2, 3)], looked
    # its manifest part (the same entries both times) went up once, not again at the retry
    assert len(puts) == 1, [len(p) for p in puts]
    snap = SharedRoot.open(tmp_path / "root").generations().entries("ns").entries
    assert set(snap) == {"K/first", "K/ours", "K/theirs"}  # neither lost to the other
