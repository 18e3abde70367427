"""Pack objects (casfs.store.packs) on both backends: small objects stored together, read by
byte range and verified like loose ones; import, export, verify, du and gc understand them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from casfs.errors import CorruptObjectError, ObjectMissingError
from casfs.families import rules
from casfs.promote.importer import import_tree
from casfs.store import maintenance, marks
from casfs.store.export import export_tree
from casfs.store.objects import digest_bytes
from casfs.store.packs import PackWriter, iter_packs, pack_key, read_pack
from casfs.store.root import SharedRoot


@pytest.fixture(params=["local", "s3"])
def any_root(request: pytest.FixtureRequest, tmp_path: Path) -> SharedRoot:
    if request.param == "s3":
        return SharedRoot.open(request.getfixturevalue("s3_url"), create=True)
    return SharedRoot.open(tmp_path / "root", create=True)


def _tree(base: Path) -> dict[str, bytes]:
    files = {f"k{i % 4}/f{i}.ptx": (f"kernel {i}\n" * (10 + i * 7)).encode() for i in range(40)}
    files["k0/random.cubin"] = os.urandom(3000)
    files["dup/a"] = files["dup/b"] = b"same bytes twice\n"
    files["big.so"] = os.urandom(200_000)  # above SMALL_OBJECT: stored alone
    for rel, data in files.items():
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return files


@pytest.mark.expect_log(r"rejected object: object \w+: content does not match its name")
def test_pack_writer_round_trip(any_root: SharedRoot) -> None:
    w = PackWriter(any_root.objects, target=4000)  # small target: several packs
    blobs = [os.urandom(100 + i * 20) for i in range(30)]
    for b in blobs:
        w.add(b)
    locs = w.flush()
    assert w.packs_written >= 2 and len(locs) == 30
    assert set(iter_packs(any_root.objects)) == {loc[0] for loc in locs.values()}
    fresh = SharedRoot.open(any_root.location)  # another reader: learns locations from rows
    for b in blobs:
        d = digest_bytes(b)
        with pytest.raises(ObjectMissingError):  # no loose copy, location not known yet
            fresh.objects.get_bytes(d)
        fresh.objects.locate(d, list(locs[d]))
        assert fresh.objects.get_bytes(d, len(b)) == b
    # a location pointing at the wrong member is rejected (hash mismatch), never served
    d0, d1 = digest_bytes(blobs[0]), digest_bytes(blobs[1])
    fresh.objects.locate(d0, list(locs[d1]))
    with pytest.raises(CorruptObjectError):
        fresh.objects.get_bytes(d0)


def test_import_with_packs_then_read_verify_du_gc(
    any_root: SharedRoot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = any_root
    src = tmp_path / "src"
    files = _tree(src)
    rep = import_tree(root, src, "ns", rules=rules("generic"), node="n", packs=True)
    assert rep.packs == 1 and rep.publish is not None and rep.publish.seq == 1
    assert sum(1 for _ in root.objects.iter_digests()) <= 3  # big.so + manifest (+ nothing else)
    reader = SharedRoot.open(root.location)
    gens = reader.generations()
    snap = gens.entries("ns")
    packed = [e for e in snap.entries.values() if e.extras and "pack" in e.extras]
    assert len(packed) == len(files) - 1  # all but big.so
    out = tmp_path / "out"
    assert export_tree(reader, snap.record, out).failed == []  # type: ignore[arg-type]
    for rel, data in files.items():
        assert (out / rel).read_bytes() == data
    v = maintenance.verify(SharedRoot.open(root.location))
    assert v.problems == [] and v.packs == 1
    du = maintenance.usage(SharedRoot.open(root.location))
    assert du.packs == 1 and du.files == len(files)
    # re-importing the same tree stores nothing new: named where they already are
    again = import_tree(root, src, "ns", rules=rules("generic"), node="n", packs=True)
    assert again.packs == 0 and len(list(iter_packs(root.objects))) == 1
    # a pack no generation uses (an importer died before publishing) goes; the used one stays
    w = PackWriter(root.objects)
    w.add(b"orphaned small object")
    orphan = next(iter(w.flush().values()))[0]
    # everything here is seconds old: let the sweep ignore the whole-second mtime slack
    monkeypatch.setattr(marks, "MTIME_SLACK", -60.0)
    rep2 = maintenance.gc(root, keep=1, grace=0)
    assert rep2.removed_packs == 1
    assert list(iter_packs(root.objects)) == [packed[0].extras["pack"][0]]  # type: ignore[index]
    assert root.backend.info(pack_key(orphan)) is None
    assert maintenance.verify(SharedRoot.open(root.location)).problems == []


@pytest.mark.expect_log(
    r"rejected object: object \w+: (content does not match its name|bad zstd data)")
def test_damaged_pack_is_reported_and_a_miss(tmp_path: Path) -> None:
    root = SharedRoot.open(tmp_path / "root", create=True)
    src = tmp_path / "src"
    files = _tree(src)
    import_tree(root, src, "ns", rules=rules("generic"), node="n", packs=True)
    [pack] = list(iter_packs(root.objects))
    _, info = read_pack(root.objects, pack)
    p = root.path / pack_key(pack)
    p.chmod(0o644)
    data = bytearray(p.read_bytes())
    bad, (off, length) = next(iter(info.members.items()))
    data[off + length - 1] ^= 0xFF  # flip the last byte of one member
    p.write_bytes(bytes(data))
    v = maintenance.verify(SharedRoot.open(root.path))
    assert any(f"pack {pack}" in x for x in v.problems)
    reader = SharedRoot.open(root.path)
    snap = reader.generations().entries("ns")
    rep = export_tree(reader, snap.record, tmp_path / "out")  # type: ignore[arg-type]
    # the damaged member is a miss for the files that use it; every other file exported
    users = [e.path for e in snap.entries.values() if e.digest == bad]
    assert len(rep.failed) == len(users) >= 1 and all(bad in f for f in rep.failed)
    assert sum(1 for r in files if (tmp_path / "out" / r).exists()) == len(files) - len(users)


def test_a_row_claiming_a_huge_pack_member_is_malformed(
    cli: Any, casfs_env: dict[str, Path], tmp_path: Path
) -> None:
    """A hostile row naming a pack range of 2**62 bytes: readers used to allocate what it
    claims (MemoryError tracebacks from cat, verify and export, and every row of the same
    digest unreadable, as the bad location replaced the good one). Now it is malformed:
    the object is found where honest rows say, a loose copy, or it is a miss."""
    import dataclasses

    src = tmp_path / "src"
    files = _tree(src)
    cli("import", "--packs", src, "-n", "ns", check=True)
    gens = SharedRoot.open(casfs_env["root"]).generations()
    snap = gens.entries("ns").entries
    e = snap["k0/f0.ptx"]
    assert e.extras and e.extras.get("pack")
    huge = dataclasses.replace(e, path="huge", extras={"pack": [e.extras["pack"][0], 0, 2**62]})
    # and one at an offset of 2**63: pread's OverflowError was a traceback in cat,
    # export and verify
    far = dataclasses.replace(e, path="far", extras={"pack": [e.extras["pack"][0], 2**63, 43]})
    gens.publish("ns", [*snap.values(), huge, far], node="attacker")
    for rel in ("huge", "far", "k0/f0.ptx"):
        out = cli("cat", "ns", rel, timeout=60)
        assert out.rc == 0 and out.out.encode() == files["k0/f0.ptx"], out.err
    v = cli("verify", "--json", timeout=60).json()
    assert v["ok"] is False and sorted(v["problems"]) == [
        f"generation ns@2: {rel}: malformed pack location" for rel in ("far", "huge")], v
    res = cli("export", "ns", tmp_path / "out", timeout=60)
    assert res.rc == 0 and "Traceback" not in res.err


def test_a_pack_index_that_is_not_an_object_is_damage() -> None:
    """Valid JSON, a list instead of an object: AttributeError was a traceback from
    `casfs verify`; it is a bad index, reported like any other."""
    import json

    import zstandard

    from casfs.store import packs

    bad = zstandard.ZstdCompressor().compress(json.dumps([1, 2, 3]).encode())
    with pytest.raises(CorruptObjectError, match="bad index"):
        packs._parse_index(bad, 100, 200, "ab" * 32)


@pytest.mark.parametrize("member", ["0, -Infinity", "0, -1e400", "NaN, 1", "0, -5", "0.5, 1"])
def test_a_pack_index_member_that_is_no_byte_range_is_damage(member: str) -> None:
    """Python's json reads -Infinity (and -1e400 as it): "off + length > index_off"
    let it through and int() raised OverflowError out of verify and every reader."""
    import zstandard

    from casfs.store import packs

    doc = f'{{"casfs_pack": {packs.PACK_VERSION}, "members": [["{"ab" * 32}", {member}]]}}'
    bad = zstandard.ZstdCompressor().compress(doc.encode())
    with pytest.raises(CorruptObjectError, match="bad index"):
        packs._parse_index(bad, 100, 200, "ab" * 32)
    good = doc.replace(member, "0, 5")
    info = packs._parse_index(zstandard.ZstdCompressor().compress(good.encode()), 100, 200,
                              "ab" * 32)
    assert info.members == {"ab" * 32: (0, 5)}


@pytest.mark.expect_log(r"repaired damaged pack ")
def test_packing_the_same_bytes_again_repairs_a_damaged_pack(any_root: SharedRoot,
                                                              tmp_path: Path) -> None:
    """A pack is named by its content, so packing the same files again (a re-import into
    a namespace whose own rows cannot be trusted, or another namespace) lands on the same
    name. Create-only found the damaged pack there and kept it: the new rows named it and
    every read of them missed, for good. Now it is verified and rewritten (on S3 too)."""
    root = any_root
    src = tmp_path / "src"
    files = _tree(src)
    # one thread: members packed in one order, so the second import makes the same packs
    import_tree(root, src, "one", rules=rules("generic"), node="n", packs=True, threads=1)
    packs = sorted(iter_packs(root.objects))
    victim = packs[0]
    raw, _ = read_pack(root.objects, victim)
    bad = bytearray(raw)
    bad[0] ^= 0xFF  # the first member's first byte
    staged = root.backend.staging_dir / "bad-pack"
    staged.write_bytes(bytes(bad))
    root.backend.replace(pack_key(victim), staged)
    import_tree(root, src, "two", rules=rules("generic"), node="n", packs=True, threads=1)
    assert sorted(iter_packs(root.objects)) == packs  # the same names: no new pack
    read_pack(root.objects, victim)  # hashes to its name again
    reader = SharedRoot.open(root.location)  # a fresh process: nothing cached
    for ns in ("one", "two"):
        snap = reader.generations().entries(ns).entries
        for rel, data in files.items():
            assert reader.objects.get_bytes(snap[rel].digest, snap[rel].size) == data, rel


def test_loose_only_roots_stay_readable(tmp_path: Path) -> None:
    root = SharedRoot.open(tmp_path / "root", create=True)
    src = tmp_path / "src"
    files = _tree(src)
    import_tree(root, src, "ns", rules=rules("generic"), node="n", packs=False)
    assert list(iter_packs(root.objects)) == []
    reader = SharedRoot.open(root.path)
    snap = reader.generations().entries("ns")
    assert all(not (e.extras and "pack" in e.extras) for e in snap.entries.values())
    assert export_tree(reader, snap.record, tmp_path / "o").failed == []  # type: ignore[arg-type]
    assert maintenance.verify(reader).problems == []
    assert len(files) == len(snap.entries)


def test_misses_racing_the_locator_wait_for_it(any_root: SharedRoot) -> None:
    """Two misses at once on a handle that has not located packs yet (a fetch worker
    serving a prefetch and a job's open): both must find their objects, I2."""
    import threading
    import time

    w = PackWriter(any_root.objects)
    blobs = [os.urandom(200 + i) for i in range(8)]
    for b in blobs:
        w.add(b)
    locs = w.flush()
    fresh = SharedRoot.open(any_root.location)

    def slow_locator() -> None:  # reading manifests takes a while on a shared root
        time.sleep(0.3)
        for d, loc in locs.items():
            fresh.objects.locate(d, list(loc))

    fresh.objects.locator = slow_locator
    got: dict[int, bytes | BaseException] = {}

    def read(i: int) -> None:
        try:
            got[i] = fresh.objects.get_bytes(digest_bytes(blobs[i]), len(blobs[i]))
        except BaseException as e:  # surfaced below
            got[i] = e

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(blobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == dict(enumerate(blobs))


def test_a_locator_that_misses_itself_does_not_wait_on_itself(any_root: SharedRoot) -> None:
    """The locator reads manifests through the same handle: a missing manifest is a miss
    inside the locator, which must not wait for the locator (a young record naming a
    missing manifest hung a mount's start for good)."""
    import threading

    fresh = SharedRoot.open(any_root.location)
    inner: list[BaseException] = []

    def locator() -> None:
        try:
            fresh.objects.get_bytes("ab" * 32)  # a manifest that is not there (yet)
        except ObjectMissingError as e:
            inner.append(e)

    fresh.objects.locator = locator
    def outer() -> None:
        with pytest.raises(ObjectMissingError):
            fresh.objects.get_bytes("cd" * 32)

    t = threading.Thread(target=outer, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "a miss inside the locator waited for the locator"
    assert len(inner) == 1


@pytest.mark.expect_log(r"rejected object: object \w+: header says \d+ bytes, manifest says")
def test_members_of_one_pack_come_from_one_range_read(any_root: SharedRoot) -> None:
    """read_members: one read per pack (one GET on S3), each member verified on its own."""
    import io

    w = PackWriter(any_root.objects, target=1 << 20)
    blobs = [os.urandom(500 + i) for i in range(6)]
    for b in blobs:
        w.add(b)
    locs = w.flush()
    objs = SharedRoot.open(any_root.location).objects
    wanted = {digest_bytes(b): locs[digest_bytes(b)] for b in blobs[1:5]}
    got = objs.read_members(wanted, 1 << 20)
    assert set(got) == set(wanted) and objs.counters.snapshot()["pack_span_reads"] == 1
    for b in blobs[1:5]:
        out = io.BytesIO()
        assert objs.get_stored_into(digest_bytes(b), len(b), got[digest_bytes(b)], out) == len(b)
        assert out.getvalue() == b
    d1, d2 = digest_bytes(blobs[1]), digest_bytes(blobs[2])
    with pytest.raises(CorruptObjectError):  # another member's bytes: rejected, never served
        objs.get_stored_into(d1, len(blobs[1]), got[d2], io.BytesIO())
    assert objs.read_members(wanted, 100) == {}  # wider than allowed: read one by one
    assert objs.read_members({d1: wanted[d1]}, 1 << 20) == {}  # a lone member: as before
