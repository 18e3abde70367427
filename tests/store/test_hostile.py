"""Hostile manifests and generation records: rejected whole, with one clear line, no writes.

The shared root is written by other nodes and other versions and may be
damaged, so these are built by planting crafted manifest objects and records
directly, the way a buggy or malicious writer would.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from casfs.errors import CasfsError, HostileManifestError
from casfs.store import manifest
from casfs.store.generations import MAX_RECORD_BYTES, seq_name
from casfs.store.root import SharedRoot

pytestmark = pytest.mark.expect_log(
    r"rejected object: ",
    r"ignoring damaged gc mark ",
)

GOOD = "a" * 64  # replaced by a real digest in _plant
MTIME = 1_700_000_000_000_000_000


def _root(env: dict[str, Path]) -> SharedRoot:
    return SharedRoot.open(env["root"], create=True)


def _manifest_doc(rows: list[list[Any]], kind: str = "full") -> bytes:
    return json.dumps({"casfs_manifest": 1, "kind": kind, "entries": rows}).encode()


def _record_doc(ns: str, seq: int, parts: list[tuple[str, int, int]], entries: int,
                **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "casfs_generation": 1, "namespace": ns, "seq": seq,
        "parent": seq - 1 if seq > 1 else None,
        "base": {"digest": parts[0][0], "size": parts[0][1], "entries": parts[0][2]},
        "deltas": [{"digest": d, "size": s, "entries": n} for d, s, n in parts[1:]],
        "entries": entries, "bytes": 0, "created": 1.0, "node": "evil",
        "casfs_version": "0", "fingerprint": None,
    }
    doc.update(over)
    return doc


def _write_record(root: SharedRoot, ns: str, seq: int, data: bytes) -> None:
    key = f"namespaces/{ns}/generations/{seq_name(seq)}"
    assert root.backend.create_exclusive(key, data)


def _plant(root: SharedRoot, rows: list[list[Any]], ns: str = "evil") -> None:
    """Store ``rows`` as a manifest object (unvalidated) and a record naming it."""
    content = root.objects.put_bytes(b"payload\n")
    rows = [[r[0], content.digest if r[1] == GOOD else r[1], *r[2:]] for r in rows]
    data = _manifest_doc(rows)
    m = root.objects.put_bytes(data)
    _write_record(root, ns, 1, json.dumps(_record_doc(ns, 1, [(m.digest, m.size, len(rows))],
                                                      len(rows))).encode())


def _row(path: Any, digest: Any = GOOD, size: Any = 8, mode: Any = 0o644,
         mtime: Any = MTIME) -> list[Any]:
    return [path, digest, size, mode, mtime]


HOSTILE_MANIFESTS: dict[str, list[list[Any]]] = {
    "dotdot": [_row("../escape")],
    "dotdot-inner": [_row("a/../../escape")],
    "absolute": [_row("/tmp/escape")],
    "nul": [_row("a\0b")],
    "newline": [_row("a\nb")],
    "escape-char": [_row("a\x1b[31mb")],
    "del-char": [_row("a\x7fb")],
    "dot": [_row("./a")],
    "empty-part": [_row("a//b")],
    "trailing-slash": [_row("a/")],
    "empty": [_row("")],
    "not-a-string": [_row(42)],
    "too-long": [_row("a/" * 3000 + "b")],
    "duplicate": [_row("a"), _row("a")],
    "unsorted": [_row("b"), _row("a")],
    "file-and-dir": [_row("a"), _row("a/b")],
    "bad-digest": [_row("a", digest="../../x")],
    "digest-newline": [_row("a", digest="b" * 64 + "\n")],
    "negative-size": [_row("a", size=-1)],
    "bool-size": [_row("a", size=True)],
    "setuid-bits-ok-but-huge-mode": [_row("a", mode=0o100644)],
    "float-mtime": [_row("a", mtime=1.5)],
    "short-row": [["a", GOOD, 8]],
}


@pytest.mark.parametrize("case", sorted(HOSTILE_MANIFESTS))
def test_hostile_manifest_rejected_by_store_and_cli(
    case: str, casfs_env: dict[str, Path], cli: Callable[..., Any], tmp_path: Path
) -> None:
    root = _root(casfs_env)
    _plant(root, HOSTILE_MANIFESTS[case])
    with pytest.raises(HostileManifestError):
        root.generations().entries("evil")
    outside_before = sorted(os.listdir(tmp_path))
    line = cli("ls", "evil", "-r").assert_clean_error()
    assert "evil@1" in line, line  # names the generation
    dest = tmp_path / "dest"
    cli("export", "evil", dest).assert_clean_error()
    assert not dest.exists() or not any(dest.iterdir())
    assert sorted(p for p in os.listdir(tmp_path) if p != "dest") == outside_before
    assert not Path("/tmp/escape").exists()


def test_verify_names_every_hostile_generation(
    casfs_env: dict[str, Path], cli: Callable[..., Any]
) -> None:
    root = _root(casfs_env)
    cases = ["dotdot", "absolute", "nul", "duplicate", "unsorted", "file-and-dir", "bad-digest"]
    for i, case in enumerate(cases):
        _plant(root, HOSTILE_MANIFESTS[case], ns=f"evil{i}")
    res = cli("verify")
    assert res.rc == 1 and "Traceback" not in res.err
    problems = [ln for ln in res.out.splitlines() if ln.startswith("problem:")]
    assert len(problems) == len(cases), res.out
    for i in range(len(cases)):
        assert any(f"evil{i}@1" in p for p in problems), (i, res.out)
    doc = cli("verify", "--json").json()
    assert doc["ok"] is False and len(doc["problems"]) == len(cases)


@pytest.mark.parametrize("blob,what", [
    (b"{not json", "not valid JSON"),
    (_manifest_doc([_row("a")])[:20], "not valid JSON"),  # truncated
    (b'{"casfs_manifest": 0, "kind": "full", "entries": []}', "not a casfs manifest"),
    (b'{"casfs_manifest": "2", "kind": "full", "entries": []}', "not a casfs manifest"),
    (b'{"casfs_manifest": 1, "kind": "full", "entries": [["a", "' + b"a" * 64
     + b'", 1, 420, 0, {}]]}', "malformed manifest entry"),  # extras need v2
    (b"[" * 200_000, "nested too deeply"),
    (b'{"casfs_manifest": 1, "kind": "weird", "entries": []}', "unknown manifest kind"),
    (b'{"casfs_manifest": 1, "kind": "full", "entries": {}}', "not a list"),
    (b"[1, 2, 3]", "not a casfs manifest"),
    (b"\xff\xfe garbage", "not valid JSON"),
])
def test_garbage_manifest_object(blob: bytes, what: str, root: SharedRoot) -> None:
    with pytest.raises(HostileManifestError, match=what):
        manifest.decode(blob)
    m = root.objects.put_bytes(blob)
    _write_record(root, "ns", 1, json.dumps(_record_doc("ns", 1, [(m.digest, m.size, 1)], 1))
                  .encode())
    with pytest.raises(HostileManifestError):
        root.generations().entries("ns")


def _good_generation(root: SharedRoot, ns: str = "ns") -> tuple[str, int]:
    c = root.objects.put_bytes(b"x")
    m = root.objects.put_bytes(_manifest_doc([_row("a", c.digest, 1)]))
    return m.digest, m.size


RECORD_CASES: dict[str, Callable[[str, int], bytes]] = {
    "garbage": lambda d, s: b"\x00\x01garbage",
    "truncated": lambda d, s: json.dumps(_record_doc("ns", 1, [(d, s, 1)], 1)).encode()[:40],
    "other-seq": lambda d, s: json.dumps(_record_doc("ns", 2, [(d, s, 1)], 1)).encode(),
    "other-namespace": lambda d, s: json.dumps(_record_doc("other", 1, [(d, s, 1)], 1)).encode(),
    "huge": lambda d, s: json.dumps(_record_doc("ns", 1, [(d, s, 1)], 1,
                                                node="x" * (MAX_RECORD_BYTES + 10))).encode(),
    "unknown-version": lambda d, s: json.dumps(
        _record_doc("ns", 1, [(d, s, 1)], 1, casfs_generation=9)).encode(),
    "bad-part-digest": lambda d, s: json.dumps(_record_doc("ns", 1, [("../x", s, 1)], 1)).encode(),
    "missing-manifest": lambda d, s: json.dumps(_record_doc("ns", 1, [("c" * 64, s, 1)], 1))
    .encode(),
    "wrong-part-size": lambda d, s: json.dumps(_record_doc("ns", 1, [(d, s + 1, 1)], 1)).encode(),
    "wrong-entry-count": lambda d, s: json.dumps(_record_doc("ns", 1, [(d, s, 1)], 5)).encode(),
    "part-count-lies": lambda d, s: json.dumps(_record_doc("ns", 1, [(d, s, 3)], 1)).encode(),
    "same-part-twice": lambda d, s: json.dumps(_record_doc("ns", 1, [(d, s, 1), (d, s, 1)], 2))
    .encode(),
    "negative-bytes": lambda d, s: json.dumps(_record_doc("ns", 1, [(d, s, 1)], 1, bytes=-5))
    .encode(),
    "deltas-not-list": lambda d, s: json.dumps(_record_doc("ns", 1, [(d, s, 1)], 1, deltas=7))
    .encode(),
    "base-not-object": lambda d, s: json.dumps(_record_doc("ns", 1, [(d, s, 1)], 1, base=[1]))
    .encode(),
    "manifest-too-large": lambda d, s: json.dumps(
        _record_doc("ns", 1, [(d, manifest.DEFAULT_MAX_MANIFEST_BYTES + 1, 1)], 1)).encode(),
    "not-an-object": lambda d, s: b"[]",
    # Python's json reads NaN; a 4300-digit int overflowed float() (OverflowError, not
    # a CasfsError); sizes and counts past 2**63 are no real record's.
    "created-nan": lambda d, s: json.dumps(_record_doc("ns", 1, [(d, s, 1)], 1,
                                                       created=float("nan"))).encode(),
    "created-huge": lambda d, s: json.dumps(_record_doc("ns", 1, [(d, s, 1)], 1,
                                                        created=10 ** 4000)).encode(),
    "bytes-huge": lambda d, s: json.dumps(_record_doc("ns", 1, [(d, s, 1)], 1,
                                                      bytes=1 << 63)).encode(),
}


@pytest.mark.parametrize("case", sorted(RECORD_CASES))
def test_hostile_record_rejected_by_store_and_cli(
    case: str, casfs_env: dict[str, Path], cli: Callable[..., Any], tmp_path: Path
) -> None:
    root = _root(casfs_env)
    digest, size = _good_generation(root)
    _write_record(root, "ns", 1, RECORD_CASES[case](digest, size))
    with pytest.raises(CasfsError):
        root.generations().entries("ns")
    line = cli("ls", "ns").assert_clean_error()
    assert "ns@1" in line, line  # names the generation
    dest = tmp_path / "dest"
    cli("export", "ns", dest).assert_clean_error()
    assert not dest.exists()
    res = cli("verify")
    assert res.rc == 1 and "Traceback" not in res.err
    # gc must refuse to mark from a damaged kept record, and delete nothing.
    objects_before = sorted(root.objects.iter_digests())
    cli("gc", "--grace", "0").assert_clean_error()
    assert sorted(root.objects.iter_digests()) == objects_before


def test_overlapping_base_and_delta_rejected(root: SharedRoot) -> None:
    c = root.objects.put_bytes(b"x")
    base = root.objects.put_bytes(_manifest_doc([_row("a", c.digest, 1)]))
    delta = root.objects.put_bytes(_manifest_doc([_row("a", c.digest, 1)], "delta"))
    _write_record(root, "ns", 1, json.dumps(
        _record_doc("ns", 1, [(base.digest, base.size, 1), (delta.digest, delta.size, 1)], 1)
    ).encode())
    with pytest.raises(HostileManifestError, match="appears twice"):
        root.generations().entries("ns")


def test_delta_file_clashes_with_base_directory(root: SharedRoot) -> None:
    c = root.objects.put_bytes(b"x")
    base = root.objects.put_bytes(_manifest_doc([_row("a/b", c.digest, 1)]))
    delta = root.objects.put_bytes(_manifest_doc([_row("a", c.digest, 1)], "delta"))
    _write_record(root, "ns", 1, json.dumps(
        _record_doc("ns", 1, [(base.digest, base.size, 1), (delta.digest, delta.size, 1)], 2)
    ).encode())
    with pytest.raises(HostileManifestError, match="file and a directory"):
        root.generations().entries("ns")


def test_stray_names_in_generations_dir_are_ignored(root: SharedRoot) -> None:
    digest, size = _good_generation(root)
    _write_record(root, "ns", 1, json.dumps(_record_doc("ns", 1, [(digest, size, 1)], 1)).encode())
    gdir = root.path / "namespaces/ns/generations"
    (gdir / "000000000002.tmp").write_text("junk")
    (gdir / "2").write_text("junk")
    (root.path / "namespaces" / "bad name").mkdir()
    gens = root.generations()
    assert gens.seqs("ns") == [1]
    assert gens.namespaces() == ["ns"]
    assert set(gens.entries("ns").entries) == {"a"}


def test_export_refuses_symlink_destination_tricks(
    casfs_env: dict[str, Path], cli: Callable[..., Any], tmp_path: Path
) -> None:
    root = _root(casfs_env)
    digest, size = _good_generation(root)
    _write_record(root, "ns", 1, json.dumps(_record_doc("ns", 1, [(digest, size, 1)], 1)).encode())
    victim = tmp_path / "victim"
    victim.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "a").symlink_to(victim / "a")  # planted: a non-empty destination is refused
    cli("export", "ns", dest).assert_clean_error()
    assert not (victim / "a").exists()


def test_export_drops_setuid_bits_from_a_manifest(root: SharedRoot, tmp_path: Path) -> None:
    c = root.objects.put_bytes(b"#!/bin/sh\n")
    m = root.objects.put_bytes(_manifest_doc([_row("run.sh", c.digest, 10, mode=0o6755)]))
    _write_record(root, "ns", 1, json.dumps(_record_doc("ns", 1, [(m.digest, m.size, 1)], 1))
                  .encode())
    from casfs.store.export import export_tree

    rep = export_tree(root, root.generations().resolve("ns", None), tmp_path / "out")
    assert rep.failed == []
    assert (tmp_path / "out/run.sh").stat().st_mode & 0o7777 == 0o755


def test_nested_json_in_a_gc_mark_a_pack_index_and_a_profile_is_damage(tmp_path: Path) -> None:
    """200 KB of '[' (under every size cap) in the JSON that gc marks, pack indexes and
    access profiles hold is damage like any other, not a RecursionError escaping gc,
    verify, or a mount's prefetch (issue 8 item 1, beyond records and manifests)."""
    import time

    import blake3
    import zstandard

    from casfs.store import maintenance, profile
    from casfs.store.packs import FOOTER, PACK_MAGIC, pack_key

    root = SharedRoot.open(tmp_path / "root", create=True)
    nested = zstandard.ZstdCompressor().compress(b"[" * 200_000)
    assert root.backend.create_exclusive(f"gc/marks/{int(time.time()) - 10:012d}-{'0' * 32}",
                                         nested)
    raw = nested + FOOTER.pack(PACK_MAGIC, 0)
    pack = blake3.blake3(raw).hexdigest()
    assert root.backend.create_exclusive(pack_key(pack), raw)
    os.mkfifo(root.path / "gc" / "marks" / f"{int(time.time()) - 9:012d}-{'1' * 32}")
    maintenance.gc(root, keep=1, grace=0)  # the marks are ignored (logged), not a crash
    assert any(pack in p and "bad index" in p for p in maintenance.verify(root).problems)
    with pytest.raises(ValueError, match="nested"):
        profile.decode(b"[" * 200_000)


def test_a_record_of_many_or_huge_parts_is_refused_before_any_is_read() -> None:
    """A record under its 1 MiB bound could list ~10,000 deltas, each manifest just under
    its own bound: all decoded and merged in memory (8 of 58 MiB each put a mount process
    at 4 GB, found by a review on 2026-12-06). Refused from the record alone."""
    from casfs.store.record import MAX_DELTAS, MAX_PARTS_FACTOR, parse_record

    digests = [f"{i:064x}" for i in range(MAX_DELTAS + 2)]
    many = _record_doc("ns", 1, [(d, 100, 1) for d in digests], len(digests))
    with pytest.raises(HostileManifestError, match="delta manifests"):
        parse_record(json.dumps(many).encode(), "ns", 1)
    big = manifest.max_manifest_bytes() - 1
    huge = _record_doc("ns", 1, [(d, big, 1) for d in digests[:MAX_PARTS_FACTOR + 1]],
                       MAX_PARTS_FACTOR + 1)
    with pytest.raises(HostileManifestError, match="add up to"):
        parse_record(json.dumps(huge).encode(), "ns", 1)
    # A genuine shape is read: a base at the bound and a delta beside it.
    fine = _record_doc("ns", 1, [(digests[0], big, 1), (digests[1], 1000, 1)], 2)
    assert len(parse_record(json.dumps(fine).encode(), "ns", 1).deltas) == 1


def test_a_gc_mark_bomb_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    """A planted mark of 5.6 KB zstd, 64 MiB of ``{"digests":[[],[],...]}``, put every
    publisher at ~1.6 GB (json.loads: ~24x the decompressed size; found by a review).
    Marks are now streamed as exactly the shape gc writes: such a mark is damage, read in
    a few MiB; legitimate marks, of either format, still name what they mark."""
    import time
    import tracemalloc

    import zstandard

    from casfs.store import marks

    root = SharedRoot.open(tmp_path / "root", create=True)
    t = int(time.time()) - 10
    n = (8 << 20) // 3  # 8 MiB of JSON: ~200 MB in json.loads, enough to tell
    head = b'{"casfs_gc_mark": 1, "created": 1.5, "digests": ['
    for i, doc in enumerate((b'{"digests":[' + b"[]," * n + b"[]]}",  # the review's
                             head + b"[]," * n + b"[]]}")):  # behind a real header
        bomb = zstandard.ZstdCompressor(level=19).compress(doc)
        assert len(bomb) < 16_000
        assert root.backend.create_exclusive(f"gc/marks/{t:012d}-{i:032x}", bomb)
    tracemalloc.start()
    try:
        read = list(marks.load_all(root.backend))  # what gc reads
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        condemned = marks.Condemned(root.backend).among({"0" * 64})  # publishers
        peak = max(peak, tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"reading the marks peaked at {peak >> 20} MiB"
    assert read == [] and condemned == set()

    # Legitimate marks: written now, and of the format before packs.
    a, b, c, p = (f"{i:064x}" for i in (1, 2, 3, 4))
    marks.write(root.backend, [b, a], time.time(), [p])
    old = json.dumps({"casfs_gc_mark": 1, "created": 1700000000.25, "digests": [c]})
    assert root.backend.create_exclusive(f"gc/marks/{t:012d}-{'e' * 32}",
                                         zstandard.ZstdCompressor().compress(old.encode()))
    read = list(marks.load_all(root.backend))  # the bombs stay damage
    assert sorted((sorted(m.digests), sorted(m.packs)) for m in read) == [
        ([a, b], [p]), ([c], [])]
    assert marks.Condemned(root.backend).among({a, c, p, "f" * 64}) == {a, c, p}


@pytest.mark.expect_log(r"read again at each publication")
def test_gc_splits_big_marks_and_publishers_read_marks_over_their_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gc writes marks no reader refuses (MARK_NAMES each); names over what a publisher
    holds are read again at each publication, never ignored: gc acts on them."""
    import time

    from casfs.store import marks

    monkeypatch.setattr(marks, "MARK_NAMES", 3)
    monkeypatch.setattr(marks, "MAX_MARK_NAMES", 6)
    monkeypatch.setattr(marks, "MAX_HELD_NAMES", 4)
    root = SharedRoot.open(tmp_path / "root", create=True)
    ds = [f"{i:064x}" for i in range(1, 8)]
    assert len(marks.write(root.backend, ds[:5], time.time(), ds[5:])) == 3
    read = list(marks.load_all(root.backend))
    assert sorted(d for m in read for d in m.digests) == ds[:5]
    assert sorted(d for m in read for d in m.packs) == ds[5:]
    condemned = marks.Condemned(root.backend)
    assert condemned.among({*ds, "f" * 64}) == set(ds)
    assert condemned.among({ds[6]}) == {ds[6]}
    big = max(read, key=lambda m: len(m.digests) + len(m.packs))
    with pytest.raises(marks.MarkTooLargeError, match="over 2 names"), root.backend.open(
            f"{marks.PREFIX}/{big.name}") as f:
        marks._parse(f, 2)
    # Marks over what a publisher holds at all (a mark of the release before the split,
    # of up to ~15.8 Mi names), of the written shape: honoured all the same, streamed
    # against each publication's names (a review: ignored, the object a publisher re-used
    # was swept by that release's gc); gc reads them whole
    monkeypatch.setattr(marks, "MAX_MARK_NAMES", 2)
    fresh = marks.Condemned(root.backend)
    assert fresh.among({*ds, "f" * 64}) == set(ds)
    assert len(fresh._unheld) == 2  # the two of 3 names; the one of 1 is held
    assert sorted(d for m in marks.load_all(root.backend) for d in m.digests) == ds[:5]


_HEAD = '{"casfs_gc_mark": 1, "created": 1, "digests": ['


@pytest.mark.parametrize("doc", [
    _HEAD + f'"{"b" * 64}", "{"a" * 64}"]}}',  # not sorted
    _HEAD + f'"{"A" * 64}"]}}',
    _HEAD + f'"{"a" * 64}"]}} ',  # anything after the end
    _HEAD + f'"{"a" * 64}", ]}}',
    _HEAD + '], "packs": [[]]}',
    _HEAD + '], "x": 1}',
])
def test_a_gc_mark_not_of_the_written_shape_is_damage(doc: str) -> None:
    import io

    import zstandard

    from casfs.store import marks

    good = _HEAD + f'"{"a" * 64}"], "packs": []}}'
    assert marks._parse(io.BytesIO(zstandard.ZstdCompressor().compress(good.encode())))
    with pytest.raises(marks.DamagedMarkError):
        marks._parse(io.BytesIO(zstandard.ZstdCompressor().compress(doc.encode())))


@pytest.mark.expect_log(r"ignoring damaged gc mark")
def test_a_damaged_gc_mark_is_read_once_while_it_stays_the_same(tmp_path: Path) -> None:
    """A planted bomb (or any damaged mark) is not read again at each listing (a review:
    1.1-1.7 s a refresh, every 30 s); one replaced under its name is read again."""
    import time

    import zstandard

    from casfs.store import marks

    root = SharedRoot.open(tmp_path / "root", create=True)
    name = f"{int(time.time()):012d}-{'0' * 32}"
    key = f"{marks.PREFIX}/{name}"
    root.backend.create_exclusive(key, zstandard.ZstdCompressor().compress(b"[[]]"))
    opened: list[str] = []
    real_open = root.backend.open

    def counting_open(k: str):  # type: ignore[no-untyped-def]
        opened.append(k)
        return real_open(k)

    root.backend.open = counting_open  # type: ignore[method-assign]
    condemned = marks.Condemned(root.backend, ttl=0)
    d = "a" * 64
    for _ in range(3):
        assert condemned.among({d}) == set()
    assert opened == [key]
    time.sleep(1.1)  # a new identity (mtime), the shape a gc writes
    (tmp_path / "root" / key).write_bytes(zstandard.ZstdCompressor().compress(
        ('{"casfs_gc_mark": 1, "created": 1, "digests": ["' + d + '"]}').encode()))
    assert condemned.among({d}) == {d}


@pytest.mark.expect_log(r"gc mark \S+: over \d+ names, or past the \d+ held")
@pytest.mark.parametrize("scale", [2, 64])
def test_an_unsplit_mark_of_the_release_before_is_honoured_by_publishers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scale: int) -> None:
    """A mark of the written shape past what a publisher holds (the release before the
    split wrote one of up to ~15.8 Mi names), every bound scaled as in production: gc
    reads it whole and sweeps by it, so publishers must learn its names (a review: the
    held byte bound refused it as damage first, and cached that)."""
    import time

    from casfs.store import marks

    monkeypatch.setattr(marks, "MAX_MARK_NAMES", scale)
    monkeypatch.setattr(marks, "MAX_MARK_BYTES", marks._HEAD_MAX + 32 + scale * marks._NAME_JSON)
    monkeypatch.setattr(marks, "MAX_MARK_RAW", marks.MAX_MARK_BYTES)
    monkeypatch.setattr(marks, "MARK_NAMES", 10 * scale)  # the release before the split
    root = SharedRoot.open(tmp_path / "root", create=True)
    ds = [f"{i:064x}" for i in range(1, 3 * scale)]
    assert len(marks.write(root.backend, ds, time.time())) == 1
    assert sorted(d for m in marks.load_all(root.backend) for d in m.digests) == ds
    condemned = marks.Condemned(root.backend, ttl=0)
    assert condemned.among({ds[0], ds[-1]}) == {ds[0], ds[-1]}
    assert not condemned._damaged
