"""A promotion round in several parts (read and hash here, packed beside): every file
lands once with its bytes, duplicates and older loose copies the published generation
names at the same path are not stored again, and a failed loose probe only defers its
own path."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import casfs.promote.promoter as promoter_mod
from casfs.index.node_index import NodeIndex
from casfs.index.tree import DictLowerTree
from casfs.store.entry import Entry
from casfs.store.objects import CODEC_RAW, CODEC_ZSTD, HEADER, ObjectStore, digest_bytes
from casfs.store.packs import SMALL_OBJECT, iter_packs, read_pack
from casfs.store.root import SharedRoot
from tests.promote.rig import promotion_rig


def _write(upper: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (upper / rel).parent.mkdir(parents=True, exist_ok=True)
        (upper / rel).write_bytes(data)


@pytest.mark.expect_log(r"promotion step failed \(will retry\): \[Errno 5\] probe failed")
def test_a_round_in_parts_stores_each_object_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(promoter_mod, "PART_BYTES", 64 << 10)  # many parts, two in flight
    root = SharedRoot.open(tmp_path / "root", create=True)
    files = {f"K{i}/k.ttir": f"kernel {i}\n".encode() * (200 + i) for i in range(120)}
    files.update({f"K{i}/k.cubin": os.urandom(3000 + i) for i in range(40)})  # stored raw
    files["A/same.ptx"] = files["B/same.ptx"] = b"identical bytes at two paths\n" * 30
    files["big/lib.so"] = os.urandom(SMALL_OBJECT + 1000)  # alone, loose
    old = b"an older writer stored this loose\n" * 10
    files["old/k.json"] = old
    root.objects.put_bytes(old)  # a loose copy the lower names here: not packed again
    stray = b"a loose copy no manifest this node read names\n" * 10
    files["stray/k.json"] = stray
    root.objects.put_bytes(stray)  # not probed (a stat per new object): packed too
    upper = tmp_path / "upper"
    _write(upper, files)
    fail = digest_bytes(files["K3/k.ttir"])
    # The published generation as this node knows it: the same bytes at these paths
    # (a job rewrote them), so only these are looked for loose.
    lower = DictLowerTree(Entry(rel, digest_bytes(files[rel]), len(files[rel]), 0o644, 1)
                          for rel in ("old/k.json", "K3/k.ttir"))
    probed: list[str] = []
    real = ObjectStore.has_sound

    def probe(self: ObjectStore, digest: str, size: int) -> bool:
        probed.append(digest)
        if digest == fail:
            raise OSError(errno.EIO, "probe failed")
        return real(self, digest, size)

    index = NodeIndex.open(tmp_path / "state")
    try:
        promoter, publisher, counters, tracker = promotion_rig(root, upper, index)
        promoter.lower = lower
        monkeypatch.setattr(ObjectStore, "has_sound", probe)
        promoter.scan_all()
        res = promoter.run_once(final=True)
        assert sorted(probed) == sorted([digest_bytes(old), fail])
        assert res.errors == 1 and "probe failed" in res.last_error
        assert res.promoted == len(files) - 1
        assert tracker.pending() == 1  # K3/k.ttir: retried next round
        monkeypatch.setattr(ObjectStore, "has_sound", real)
        res = promoter.run_once(final=True)
        assert (res.promoted, res.errors, tracker.pending()) == (1, 0, 0)
        assert publisher.publish().ok
    finally:
        index.close()
    members: dict[str, bytes] = {}
    for pack in iter_packs(root.objects):
        raw, info = read_pack(root.objects, pack)
        for d, (off, length) in info.members.items():
            assert d not in members, "an object packed twice"
            members[d] = raw[off:off + length]
    small = {digest_bytes(v) for v in files.values() if len(v) <= SMALL_OBJECT} - {
        digest_bytes(old)}
    assert set(members) == small and digest_bytes(stray) in members
    for rel in ("K0/k.ttir", "K0/k.cubin"):  # compressed when it pays, raw when not
        codec = HEADER.unpack(members[digest_bytes(files[rel])][:HEADER.size])[2]
        assert codec == (CODEC_ZSTD if rel.endswith("ttir") else CODEC_RAW)
    assert counters.get("packs_promoted") == len(list(iter_packs(root.objects)))
    reader = SharedRoot.open(tmp_path / "root")
    snap = reader.generations().entries("ns").entries
    assert set(snap) == set(files)
    for rel, data in files.items():
        assert reader.objects.get_bytes(snap[rel].digest, snap[rel].size) == data, rel


def test_encode_many_matches_encode(tmp_path: Path) -> None:
    store = SharedRoot.open(tmp_path / "root", create=True).objects
    datas = [b"text " * (50 + i) for i in range(20)] + [os.urandom(2000), b"", b"x"]
    assert store.encode_many(datas, 2) == [store.encode(d) for d in datas]
    assert store.encode_many(datas, 1) == [store.encode(d) for d in datas]
    # pack members' level (casfs.store.packs.PACK_LEVEL): other bytes, the same content
    ir = b"".join(f"  %r{i} = add i32 %r{i * 7 % 13}, {i * 31 % 97}\n".encode()
                  for i in range(2000))
    datas.append(ir)
    level1 = store.encode_many(datas, 2, 1)
    assert level1 == [store.encode(d, 1) for d in datas]
    assert level1[-1] != store.encode(ir)  # another level: other bytes
    for d, member in zip(datas, level1, strict=True):
        assert store.verify_stored(digest_bytes(d), member) == len(d)


@pytest.mark.parametrize("datas", [
    [b"abc", b""],  # python-zstandard 0.25 drops the empty input's segment here
    [b"", b"abc"], [b"", b""], [b"x" * 100, b"", b"y" * 50, b""],
    [b"a" * 3000] * 7 + [b""], [b""] * 5 + [b"z" * 40],
])
def test_encode_many_with_empty_objects(tmp_path: Path, datas: list[bytes]) -> None:
    """An empty file (a lock file, an empty module) in a promotion part failed the whole
    round, every round: nothing of the namespace was ever published."""
    store = SharedRoot.open(tmp_path / "root", create=True).objects
    assert store.encode_many(datas, 2) == [store.encode(d) for d in datas]
    for d, member in zip(datas, store.encode_many(datas, 2, 1), strict=True):
        assert store.verify_stored(digest_bytes(d), member) == len(d)


def test_a_file_renamed_over_between_check_and_read_is_deferred(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small file's stability check uses the fstat taken after reading it (no second
    lookup): a file renamed over the path with the same size and mtime is another inode,
    so the round defers it rather than recording the first one's metadata."""
    root = SharedRoot.open(tmp_path / "root", create=True)
    upper = tmp_path / "upper"
    _write(upper, {"K/k.ttir": b"first version\n" * 50, "K/k.ptx": b"unchanged\n" * 40})
    st = os.lstat(upper / "K/k.ttir")
    real = promoter_mod.beneath.open_read
    swapped = []

    def open_read(base: int, rel: str, flags: int = 0) -> int:  # the read's open
        if rel.endswith("k.ttir") and not swapped:
            swapped.append(rel)
            (upper / "new").write_bytes(b"other version\n" * 50)  # same size
            os.utime(upper / "new", ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime
            os.rename(upper / "new", upper / rel)
        return real(base, rel, flags)

    monkeypatch.setattr(promoter_mod.beneath, "open_read", open_read)
    index = NodeIndex.open(tmp_path / "state")
    try:
        promoter, publisher, _, tracker = promotion_rig(root, upper, index)
        promoter.scan_all()
        res = promoter.run_once(final=True)
        assert (res.promoted, res.deferred, tracker.pending()) == (1, 1, 1)
        res = promoter.run_once(final=True)  # the next round takes the new inode
        assert (res.promoted, res.deferred, tracker.pending()) == (1, 0, 0)
        assert publisher.publish().ok
    finally:
        index.close()
    snap = SharedRoot.open(tmp_path / "root").generations().entries("ns").entries
    assert snap["K/k.ttir"].digest == digest_bytes(b"other version\n" * 50)
