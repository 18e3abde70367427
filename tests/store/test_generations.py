"""Generations: publication, merge rule, dedup on import, delta cost, compaction, quota."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from casfs.errors import PublishError, QuotaExceededError
from casfs.families import rules as family_rules
from casfs.promote.importer import import_tree
from casfs.store.entry import Entry
from casfs.store.generations import COMPACT_DELTAS, GenerationStore, check_name
from casfs.store.record import seq_name
from casfs.store.root import SharedRoot


def store_files(root: SharedRoot, files: dict[str, bytes], mode: int = 0o644) -> list[Entry]:
    out = []
    for path, data in sorted(files.items()):
        res = root.objects.put_bytes(data)
        out.append(Entry(path, res.digest, res.size, mode, 1_700_000_000_000_000_000))
    return out


def all_files(root: SharedRoot) -> dict[str, int]:
    """relpath -> size of every file under the shared root."""
    out = {}
    for dirpath, _, names in os.walk(root.path):
        for n in names:
            p = Path(dirpath) / n
            out[str(p.relative_to(root.path))] = p.stat().st_size
    return out


def make_tree(base: Path, n: int = 50, seed: int = 0) -> Path:
    rng = random.Random(seed)
    for i in range(n):
        p = base / f"d{i % 7}" / f"k{i}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(f"def kernel_{i}():\n    return {i}\n".encode() * (1 + i % 20))
        if i % 5 == 0:
            (base / f"d{i % 7}" / f"k{i}.so").write_bytes(rng.randbytes(2000 + i))
    return base


def test_first_publish_and_read_back(root: SharedRoot) -> None:
    gens = root.generations()
    entries = store_files(root, {"a/x": b"x", "a/y": b"yy", "b": b"bbb"})
    res = gens.publish("ns", entries, node="n1")
    assert res.seq == 1 and res.added == 3 and res.added_bytes == 6
    rec = gens.resolve("ns", None)
    assert rec.seq == 1 and rec.parent is None and rec.entries == 3 and rec.logical_bytes == 6
    assert rec.node == "n1"
    snap = gens.entries("ns")
    assert snap.entries == {e.path: e for e in entries}
    assert snap.dirs == {"a"}
    # The record file sits where docs/format.md ("Shared root") says, zero-padded.
    assert (root.path / "namespaces/ns/generations/000000000001").is_file()


def test_publish_nothing_new_writes_nothing(root: SharedRoot) -> None:
    gens = root.generations()
    entries = store_files(root, {"a": b"1"})
    gens.publish("ns", entries, node="n")
    before = all_files(root)
    res = gens.publish("ns", entries, node="n")
    assert res.seq == 1 and res.added == 0 and res.already == 1
    assert all_files(root) == before


def test_first_writer_wins_and_conflicts_are_counted(root: SharedRoot) -> None:
    gens = root.generations()
    gens.publish("ns", store_files(root, {"k/a": b"first", "k/b": b"b"}), node="n1")
    res = gens.publish("ns", store_files(root, {"k/a": b"second", "k/c": b"c"}), node="n2")
    assert res.conflicts == 1 and res.conflict_paths == ["k/a"] and res.added == 1
    snap = gens.entries("ns")
    assert root.objects.get_bytes(snap.entries["k/a"].digest) == b"first"
    assert set(snap.entries) == {"k/a", "k/b", "k/c"}


def test_file_directory_clash_is_a_conflict_not_a_bad_generation(root: SharedRoot) -> None:
    gens = root.generations()
    gens.publish("ns", store_files(root, {"a/b": b"1"}), node="n")
    res = gens.publish("ns", store_files(root, {"a": b"file", "a/b/c": b"deeper", "z": b"z"}),
                       node="n")
    assert res.conflicts == 2 and res.added == 1
    assert set(gens.entries("ns").entries) == {"a/b", "z"}


def test_local_deletions_are_not_published(root: SharedRoot) -> None:
    gens = root.generations()
    gens.publish("ns", store_files(root, {"a": b"1", "b": b"2"}), node="n")
    gens.publish("ns", store_files(root, {"c": b"3"}), node="n")  # a and b "deleted" locally
    assert set(gens.entries("ns").entries) == {"a", "b", "c"}
    assert set(gens.entries("ns", 1).entries) == {"a", "b"}  # old generations stay readable


@pytest.mark.parametrize("name", ["", "a/b", "..", ".hidden", "a b", "x" * 129, "ns\n"])
def test_bad_namespace_names(name: str) -> None:
    with pytest.raises(Exception) as ei:
        check_name(name)
    assert "invalid namespace name" in str(ei.value)


# --- import dedup ---------------------------------------------------------------
def test_second_import_of_same_tree_adds_nothing(root: SharedRoot, tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    rules = family_rules("generic")
    first = import_tree(root, src, "ns", rules=rules, node="n")
    assert first.publish is not None and first.publish.seq == 1
    assert first.new_objects == first.files > 0
    before = all_files(root)
    second = import_tree(root, src, "ns", rules=rules, node="n")
    assert second.new_objects == 0
    assert second.publish is not None
    assert second.publish.added == 0 and second.publish.already == first.files
    assert second.publish.seq == 1
    assert all_files(root) == before  # no new object, manifest or record


def test_identical_trees_under_two_namespaces_share_file_objects(
    root: SharedRoot, tmp_path: Path
) -> None:
    src = make_tree(tmp_path / "src")
    rules = family_rules("generic")
    import_tree(root, src, "one", rules=rules, node="n")
    objects_before = set(root.objects.iter_digests())
    rep = import_tree(root, src, "two", rules=rules, node="n")
    new = set(root.objects.iter_digests()) - objects_before
    assert rep.new_objects == 0
    # Even the manifest is the same object (content-addressed): nothing new at all.
    assert len(new) <= 1
    assert len(list((root.path / "namespaces/two/generations").iterdir())) == 1


def test_import_skips_scratch_and_keeps_modes(root: SharedRoot, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "ab").mkdir(parents=True)
    (src / "ab" / "c.py").write_text("x = 1\n")
    (src / "ab" / "c.so").write_bytes(b"\x7fELF" + bytes(100))
    os.chmod(src / "ab" / "c.so", 0o755)
    (src / "ab" / ".123.456.tmp").write_text("partial")
    (src / "locks").mkdir()
    (src / "locks" / "x.lock").write_text("")
    (src / "empty").mkdir()
    rep = import_tree(root, src, "ns", rules=family_rules("inductor"), node="n")
    snap = root.generations().entries("ns")
    assert set(snap.entries) == {"ab/c.py", "ab/c.so"}
    assert snap.entries["ab/c.so"].mode == 0o755
    assert rep.skipped_scratch >= 2


# --- delta publication cost and compaction ---------------------------------------------
BIG = 100_000


@pytest.fixture(scope="module")
def big_base(tmp_path_factory: pytest.TempPathFactory) -> tuple[SharedRoot, list[Entry]]:
    """A namespace with 100,000 entries (sharing a few objects: cost is in the manifest)."""
    root = SharedRoot.open(tmp_path_factory.mktemp("big") / "root", create=True)
    blobs = [root.objects.put_bytes(f"blob {i}".encode() * 40) for i in range(16)]
    entries = [
        Entry(f"fxgraph/{i % 256:02x}/f{i:06d}/entry", blobs[i % 16].digest, blobs[i % 16].size,
              0o644, 1_700_000_000_000_000_000 + i)
        for i in range(BIG)
    ]
    res = root.generations().publish("big", entries, node="n")
    assert res.seq == 1 and res.added == BIG
    return root, entries


def test_publishing_10_files_on_100k_writes_a_small_delta(
    big_base: tuple[SharedRoot, list[Entry]],
) -> None:
    root, base_entries = big_base
    gens = root.generations()
    latest = gens.resolve("big", None)
    files_before = all_files(root)
    new = store_files(root, {f"new/{latest.seq}/f{i}.py": f"new {latest.seq} {i}".encode()
                             for i in range(10)})
    after_objects = all_files(root)
    res = gens.publish("big", new, node="n")
    assert res.added == 10
    rec = gens.resolve("big", None)
    assert rec.seq == latest.seq + 1
    written = {k: v for k, v in all_files(root).items() if k not in after_objects}
    manifest_keys = [k for k in written if k.startswith("objects/")]
    record_keys = [k for k in written if k.startswith("namespaces/")]
    assert len(record_keys) == 1 and len(manifest_keys) == 1, written
    assert sum(written[k] for k in manifest_keys) < 10_000, written
    assert sum(written.values()) < 20_000, written
    assert rec.base == latest.base  # the 100k base was not rewritten
    assert len(rec.deltas) == len(latest.deltas) + 1
    assert len(files_before) < len(after_objects)
    snap = root.generations().entries("big")  # fresh store: no cached parts
    assert len(snap.entries) == rec.entries == len(base_entries) + 10 * (rec.seq - 1)


@pytest.mark.slow
def test_compaction_after_compact_deltas_publications(
    big_base: tuple[SharedRoot, list[Entry]],
) -> None:
    root, _ = big_base
    gens = root.generations()
    start = gens.resolve("big", None)
    expected = dict(gens.snapshot(start).entries)
    compacted_at = None
    for i in range(COMPACT_DELTAS + 1):
        rec_before = gens.resolve("big", None)
        new = store_files(root, {f"c/{i}/f{j}": f"c {i} {j}".encode() for j in range(3)})
        gens.publish("big", new, node="n")
        expected.update({e.path: e for e in new})
        rec = gens.resolve("big", None)
        assert len(rec.deltas) < COMPACT_DELTAS
        if rec.base != rec_before.base:
            compacted_at = i
            assert rec.deltas == ()
            assert rec.base is not None and rec.base.entries == rec.entries
            break
    assert compacted_at is not None, "no compaction within COMPACT_DELTAS publications"
    fresh = SharedRoot.open(root.path).generations()
    assert fresh.entries("big").entries == expected


def test_large_delta_triggers_compaction(root: SharedRoot) -> None:
    gens = root.generations()
    gens.publish("ns", store_files(root, {f"a{i}": b"x" for i in range(10)}), node="n")
    res = gens.publish("ns", [Entry(f"b{i}", e.digest, e.size, 0o644, 0)
                              for i, e in enumerate(store_files(root, {"x": b"y"}) * 2000)],
                       node="n")
    assert res.added == 2000
    rec = gens.resolve("ns", None)
    assert rec.deltas == () and rec.base is not None and rec.base.entries == 2010


# --- byte bound --------------------------------------------------------------------
def test_quota_stops_publication_and_publishes_nothing(root: SharedRoot) -> None:
    gens = root.generations()
    gens.publish("ns", store_files(root, {"a": bytes(600)}), node="n", max_bytes=1000)
    objects_before = set(root.objects.iter_digests())
    new = store_files(root, {"b": b"b" * 600})
    objects_with_new = set(root.objects.iter_digests())
    with pytest.raises(QuotaExceededError) as ei:
        gens.publish("ns", new, node="n", max_bytes=1000)
    assert isinstance(ei.value, PublishError)
    assert "nothing was published" in str(ei.value)
    assert gens.seqs("ns") == [1]
    assert set(gens.entries("ns").entries) == {"a"}
    # No manifest part was stored for the refused publication.
    assert set(root.objects.iter_digests()) == objects_with_new
    assert len(objects_with_new - objects_before) == 1
    # Another namespace is not affected by this one's bound.
    assert gens.publish("other", new, node="n", max_bytes=1000).seq == 1


def test_quota_applies_to_import(root: SharedRoot, tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    with pytest.raises(QuotaExceededError):
        import_tree(root, src, "ns", rules=family_rules("generic"), node="n", max_bytes=100)
    assert root.generations().seqs("ns") == []


# the faked lost races leave no record 1 behind, which the next read takes for a rollback
@pytest.mark.expect_log(r"rolled back: namespace ns: generation 1, read before, is gone")
def test_publish_gives_up_after_bounded_attempts(
    root: SharedRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    gens = root.generations()
    monkeypatch.setattr(gens.backend, "create_exclusive", lambda key, data: False)
    monkeypatch.setattr("casfs.store.generations.time.sleep", lambda s: None)
    with pytest.raises(PublishError, match="lost the publication race 3 times"):
        gens.publish("ns", store_files(root, {"a": b"1"}), node="n", max_attempts=3)


@pytest.mark.parametrize("lagging", [False, True])
def test_a_store_records_behind_lists_them_instead_of_a_head_each(
    root: SharedRoot, monkeypatch: pytest.MonkeyPatch, lagging: bool
) -> None:
    """On an object store, a node 17 records behind (a refresh; a publisher that lost a
    race to a fleet's others) finds the newest in 4 HEADs and a LIST, not 18 HEADs in a
    row; a LIST that lags behind the creates is probed past, one HEAD each."""
    a = root.generations()
    for i in range(20):
        a.publish("ns", store_files(root, {f"k{i}": b"%d" % i}), node="a")
    b = GenerationStore(SharedRoot.open(root.path))
    backend = b.backend
    heads: list[int] = []
    lists: list[str] = []
    info, list_after = backend.info, backend.list_after
    monkeypatch.setattr(backend, "remote", True)
    monkeypatch.setattr(backend, "info", lambda k: heads.append(int(k.rsplit("/", 1)[1]))
                        or info(k))
    monkeypatch.setattr(backend, "list_after", lambda p, after: lists.append(after) or (
        iter(()) if lagging else list_after(p, after)))
    assert b.latest_seq("ns", hint=3) == 20
    assert lists == [seq_name(5)]
    assert heads == ([3, 4, 5, *range(6, 22)] if lagging else [3, 4, 5, 21])


def test_generation_store_sees_other_writers(root: SharedRoot) -> None:
    a = root.generations()
    b = GenerationStore(SharedRoot.open(root.path))
    a.publish("ns", store_files(root, {"a": b"1"}), node="a")
    b.publish("ns", store_files(root, {"b": b"2"}), node="b")
    res = a.publish("ns", store_files(root, {"c": b"3"}), node="a")
    assert res.seq == 3
    assert set(a.entries("ns").entries) == {"a", "b", "c"}


def test_a_generations_manifest_parts_are_read_at_once(root: SharedRoot) -> None:
    """A base and its deltas are a GET each: a fresh node reads them all at once, not
    one round trip after another before its mount can serve (issue 23)."""
    import threading
    import time

    gens = root.generations()
    expected: dict[str, Entry] = {}
    for i in range(5):  # a base and four deltas
        new = store_files(root, {f"k{i}/f{j}": f"k {i} {j}".encode() for j in range(3)})
        gens.publish("ns", new, node="n")
        expected.update({e.path: e for e in new})
    fresh = SharedRoot.open(root.path)
    rec = fresh.generations().resolve("ns", None)
    assert len(rec.parts) == 5
    parts = {p.digest for p in rec.parts}
    lock = threading.Lock()
    now = most = 0
    real = fresh.objects.get_bytes

    def slow(digest: str, *a: object, **kw: object) -> bytes:
        nonlocal now, most
        if digest not in parts:
            return real(digest, *a, **kw)  # type: ignore[arg-type]
        with lock:
            now += 1
            most = max(most, now)
        time.sleep(0.2)  # a round trip
        with lock:
            now -= 1
        return real(digest, *a, **kw)  # type: ignore[arg-type]

    fresh.objects.get_bytes = slow  # type: ignore[method-assign]
    snap = fresh.generations().entries("ns")
    assert snap.entries == expected
    assert most == 5, most


def test_a_listing_read_beside_the_marker_stands_for_the_first_list_once(
        root: SharedRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    """``seed_listing``: a LIST a mount read beside the root's marker is its first
    ``seqs`` (no second LIST), once, and only while fresh."""
    from casfs.store import generations

    gens = root.generations()
    gens.publish("ns", store_files(root, {"a": b"1"}), node="n1")
    planted = [generations.seq_name(7)]  # what only the seeded listing says
    gens.seed_listing("ns", GenerationStore.list_names(root.backend, "ns") + planted)
    assert gens.seqs("ns") == [1, 7]
    assert gens.seqs("ns") == [1]  # taken once: the next one lists the root
    monkeypatch.setattr(generations, "LISTING_FRESH", 0.0)
    gens.seed_listing("ns", planted)
    assert gens.seqs("ns") == [1]  # stale: listed again


def test_an_s3_open_reads_beside_its_marker(s3_url: str) -> None:
    """``SharedRoot.open(beside=)``: the caller's first read runs on the root's backend
    while the marker is read; its result is ``root.beside``, and a failure of it is
    nothing but a None (the caller reads again itself)."""
    SharedRoot.open(s3_url, create=True)
    seen: list[object] = []

    def first(backend: object) -> list[str]:
        seen.append(backend)
        return ["listed"]

    root = SharedRoot.open(s3_url, beside=first)
    assert root.beside == ["listed"] and len(seen) == 1

    def broken(backend: object) -> object:
        raise OSError("reset by peer")

    assert SharedRoot.open(s3_url, beside=broken).beside is None


def test_a_publication_builds_on_the_newest_the_mount_found(root: SharedRoot) -> None:
    """The mount process sends the promotion worker the newest generation it found and
    when (note_newest): the publication creates the next record without a LIST or a HEAD
    for it; an answer older than PUBLISH_FRESH, or from the future, is not taken; a stale
    one (another node published meanwhile) costs a retry, never an entry."""
    import time

    from casfs.store import generations as gmod

    root.generations().publish("ns", store_files(root, {"a": b"1"}), node="other")
    other = root.generations()
    worker = GenerationStore(SharedRoot.open(root.path))
    looked: list[str] = []
    backend = worker.backend
    real_list, real_info = backend.list, backend.info

    def counting_list(prefix: str) -> list[str]:
        looked.append(f"list {prefix}")
        return real_list(prefix)

    def counting_info(key: str) -> object:
        if "/generations/" in key:
            looked.append(f"head {key}")
        return real_info(key)

    backend.list = counting_list  # type: ignore[method-assign]
    backend.info = counting_info  # type: ignore[method-assign]
    worker.note_newest("ns", 1, time.monotonic() + 60)  # the future: not taken
    assert worker.newest_known("ns") is None
    worker.note_newest("ns", 1, time.monotonic() - gmod.PUBLISH_FRESH - 1)  # too old
    assert worker.publish("ns", store_files(root, {"b": b"2"}), node="n").seq == 2
    assert [x for x in looked if "generations" in x], looked  # it looked
    looked.clear()
    other.publish("ns", store_files(root, {"c": b"3"}), node="other")  # seq 3
    worker.note_newest("ns", 3, time.monotonic())
    assert worker.publish("ns", store_files(root, {"d": b"4"}), node="n").seq == 4
    assert not [x for x in looked if "generations" in x], looked
    # Stale: the mount last saw 4, another node published 5 since.
    other.publish("ns", store_files(root, {"e": b"5"}), node="other")
    worker.note_newest("ns", 4, time.monotonic())
    assert worker.publish("ns", store_files(root, {"f": b"6"}), node="n").seq == 6
    assert set(SharedRoot.open(root.path).generations().entries("ns").entries) == \
        {"a", "b", "c", "d", "e", "f"}


def test_a_record_read_by_the_mount_is_taken_by_its_worker(root: SharedRoot) -> None:
    """known_record / note_record: the mount process hands the served record to its
    promotion worker, which then reads it nowhere; what does not parse is refused."""
    from casfs.errors import CasfsError

    gens = root.generations()
    gens.publish("ns", store_files(root, {"a": b"1"}), node="n")
    reader = GenerationStore(SharedRoot.open(root.path))
    assert reader.known_record("ns", 1) is None
    rec = reader.record("ns", 1)
    data = reader.known_record("ns", 1)
    assert data is not None
    worker = GenerationStore(SharedRoot.open(root.path))
    worker.note_record("ns", 1, data)

    def no_reads(key: str) -> object:
        raise AssertionError(f"read {key}")

    worker.backend.open = no_reads  # type: ignore[method-assign]
    got = worker.record("ns", 1, cached=True)
    assert (got.seq, got.parts, got.options) == (rec.seq, rec.parts, rec.options)
    with pytest.raises((CasfsError, ValueError)):
        worker.note_record("ns", 2, b'{"not": "a record"}')
    with pytest.raises((CasfsError, ValueError)):
        worker.note_record("ns", 2, data)  # another seq's record: refused


def test_a_part_evicted_by_another_thread_while_found_is_no_error(
        root: SharedRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parsed-parts cache is shared by threads reading parts at once (the miss
    causes' namespaces): another thread's read evicting the part this one just found
    waits for the cache's lock, instead of making this one's update fail (KeyError)."""
    import threading
    from collections import OrderedDict
    from typing import Any

    from casfs.store import generations

    gens = root.generations()
    parts = []
    for ns in ("pa", "pb"):
        put = root.objects.put_bytes(ns.encode())
        gens.publish(ns, [Entry("k/x", put.digest, put.size, 0o644, 1)], node="n")
        parts += gens.record(ns, 1).parts
    monkeypatch.setattr(generations, "PART_CACHE_ENTRIES", 1)  # an insert evicts the other
    evicted = threading.Event()
    other: list[threading.Thread] = []

    class Racy(OrderedDict):  # type: ignore[type-arg]
        armed = False

        def get(self, key: Any, default: Any = None) -> Any:
            found = super().get(key, default)
            if found is not None and self.armed:  # found: now another thread reads one
                self.armed = False
                t = threading.Thread(target=lambda: (gens.part_entries(parts[1]),
                                                     evicted.set()))
                other.append(t)
                t.start()
                evicted.wait(1.0)  # its eviction of this part, unless a lock holds it off
            return found

    gens._parts = Racy()
    gens.part_entries(parts[0])
    gens._parts.armed = True
    assert [e.path for e in gens.part_entries(parts[0])] == ["k/x"]
    other[0].join(10)
    assert evicted.is_set() and list(gens._parts) == [parts[1].digest]


def test_a_manifest_over_what_readers_take_is_never_published(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Readers skip a generation whose manifest is over CASFS_MAX_MANIFEST_BYTES, the
    publishing node's own mount too, which then promoted its files again for ever (a
    review, 2026-12-06: the promotion worker every tenant shares replaced in a loop).
    The publisher refuses it, naming the namespace and the variable."""
    root = SharedRoot.open(tmp_path / "root", create=True)
    gens = root.generations()
    put = root.objects.put_bytes(b"k")

    def entries(n: int, at: int = 0) -> list[Entry]:
        return [Entry(f"{'d' * 200}/{i:05d}", put.digest, put.size, 0o644, 1)
                for i in range(at, at + n)]

    gens.publish("ns", entries(10), node="n")
    monkeypatch.setenv("CASFS_MAX_MANIFEST_BYTES", str(16 << 10))
    with pytest.raises(QuotaExceededError, match=r"namespace ns: a (full|delta) manifest of"
                       r" \d+ entries would be \d+ bytes, over the 16384 .*"
                       r"CASFS_MAX_MANIFEST_BYTES"):
        gens.publish("ns", entries(200, 10), node="n")
    fresh = SharedRoot.open(tmp_path / "root").generations()
    assert fresh.latest("ns") is not None and fresh.latest("ns").seq == 1  # type: ignore[union-attr]
    gens.publish("ns", entries(5, 300), node="n")  # small enough: published
    assert SharedRoot.open(tmp_path / "root").generations().latest("ns").seq == 2  # type: ignore[union-attr]
