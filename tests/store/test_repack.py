"""gc repacks packs most of whose bytes no kept row uses (casfs.store.packs, "repacking"),
on both backends: live members move to a new pack, a forward record says where, readers
follow it, the old pack goes only through gc's two phases, and a publisher that names a
member of the old pack meanwhile (moved or not) stays safe, also racing gc."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from casfs.store import maintenance, marks
from casfs.store.entry import Entry
from casfs.store.objects import digest_bytes
from casfs.store.packs import (
    Location,
    PackWriter,
    forward_key,
    iter_forwards,
    iter_packs,
    pack_key,
)
from casfs.store.root import SharedRoot


@pytest.fixture(params=["local", "s3"])
def any_root(request: pytest.FixtureRequest, tmp_path: Path) -> SharedRoot:
    if request.param == "s3":
        return SharedRoot.open(request.getfixturevalue("s3_url"), create=True)
    return SharedRoot.open(tmp_path / "root", create=True)


def _packed(root: SharedRoot, blobs: list[bytes]) -> dict[str, Location]:
    w = PackWriter(root.objects, target=1 << 30)  # one pack
    for b in blobs:
        w.add(b)
    return w.flush()


def _entries(blobs: dict[str, bytes], locs: dict[str, Location]) -> list[Entry]:
    return [Entry(p, digest_bytes(b), len(b), 0o644, 0, {"pack": list(locs[digest_bytes(b)])})
            for p, b in blobs.items()]


def _reads(root: SharedRoot, ns: str) -> dict[str, bytes]:
    fresh = SharedRoot.open(root.location)  # a new reader: learns rows' locations only
    snap = fresh.generations().entries(ns)
    return {p: fresh.objects.get_bytes(e.digest, e.size) for p, e in snap.entries.items()}


def _age_past_mark_slack() -> None:
    # Objects and packs written within MTIME_SLACK of a mark count as written after it
    # (whole-second stamps on object stores): let the old pack age (no utime on S3).
    time.sleep(marks.MTIME_SLACK + 1.1)


def _backend_has(root: SharedRoot, key: str) -> bool:
    return root.backend.info(key) is not None


def test_gc_repacks_a_mostly_unused_pack_in_two_phases(any_root: SharedRoot) -> None:
    root = any_root
    gens = root.generations()
    blobs = {f"f{i}": os.urandom(2000 + i) for i in range(8)}
    locs = _packed(root, list(blobs.values()))
    (old,) = {loc[0] for loc in locs.values()}
    gens.publish("ns", _entries(blobs, locs), node="a")
    keep = {"f0": blobs["f0"], "f1": blobs["f1"]}  # 2 of 8 members stay in use
    drop = "namespaces/ns/generations/000000000001"
    # A full generation naming only two of the pack's members, then gc keeps only it.
    gens.drop("ns", lambda snap: set(snap.entries) - set(keep), node="a")
    _age_past_mark_slack()

    first = maintenance.gc(root, keep=1, grace=3600)  # phase 1: repack, mark the old pack
    assert first.repacked_packs == 1 and first.removed_packs == 0
    new = set(iter_packs(root.objects)) - {old}
    assert len(new) == 1 and set(iter_forwards(root.objects)) == {old}
    assert _backend_has(root, pack_key(old))  # not before the grace period
    assert _reads(root, "ns") == keep

    second = maintenance.gc(root, keep=1, grace=3600, now=time.time() + 7200)  # phase 2
    assert not _backend_has(root, pack_key(old)) and second.removed_packs == 1
    assert _backend_has(root, forward_key(old))  # rows still name the old pack
    assert _reads(root, "ns") == keep  # through the forward, verified
    assert not _backend_has(root, drop)
    assert maintenance.verify(root).problems == []
    third = maintenance.gc(root, keep=1, grace=0)  # stable: nothing more to do
    assert third.repacked_packs == 0 and third.removed_packs == 0
    assert _reads(root, "ns") == keep

    # Once no kept row names the old pack, its forward and the new pack go too.
    gens.drop("ns", lambda snap: set(snap.entries), node="a")
    _age_past_mark_slack()
    maintenance.gc(root, keep=1, grace=0)
    assert set(iter_packs(root.objects)) == set() and set(iter_forwards(root.objects)) == set()


def test_a_publisher_naming_an_unmoved_member_after_the_mark_keeps_the_old_pack(
    any_root: SharedRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = any_root
    monkeypatch.setattr(marks, "LIST_TTL", 0.0)  # publishers see the mark at once
    gens = root.generations()
    blobs = {f"f{i}": os.urandom(3000 + i) for i in range(6)}
    locs = _packed(root, list(blobs.values()))
    (old,) = {loc[0] for loc in locs.values()}
    gens.publish("ns", _entries(blobs, locs), node="a")
    gens.drop("ns", lambda snap: set(snap.entries) - {"f0"}, node="a")
    _age_past_mark_slack()
    assert maintenance.gc(root, keep=1, grace=3600).repacked_packs == 1  # f1..f5 not moved

    # Another node re-uses f3 as the old pack holds it (its manifest said so): the
    # mark condemns the old pack, so the publisher writes it again before its record.
    pub = SharedRoot.open(root.location).generations()
    pub.publish("ns", _entries({"again": blobs["f3"]}, locs), node="b")
    report = maintenance.gc(root, keep=1, grace=3600, now=time.time() + 7200)
    assert _backend_has(root, pack_key(old)) and report.removed_packs == 0
    assert _reads(root, "ns") == {"f0": blobs["f0"], "again": blobs["f3"]}
    assert maintenance.verify(root).problems == []


@pytest.mark.slow
def test_repacking_gc_racing_publishers_keeps_every_kept_row_readable(
    any_root: SharedRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = any_root
    monkeypatch.setattr(marks, "LIST_TTL", 0.0)
    monkeypatch.setattr(root.backend, "staging_entries", lambda: iter(()))
    grace = 4.0  # > LIST_TTL + the longest publication here, as the protocol requires
    stop = threading.Event()
    errors: list[BaseException] = []
    published: list[int] = []
    written: list[tuple[str, bytes, Location]] = []  # every packed member ever written
    reports: list[maintenance.GcReport] = []

    def publisher() -> None:
        rng = random.Random(2)
        r = SharedRoot.open(root.location)  # its own "node"
        gens = r.generations()
        try:
            for g in range(24):
                fresh = [f"gen {g} object {i} ".encode() * (20 + i) for i in range(6)]
                locs = _packed(r, fresh)
                written.extend((digest_bytes(b), b, locs[digest_bytes(b)]) for b in fresh)
                ents = _entries({f"g{g}/new{i}": b for i, b in enumerate(fresh[:2])}, locs)
                # Re-use members of older packs, used or not, moved or not, as a node
                # that read them in a manifest does: only if the pack is there now
                # (what Publisher._present checks; marks cover the rest).
                for j, (_, b, loc) in enumerate(rng.sample(written, 3)):
                    if r.backend.info(pack_key(loc[0])) is not None:
                        ents.append(Entry(f"g{g}/old{j}", digest_bytes(b), len(b), 0o644, 0,
                                          {"pack": list(loc)}))
                seq = gens.publish("race", ents, node="pub").seq
                assert seq is not None
                published.append(seq)
                time.sleep(0.35)
        except BaseException as e:
            errors.append(e)
        finally:
            stop.set()

    def collector() -> None:
        try:
            while not stop.is_set():
                reports.append(maintenance.gc(root, keep=2, grace=grace))
                time.sleep(0.2)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=publisher), threading.Thread(target=collector)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert published == list(range(1, 25))
    reports.append(maintenance.gc(root, keep=2, grace=grace, now=time.time() + 2 * grace))
    # On a loaded machine the collector may have turned only a few times in the race, and
    # a pack this last pass condemned is swept after its grace: one more pass past it
    # (seen in a fresh-clone CI run: repacked, none removed yet).
    reports.append(maintenance.gc(root, keep=2, grace=grace, now=time.time() + 4 * grace))
    # The race did what it is about: packs were repacked and old ones swept.
    assert sum(r.repacked_packs for r in reports) >= 1
    assert sum(r.removed_packs for r in reports) >= 1
    for ns_seq in (23, 24):
        fresh = SharedRoot.open(root.location)
        snap = fresh.generations().entries("race", ns_seq)
        for e in snap.entries.values():  # every kept row still reads, verified
            assert len(fresh.objects.get_bytes(e.digest, e.size)) == e.size
    assert maintenance.verify(root).problems == []


@pytest.mark.expect_log(r"was removed by a concurrent gc: writing it again")
def test_a_pack_a_racing_sweep_removes_is_put_back_after_the_record(
    any_root: SharedRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The publisher rewrote a condemned pack, then a sweep that had judged it before
    the rewrite deletes it anyway: once its record exists, the publisher puts it back."""
    from casfs.store.generations import GenerationStore

    root = any_root
    monkeypatch.setattr(marks, "LIST_TTL", 0.0)
    blobs = {f"f{i}": os.urandom(1500 + i) for i in range(3)}
    locs = _packed(root, list(blobs.values()))
    (pack,) = {loc[0] for loc in locs.values()}
    _age_past_mark_slack()
    assert maintenance.gc(root, keep=1, grace=3600).marked >= 1  # no row names it: marked
    real = GenerationStore._save_condemned

    def racing_sweep(self: GenerationStore, digests: set[str], packs: set[str],
                     ) -> dict[str, bytes | None]:
        saved = real(self, digests, packs)
        root.backend.delete(pack_key(pack))  # the sweep's delete lands after the rewrite
        return saved

    monkeypatch.setattr(GenerationStore, "_save_condemned", racing_sweep)
    pub = SharedRoot.open(root.location)
    assert pub.generations().publish("ns", _entries(blobs, locs), node="b").seq == 1
    assert _backend_has(root, pack_key(pack))
    assert pub.objects.counters.get("packs_restored_after_gc") == 1
    assert _reads(root, "ns") == blobs
