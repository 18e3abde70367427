"""Issue 3 node-level behaviour through real mounts: restore, promotion, publication, misses."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from casfs.store.entry import Entry
from casfs.store.generations import GenerationStore
from casfs.store.objects import object_key
from casfs.store.root import SharedRoot
from tests.fusehelpers import root_objects

pytestmark = pytest.mark.fuse


def published(root: Path, ns: str = "testns") -> dict[str, Any]:
    gens: GenerationStore = SharedRoot.open(root).generations()
    return gens.entries(ns).entries if gens.latest(ns) else {}


def seed(root: Path, files: dict[str, bytes], ns: str = "testns", tmp: Path | None = None) -> None:
    """Publish ``files`` as one generation with `casfs import` (a real CLI run)."""
    assert tmp is not None
    src = tmp / "seed"
    for rel, data in files.items():
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(root),
                        "--state-dir", str(tmp / "state-seed"), "import", str(src), "-n", ns],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr


def test_write_on_a_then_read_on_b(cluster: dict[str, Any]) -> None:
    a, b = cluster["a"], cluster["b"]
    w = a.mount()
    mp = w.cfg.mountpoint
    (mp / "KEY").mkdir()
    payload = os.urandom(200_000)
    (mp / "KEY" / "k.cubin").write_bytes(payload)
    (mp / "KEY" / "k.json").write_text('{"name": "k"}')
    a.stop(w)  # final promotion + publication, then unmount
    assert not os.path.ismount(mp)
    entries = published(cluster["root"])
    assert set(entries) == {"KEY/k.cubin", "KEY/k.json"}

    wb = b.mount()  # a fresh node: empty index, cache and upper; same mount path
    assert (wb.cfg.mountpoint / "KEY" / "k.cubin").read_bytes() == payload
    assert (wb.cfg.mountpoint / "KEY" / "k.json").read_text() == '{"name": "k"}'
    st = b.ask(wb, "stats")
    assert st["counters"]["objects_fetched"] == 2
    assert st["restored_entries"] == 2


def test_lazy_restore_fetches_only_what_is_read(cluster: dict[str, Any], tmp_path: Path) -> None:
    files = {f"d{i % 5}/f{i}": os.urandom(1000 + i) for i in range(40)}
    seed(cluster["root"], files, tmp=tmp_path)
    b = cluster["b"]
    w = b.mount()
    mp = w.cfg.mountpoint
    assert sorted(os.listdir(mp)) == [f"d{i}" for i in range(5)]
    # Listing and stat-ing everything fetches nothing.
    for rel in files:
        assert (mp / rel).stat().st_size == len(files[rel])
    assert b.ask(w, "stats")["counters"].get("objects_fetched", 0) == 0
    wanted = ["d0/f0", "d1/f6", "d3/f13"]
    for rel in wanted:
        assert (mp / rel).read_bytes() == files[rel]
    assert b.ask(w, "stats")["counters"]["objects_fetched"] == len(wanted)
    cached = [p for p in (b.state / "objects").rglob("*") if p.is_file()]
    assert len(cached) == len(wanted)


@pytest.mark.expect_log(
    r"rejected object: object \w+: bad zstd data",
    r"lower object for 'bad/b' unavailable, serving a miss: object \w+: bad zstd data",
)
def test_corrupt_lower_object_is_a_miss(cluster: dict[str, Any], tmp_path: Path) -> None:
    files = {"good/a": b"A" * 5000, "bad/b": b"B" * 7000 + os.urandom(100)}
    seed(cluster["root"], files, tmp=tmp_path)
    entries = published(cluster["root"])
    obj = cluster["root"] / object_key(entries["bad/b"].digest)
    data = bytearray(obj.read_bytes())
    data[-1] ^= 0xFF
    os.chmod(obj, 0o644)
    obj.write_bytes(bytes(data))

    b = cluster["b"]
    w = b.mount()
    mp = w.cfg.mountpoint
    with pytest.raises(OSError) as exc:
        (mp / "bad" / "b").read_bytes()
    assert exc.value.errno == errno.ENOENT  # a miss, never EIO
    assert not (mp / "bad" / "b").exists()  # and it stays absent for this mount
    assert (mp / "good" / "a").read_bytes() == files["good/a"]
    c = b.ask(w, "stats")["counters"]
    assert c["fetch_errors"] >= 1
    assert c["rejections"] >= 1


def test_scratch_names_are_never_published(cluster: dict[str, Any]) -> None:
    a = cluster["a"]
    w = a.mount(family="inductor")
    mp = w.cfg.mountpoint
    (mp / "ab").mkdir()
    (mp / "ab" / "real.py").write_text("x = 1\n")
    (mp / "ab" / ".123.456.tmp").write_text("partial")
    (mp / "locks").mkdir()
    (mp / "locks" / "ab.lock").write_text("")
    (mp / "KEY").mkdir()
    (mp / "KEY" / "tmp.pid_77_abc").mkdir()
    (mp / "KEY" / "tmp.pid_77_abc" / "k.ptx").write_text("ptx")
    (mp / "x_CxxBuild").mkdir()
    (mp / "x_CxxBuild" / "a.o").write_bytes(b"\0obj")
    (mp / "empty_dir").mkdir()
    r = a.ask(w, "publish")
    assert r["ok"], r
    assert set(published(cluster["root"])) == {"ab/real.py"}
    assert a.ask(w, "status")["served_seq"] == r["seq"] == 1  # serves what it published
    assert r["promote_s"] >= 0  # promotion timed apart from publication (bench.writepath)


def test_group_is_not_published_without_its_children(cluster: dict[str, Any]) -> None:
    a = cluster["a"]
    w = a.mount(family="triton")
    mp = w.cfg.mountpoint
    key = mp / "KEYAAAA"
    key.mkdir()
    (key / "k.json").write_text("{}")
    group = f'{{"child_paths": {{"k.json": "{key}/k.json", "k.cubin": "{key}/k.cubin"}}}}'
    (key / "__grp__k.json").write_text(group)
    assert a.ask(w, "publish")["ok"]
    assert set(published(cluster["root"])) == {"KEYAAAA/k.json"}  # the group waits
    (key / "k.cubin").write_bytes(b"cubin")
    assert a.ask(w, "publish")["ok"]
    assert set(published(cluster["root"])) == {
        "KEYAAAA/k.json", "KEYAAAA/k.cubin", "KEYAAAA/__grp__k.json"}


def test_file_open_for_writing_is_not_promoted(cluster: dict[str, Any]) -> None:
    a = cluster["a"]
    w = a.mount()
    mp = w.cfg.mountpoint
    (mp / "done").write_text("complete")
    with open(mp / "busy.so", "wb") as f:
        f.write(b"half")
        f.flush()
        assert a.ask(w, "publish")["ok"]
        assert set(published(cluster["root"])) == {"done"}
        f.write(b" and the rest")
    assert a.ask(w, "publish")["ok"]
    entries = published(cluster["root"])
    assert set(entries) == {"done", "busy.so"}
    assert entries["busy.so"].size == len(b"half and the rest")


def test_first_writer_wins_and_deletions_are_not_published(cluster: dict[str, Any]) -> None:
    a, b = cluster["a"], cluster["b"]
    wa = a.mount()
    (wa.cfg.mountpoint / "same").write_text("from a")
    (wa.cfg.mountpoint / "gone").write_text("will be deleted locally")
    assert a.ask(wa, "publish")["ok"]
    (wa.cfg.mountpoint / "gone").unlink()
    a.stop(wa)
    assert set(published(cluster["root"])) == {"same", "gone"}  # a local rm is not published

    wb = b.mount()
    mp = wb.cfg.mountpoint
    assert (mp / "same").read_text() == "from a"
    (mp / "same").write_text("from b")  # copy-up; b's own upper shadows the lower
    assert (mp / "same").read_text() == "from b"
    r = b.ask(wb, "publish")
    assert r["ok"] and r["conflicts"] == 1
    assert root_objects(cluster["root"]).get_bytes(
        published(cluster["root"])["same"].digest) == b"from a"


def test_refresh_shows_new_generations_in_a_running_mount(cluster: dict[str, Any]) -> None:
    a, b = cluster["a"], cluster["b"]
    wb = b.mount()  # b mounts first: nothing published yet
    # Both nodes run at once on this one machine, so node a needs another mount path.
    wa = a.mount(name="writer", mountpoint=cluster["mnt"] / "node-a")
    (wa.cfg.mountpoint / "late").write_text("published after b mounted")
    assert a.ask(wa, "publish")["ok"]
    assert not (wb.cfg.mountpoint / "late").exists()
    r = b.ask(wb, "refresh")
    assert r["ok"] and r["served_seq"] >= 1
    assert (wb.cfg.mountpoint / "late").read_text() == "published after b mounted"


def test_misses_are_cached_until_a_refresh_or_a_create_shows_the_name(
        cluster: dict[str, Any], tmp_path: Path) -> None:
    """Negative lookups are cached by the kernel (one LOOKUP per missing name), and
    every way a name appears makes it visible: a refresh bringing it in from another
    node (a new file, a new directory tree, a new file in a known directory) and a
    create, mkdir or rename through the mount."""
    seed(cluster["root"], {"KEY/old": b"old"}, tmp=tmp_path)
    a, b = cluster["a"], cluster["b"]
    wb = b.mount()
    mp = wb.cfg.mountpoint
    probes = [mp / "late", mp / "newdir", mp / "newdir" / "sub" / "f", mp / "KEY" / "new",
              mp / "mine", mp / "mydir", mp / "moved"]
    for _ in range(3):
        for p in probes:
            assert not p.exists()
    misses = b.ask(wb, "stats")["counters"]["lookup_miss"]
    assert misses == 6, misses  # newdir/sub/f stops at newdir; the repeats hit the kernel
    # Names made through the mount show at once.
    (mp / "mine").write_text("mine")
    (mp / "mydir").mkdir()
    (mp / "mine").rename(mp / "moved")
    assert (mp / "moved").read_text() == "mine" and (mp / "mydir").is_dir()
    assert not (mp / "mine").exists()
    # Names another node publishes show after a refresh, not before.
    wa = a.mount(name="writer", mountpoint=cluster["mnt"] / "node-a")
    for rel, text in (("late", "late"), ("newdir/sub/f", "deep"), ("KEY/new", "new")):
        (wa.cfg.mountpoint / rel).parent.mkdir(parents=True, exist_ok=True)
        (wa.cfg.mountpoint / rel).write_text(text)
    assert a.ask(wa, "publish")["ok"]
    assert not (mp / "late").exists()
    r = b.ask(wb, "refresh")
    assert r["ok"] and r["served_seq"] >= 2
    assert (mp / "late").read_text() == "late"
    assert (mp / "newdir" / "sub" / "f").read_text() == "deep"
    assert (mp / "KEY" / "new").read_text() == "new"
    assert b.ask(wb, "stats")["counters"]["negative_invalidated"] == 3


@pytest.mark.expect_log(
    r"shared root unavailable, serving local state only: .* is unreadable or damaged",
    r"lower object for 'x/uncached' unavailable, serving a miss: the shared root is unavailable",
)
def test_unreachable_root_serves_local_state(cluster: dict[str, Any], tmp_path: Path) -> None:
    files = {"x/cached": b"c" * 3000, "x/uncached": b"u" * 3000}
    seed(cluster["root"], files, tmp=tmp_path)
    b = cluster["b"]
    w = b.mount()
    assert (w.cfg.mountpoint / "x" / "cached").read_bytes() == files["x/cached"]
    b.stop(w)
    moved = cluster["root"].with_name("root-offline")
    cluster["root"].rename(moved)
    cluster["root"].mkdir()
    (cluster["root"] / "casfs.json").write_text("{garbage")  # a damaged root
    try:
        w = b.mount()
        mp = w.cfg.mountpoint
        assert (mp / "x" / "cached").read_bytes() == files["x/cached"]  # local cache
        with pytest.raises(FileNotFoundError):
            (mp / "x" / "uncached").read_bytes()
        (mp / "new").write_text("local writes still work")
        assert (mp / "new").read_text() == "local writes still work"
        st = b.ask(w, "status")
        assert st["root_available"] is False
        b.stop(w)
    finally:
        (cluster["root"] / "casfs.json").unlink()
        cluster["root"].rmdir()
        moved.rename(cluster["root"])


@pytest.mark.expect_log(
    r"was published from a mount at /old/path but is served here at .*: its Triton group files",
)
def test_serving_triton_at_another_path_is_warned_only_for_legacy_records(
        cluster: dict[str, Any]) -> None:
    a, c = cluster["a"], cluster["c"]
    w = a.mount(family="triton")
    (w.cfg.mountpoint / "f").write_text("x")
    a.stop(w)
    # Group files are stored path-free now: another path is fine (tests/node/test_relocation.py).
    other = c.mount(family="triton", mountpoint=cluster["mnt"] / "elsewhere")
    assert c.ask(other, "stats")["counters"].get("mount_path_mismatch", 0) == 0
    c.stop(other)
    # A record of an older casfs names its mount path: its groups hold absolute paths.
    root = SharedRoot.open(cluster["root"])
    put = root.objects.put_bytes(b"legacy")
    root.generations().publish("testns", [Entry("g", put.digest, put.size, 0o644, 1)],
                               node="old", fingerprint={"mountpoint": "/old/path"})
    legacy = c.mount(family="triton", mountpoint=cluster["mnt"] / "elsewhere")
    assert c.ask(legacy, "stats")["counters"]["mount_path_mismatch"] == 1
    assert "hold absolute paths" in (c.state / "log" / "triton.log").read_text()


@pytest.mark.expect_log(
    r"rejected object: object \w+: not a regular file",
    r"lower object for 'fifo' unavailable, serving a miss: object \w+: not a regular file",
)
def test_a_fifo_in_the_store_is_an_immediate_miss(cluster: dict[str, Any],
                                                  tmp_path: Path) -> None:
    """Issue 8 item 2: a FIFO under objects/ is corrupt, never opened blocking (I2, I4)."""
    files = {"ok": b"fine" * 100, "fifo": b"never arrives" * 100}
    seed(cluster["root"], files, tmp=tmp_path)
    obj = cluster["root"] / object_key(published(cluster["root"])["fifo"].digest)
    obj.unlink()
    os.mkfifo(obj)  # a blocking open() would wait here forever
    b = cluster["b"]
    w = b.mount(fetch_timeout=30.0)
    mp = w.cfg.mountpoint
    r = subprocess.run(["cat", str(mp / "fifo")], capture_output=True, timeout=20,
                       check=False)
    assert r.returncode != 0 and b"No such file" in r.stderr  # a miss, not a 30 s wait
    assert (mp / "ok").read_bytes() == files["ok"]  # other paths keep working
    c = b.ask(w, "stats")["counters"]
    assert c.get("fetch_timeouts", 0) == 0 and c["rejections"] >= 1
    b.stop(w)
    assert not os.path.ismount(mp)
    with pytest.raises(OSError) as exc:  # ENXIO: nobody ever opened the FIFO for reading
        os.open(obj, os.O_WRONLY | os.O_NONBLOCK)
    assert exc.value.errno == errno.ENXIO


def test_a_burst_of_files_is_promoted_and_published_intact(cluster: dict[str, Any]) -> None:
    a = cluster["a"]
    w = a.mount()
    mp = w.cfg.mountpoint
    files = {f"k{i:03d}/f{j}.bin": os.urandom(3000 + i * 7 + j) for i in range(30)
             for j in range(3)}
    for rel, data in files.items():
        (mp / rel).parent.mkdir(exist_ok=True)
        (mp / rel).write_bytes(data)
    r = a.ask(w, "publish")
    assert r["ok"] and r["added"] == len(files)
    entries = published(cluster["root"])
    objects = root_objects(cluster["root"])
    for rel, data in files.items():
        assert objects.get_bytes(entries[rel].digest, len(data)) == data


@pytest.mark.expect_log(r"testns was indexed from another shared root; re-indexing from ")
def test_a_node_moved_to_another_shared_root_reindexes(cluster: dict[str, Any],
                                                       tmp_path: Path) -> None:
    seed(cluster["root"], {"old/only": b"from the first root"}, tmp=tmp_path)
    b = cluster["b"]
    w = b.mount()
    assert (w.cfg.mountpoint / "old" / "only").exists()
    (w.cfg.mountpoint / "mine").write_text("compiled on b")
    b.stop(w)  # published to the first root
    assert "mine" in published(cluster["root"])
    b.root = tmp_path / "other-root"  # same state dir, another (empty) shared root
    w = b.mount()
    assert not (w.cfg.mountpoint / "old").exists()  # nothing from the first root lingers
    assert b.ask(w, "status")["served_seq"] == 0
    assert (w.cfg.mountpoint / "mine").read_text() == "compiled on b"  # the upper stays
    assert b.ask(w, "publish")["ok"]
    assert set(published(b.root)) == {"mine"}  # and reaches the new root too


@pytest.mark.expect_log(
    r"rejected object: object \w+: content does not match its name",
    r"unavailable, serving a miss: object \w+: content does not match its name",
)
def test_promotion_packs_small_files_dedups_and_fetches_verified(
        cluster: dict[str, Any]) -> None:
    """Promotion writes a round's small files as one pack (large ones loose); a node
    promoting bytes the root already holds writes no new pack; a lazy fetch of a packed
    object through a real mount verifies it (a damaged member is a miss)."""
    from casfs.store.packs import iter_packs
    from tests.fusehelpers import corrupt_pack_member

    a, b = cluster["a"], cluster["b"]
    w = a.mount(stable_after=3600.0)  # one round, the publication's (as on S3)
    files = {f"KEY{i % 3}/f{i}.ptx": os.urandom(900 + 41 * i) for i in range(12)}
    files["big.so"] = os.urandom(300_000)
    for rel, data in files.items():
        (w.cfg.mountpoint / rel).parent.mkdir(parents=True, exist_ok=True)
        (w.cfg.mountpoint / rel).write_bytes(data)
    assert a.ask(w, "publish")["ok"]
    assert a.ask(w, "stats")["counters"]["packs_promoted"] == 1
    a.stop(w)
    rows = published(cluster["root"])
    assert all((rows[r].extras or {}).get("pack") for r in files if r != "big.so")
    assert not (rows["big.so"].extras or {}).get("pack")
    (pack,) = iter_packs(root_objects(cluster["root"]))
    assert not (cluster["root"] / object_key(rows["KEY0/f0.ptx"].digest)).exists()

    wb = b.mount()  # the same bytes compiled again on b, at other paths: no new pack
    for rel in ("KEY0/f0.ptx", "KEY1/f1.ptx"):
        (wb.cfg.mountpoint / "again" / rel).parent.mkdir(parents=True, exist_ok=True)
        (wb.cfg.mountpoint / "again" / rel).write_bytes(files[rel])
    assert b.ask(wb, "publish")["ok"]
    assert b.ask(wb, "stats")["counters"].get("packs_promoted", 0) == 0
    assert set(iter_packs(root_objects(cluster["root"]))) == {pack}
    assert published(cluster["root"])["again/KEY0/f0.ptx"].extras["pack"][0] == pack
    b.stop(wb)

    bad = "KEY1/f4.ptx"
    corrupt_pack_member(cluster["root"], "testns", bad)
    c = cluster["c"]
    wc = c.mount()
    for rel, data in files.items():
        if rel != bad:
            assert (wc.cfg.mountpoint / rel).read_bytes() == data
    with pytest.raises(OSError) as e:
        (wc.cfg.mountpoint / bad).read_bytes()
    assert e.value.errno == errno.ENOENT  # never the damaged bytes
    counters = c.ask(wc, "stats")["counters"]
    assert counters["packed_reads"] >= 12 and counters["rejections"] >= 1


def test_a_promoted_file_another_process_removed_or_changed_is_not_published(
        cluster: dict[str, Any]) -> None:
    """The upper changed behind this process between its promotion and its record (the
    successor of a handover did it, in a review: a file the job removed through the new
    mount came back for every node, published by the draining process's last round).
    Gone: not published; changed: promoted again, its new bytes published."""
    from waiting import wait_until

    a = cluster["a"]
    w = a.mount()
    mp, upper = w.cfg.mountpoint, w.cfg.writable_dir
    for name in ("kept", "gone", "changed", "filed/k", "linked/k"):
        (mp / name).parent.mkdir(exist_ok=True)
        (mp / name).write_text(f"{name} v1")
    wait_until(lambda: a.ask(w, "stats")["pending_publication"] == 5, "the five promoted")
    (upper / "gone").unlink()  # as another process of the node would, in the upper
    (upper / "changed").write_text("changed v2")
    for d in ("filed", "linked"):  # their directories replaced by a file, a symlink
        (upper / d / "k").unlink()
        (upper / d).rmdir()
    (upper / "filed").write_text("a file now")
    (upper / "linked").symlink_to("changed")
    assert a.ask(w, "publish")["ok"]
    assert set(published(cluster["root"])) == {"kept"}
    assert a.ask(w, "publish")["ok"]  # the changed one, promoted again
    got = published(cluster["root"])
    assert set(got) == {"kept", "changed"}
    assert root_objects(cluster["root"]).get_bytes(got["changed"].digest) == b"changed v2"
    assert a.ask(w, "stats")["counters"]["pending_vanished"] == 4
