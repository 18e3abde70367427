from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from casfs.errors import IndexError_
from casfs.index import keyspace as ks
from casfs.index.node_index import NodeIndex
from casfs.store.entry import Entry

D1 = "11" * 32
D2 = "22" * 32


@pytest.fixture
def index(tmp_path: Path) -> Iterator[NodeIndex]:
    ix = NodeIndex.open(tmp_path / "state")
    yield ix
    ix.close()


def test_node_id_is_created_once_and_kept(tmp_path: Path) -> None:
    with NodeIndex.open(tmp_path) as ix:
        node_id = ix.node_id
    assert len(node_id) == 32
    with NodeIndex.open(tmp_path) as ix:
        assert ix.node_id == node_id


def test_open_twice_in_one_process_shares_the_environment(tmp_path: Path) -> None:
    a = NodeIndex.open(tmp_path)
    b = NodeIndex.open(tmp_path)
    assert a.env is b.env
    a.close()
    b.set_ns_state("ns", {"seq": 1})  # still open: closing one reference keeps the other
    assert b.ns_state("ns") == {"seq": 1}
    b.close()


def _set_version(tmp_path: Path, value: bytes) -> None:
    env = lmdb.open(str(tmp_path / "index"), max_dbs=16)
    meta = env.open_db(ks.DB_META)
    with env.begin(write=True) as txn:
        txn.put(ks.META_FORMAT_VERSION, value, db=meta)
    env.close()


@pytest.mark.parametrize("version", [b"3", b"99", b"garbage"])
def test_newer_or_unknown_format_version_refused(tmp_path: Path, version: bytes) -> None:
    NodeIndex.open(tmp_path).close()
    _set_version(tmp_path, version)
    with pytest.raises(IndexError_, match="format version"):
        NodeIndex.open(tmp_path)
    with pytest.raises(IndexError_, match="format version"):
        NodeIndex.open(tmp_path, readonly=True)


def test_readonly_open_of_missing_index_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(IndexError_, match="no node index"):
        NodeIndex.open(tmp_path / "nowhere", readonly=True)


def test_readonly_refuses_writes(tmp_path: Path) -> None:
    NodeIndex.open(tmp_path).close()
    with (
        NodeIndex.open(tmp_path, readonly=True) as ro,
        pytest.raises(IndexError_, match="read-only"),
    ):
        ro.set_ns_state("ns", {})


def test_map_grows_instead_of_failing(tmp_path: Path) -> None:
    with NodeIndex.open(tmp_path, map_size=64 * 1024) as ix:
        entries = [Entry(f"d{i % 50}/file-{i:06d}.bin", D1, i, 0o644, i) for i in range(20_000)]
        result = ix.add_entries("ns", 1, entries)
        assert result.added == 20_000
        assert ix.env.env.info()["map_size"] > 64 * 1024
        tree = ix.lower_tree("ns", 1)
        assert tree.lookup("d7/file-000007.bin") == entries[7]
        assert sum(1 for _ in tree.walk()) == 20_000


def test_handle_refuses_use_after_fork(index: NodeIndex) -> None:
    pid = os.fork()
    if pid == 0:  # child: must not touch the parent's environment
        try:
            index.ns_state("ns")
        except IndexError_:
            os._exit(0)
        except BaseException:
            os._exit(2)
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    index.set_ns_state("ns", {"ok": True})  # the parent's handle still works
    assert index.ns_state("ns") == {"ok": True}


READER = textwrap.dedent(
    """
    import sys
    from casfs.index.node_index import NodeIndex
    ix = NodeIndex.open(sys.argv[1], readonly=True)
    tree = ix.lower_tree("ns", 10**9)
    print("ready", flush=True)
    for line in sys.stdin:
        node = tree.lookup(line.strip())
        print("missing" if node is None else getattr(node, "digest", "dir"), flush=True)
    """
)


def test_readonly_reader_in_another_process_sees_later_commits(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with NodeIndex.open(state, map_size=64 * 1024) as ix:
        ix.add_entries("ns", 1, [Entry("a/x", D1, 1, 0o644, 0)])
        proc = subprocess.Popen(
            [sys.executable, "-c", READER, str(state)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        try:
            assert proc.stdout.readline().strip() == "ready"

            def ask(path: str) -> str:
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(path + "\n")
                proc.stdin.flush()
                return proc.stdout.readline().strip()

            assert ask("a/x") == D1
            assert ask("b/y") == "missing"
            # commit more while the reader runs, growing the map past its size
            ix.add_entries("ns", 2, [Entry(f"b/{i}", D2, 1, 0o644, 0) for i in range(5000)])
            assert ix.env.env.info()["map_size"] > 64 * 1024
            assert ask("b/17") == D2
            assert ask("b") == "dir"
        finally:
            proc.stdin.close()
            assert proc.wait() == 0


def test_the_reserved_mounts_database_is_still_created(tmp_path: Path) -> None:
    """Nothing uses ``mounts``, but a read-only open needs every database its release
    lists: an index without it would be refused by releases that list it."""
    NodeIndex.open(tmp_path).close()
    env = lmdb.open(str(tmp_path / "index"), max_dbs=16, readonly=True)
    try:
        db = env.open_db(ks.DB_MOUNTS, create=False)
        with env.begin() as txn:
            assert txn.stat(db)["entries"] == 0
    finally:
        env.close()


def test_ns_state(index: NodeIndex) -> None:
    assert index.ns_state("ns") is None
    index.set_ns_state("ns", {"seq": 4, "manifests": [D1, D2], "entries": 10})
    assert index.ns_state("ns") == {"seq": 4, "manifests": [D1, D2], "entries": 10}
    assert index.namespaces() == {"ns": {"seq": 4, "manifests": [D1, D2], "entries": 10}}


def test_counters_accumulate_per_mount(index: NodeIndex) -> None:
    index.add_counters("m1", {"hits": 2, "misses": 1})
    index.add_counters("m1", {"hits": 3, "rejections": 0})
    index.add_counters("m10", {"hits": 100})  # "m1" must not see "m10"'s keys
    assert index.counters("m1") == {"hits": 5, "misses": 1}
    assert index.counters("m10") == {"hits": 100}
    assert index.counters("none") == {}


COUNTER_WORKER = textwrap.dedent(
    """
    import sys
    from casfs.index.node_index import NodeIndex
    ix = NodeIndex.open(sys.argv[1])
    for _ in range(200):
        ix.add_counters("m", {"n": 1})
    ix.close()
    """
)


def test_counters_are_atomic_across_processes(tmp_path: Path) -> None:
    NodeIndex.open(tmp_path).close()
    procs = [subprocess.Popen([sys.executable, "-c", COUNTER_WORKER, str(tmp_path)])
             for _ in range(4)]  # fmt: skip
    assert [p.wait() for p in procs] == [0] * 4
    with NodeIndex.open(tmp_path, readonly=True) as ix:
        assert ix.counters("m") == {"n": 800}


def test_promotion_state(index: NodeIndex) -> None:
    a = Entry("k/a.so", D1, 10, 0o755, 1)
    b = Entry("k/b.json", D2, 20, 0o644, 2)
    long_path = "/".join(["x" * 200] * 5) + "/c"
    c = Entry(long_path, D1, 1, 0o644, 3)
    for e in (a, b, c):
        index.add_promoted("m", e)
    assert sorted(e.path for e in index.pending("m")) == sorted([a.path, b.path, c.path])
    assert list(index.pending("other")) == []

    assert index.mark_published("m", [a, "k/b.json", long_path, "k/none"], 7) == 3
    assert list(index.pending("m")) == []
    rec = index.get_promoted("m", "k/a.so")
    assert rec is not None and rec.state == "published" and rec.published_seq == 7
    assert rec.entry == a
    assert index.get_promoted("m", long_path) is not None

    # re-promoted with new content: pending again
    a2 = Entry("k/a.so", D2, 11, 0o755, 5)
    index.add_promoted("m", a2)
    pending = index.get_promoted("m", "k/a.so")
    assert pending is not None and pending.state == "pending" and pending.published_seq is None
    # a publication of the old content must not mark the new content published
    assert index.mark_published("m", [a], 8) == 0
    assert list(index.pending("m")) == [a2]

    assert index.forget_promoted("m", "k/a.so") is True
    assert index.forget_promoted("m", "k/a.so") is False
    assert index.get_promoted("m", "k/a.so") is None


def test_many_promoted_records_iterate_across_batches(index: NodeIndex) -> None:
    entries = [Entry(f"f{i:05d}", D1, i, 0o644, i) for i in range(1100)]  # > one 1024-record batch
    for e in entries:
        index.add_promoted("m", e)
    assert list(index.pending("m")) == entries


def test_readers_in_other_threads_survive_map_growth(tmp_path: Path) -> None:
    with NodeIndex.open(tmp_path, map_size=64 * 1024) as ix:
        ix.add_entries("ns", 1, [Entry("fixed/f", D1, 1, 0o644, 0)])
        tree = ix.lower_tree("ns", 10)
        stop = threading.Event()
        failures: list[BaseException] = []
        lookups = [0]

        def reader() -> None:
            while not stop.is_set():
                try:
                    assert tree.lookup("fixed/f") is not None
                    lookups[0] += 1
                    # pacing, not timing: a tight loop in 4 threads starves the
                    # writer of the GIL (seconds per commit), unlike FUSE traffic
                    time.sleep(0.0002)
                except BaseException as e:
                    failures.append(e)
                    return

        threads = [threading.Thread(target=reader) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            for batch in range(20):
                ix.add_entries(
                    "ns", 2, [Entry(f"g{batch}/{i}", D2, 1, 0o644, 0) for i in range(500)]
                )
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert ix.env.env.info()["map_size"] > 64 * 1024
        assert failures == []
        assert lookups[0] > 0
        assert sum(1 for _ in tree.walk()) == 10_001


def test_pending_table_follows_promotion_state(tmp_path: Path) -> None:
    from casfs.store.entry import Entry

    idx = NodeIndex.open(tmp_path / "state")
    try:
        es = [Entry(f"d/f{i}", f"{i:064x}", i, 0o644, 0) for i in range(10)]
        idx.add_promoted_many("ns", es)
        assert idx.count_pending("ns") == 10
        assert idx.mark_published("ns", es[:7], 1) == 7
        assert idx.count_pending("ns") == 3
        assert sorted(e.path for e in idx.pending("ns")) == ["d/f7", "d/f8", "d/f9"]
        idx.forget_promoted("ns", "d/f8")
        assert idx.count_pending("ns") == 2
        idx.add_promoted("ns", Entry("d/f0", "f" * 64, 1, 0o644, 1))  # re-promoted: pending again
        assert idx.count_pending("ns") == 3
        assert idx.count_pending("other") == 0
    finally:
        idx.close()


def test_a_pack_location_another_pending_record_names_outlives_a_publication(
        tmp_path: Path) -> None:
    """Two namespaces of a node promote the same bytes into packs: publishing one must
    not drop the location the other's pending record still needs (its object then
    looked lost, and a namespace's final publication dropped the file)."""
    from casfs.store.entry import Entry

    idx = NodeIndex.open(tmp_path / "state")
    try:
        same, only = "ab" * 32, "cd" * 32
        loc_same, loc_only = ("ef" * 32, 0, 4), ("ef" * 32, 4, 4)
        idx.add_promoted_many("triton", [Entry("k/x", same, 1, 0o644, 0),
                                         Entry("k/y", only, 1, 0o644, 0)],
                              {same: loc_same, only: loc_only}, "root")
        idx.add_promoted_many("inductor", [Entry("k/x", same, 1, 0o644, 0)],
                              {same: loc_same}, "root")
        published = list(idx.pending("triton", "root"))
        assert all(e.extras == {"pack": list(loc_same if e.digest == same else loc_only)}
                   for e in published)
        assert idx.mark_published("triton", published, 1, "root") == 2
        (other,) = idx.pending("inductor", "root")
        assert other.extras == {"pack": list(loc_same)}  # still named: kept
        assert idx.pack_location("root", only) is None  # nobody else's: dropped
        assert idx.mark_published("inductor", [other], 1, "root") == 1
        assert idx.pack_location("root", same) is None  # the last one out drops it
    finally:
        idx.close()


def test_forget_all_promoted_is_per_namespace(tmp_path: Path) -> None:
    from casfs.store.entry import Entry

    idx = NodeIndex.open(tmp_path / "state")
    try:
        idx.add_promoted_many("ns", [Entry(f"f{i}", f"{i:064x}", i, 0o644, 0) for i in range(5)])
        idx.add_promoted("ns2", Entry("g", "a" * 64, 1, 0o644, 0))
        idx.mark_published("ns", ["f0", "f1"], 1)
        assert idx.forget_all_promoted("ns") == 5
        assert list(idx.iter_promoted("ns")) == [] and idx.count_pending("ns") == 0
        assert idx.count_pending("ns2") == 1
    finally:
        idx.close()


def test_version_1_index_is_read_then_upgraded(tmp_path: Path) -> None:
    """An index written before ``packed`` existed: read as it is, upgraded by a writer."""
    env = lmdb.open(str(tmp_path / "index"), max_dbs=16)
    meta = env.open_db(ks.DB_META)
    for name in ks.ALL_DBS:
        if name != ks.DB_PACKED:
            env.open_db(name)
    with env.begin(write=True) as txn:
        txn.put(ks.META_FORMAT_VERSION, b"1", db=meta)
        txn.put(ks.META_NODE_ID, b"ab" * 16, db=meta)
    env.close()
    digest = "cd" * 32
    with NodeIndex.open(tmp_path, readonly=True) as ro:
        assert ro.node_id == "ab" * 16 and ro.pack_location("root", digest) is None
    e = Entry("k/f", digest, 10, 0o644, 1)
    with NodeIndex.open(tmp_path) as ix:  # read-write: upgraded in place
        ix.add_promoted_many("m", [e], {digest: ("ef" * 32, 16, 30)}, "root")
        assert ix.pack_location("root", digest) == ("ef" * 32, 16, 30)
        assert ix.pack_location("another root", digest) is None
        (pending,) = ix.pending("m", "root")
        assert pending.extras == {"pack": ["ef" * 32, 16, 30]}
        (plain,) = ix.pending("m", "another root")
        assert plain.extras is None
        # Published: the row holds the location now, the table keeps only what is pending.
        assert ix.mark_published("m", [pending], 1, "root") == 1
        assert ix.pack_location("root", digest) is None
    env = lmdb.open(str(tmp_path / "index"), max_dbs=16)
    with env.begin() as txn:
        assert txn.get(ks.META_FORMAT_VERSION, db=env.open_db(ks.DB_META, txn=txn)) == b"2"
    env.close()


def test_a_process_killed_inside_a_write_transaction_blocks_no_one(tmp_path: Path) -> None:
    """The promotion worker writes promoted rows in its own environment of the same
    index and may be killed at any moment (casfs.node.promoteworker): LMDB's writer
    mutex is robust, so the mount process writes on, and the dead transaction's rows
    are not there (the round is redone)."""
    idx = NodeIndex.open(tmp_path)
    idx.add_promoted_many("ns", [Entry("before", "a" * 64, 1, 0o644, 1)])
    script = textwrap.dedent(f"""
        import os, signal
        from casfs.index.node_index import NodeIndex
        from casfs.store.entry import Entry
        idx = NodeIndex.open({str(tmp_path)!r})
        real = idx.env.write
        def write(fn):
            def dying(txn):
                fn(txn)  # the rows are put, the transaction is not committed
                print("inside", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return real(dying)
        idx.env.write = write
        idx.add_promoted_many("ns", [Entry("lost", "b" * 64, 1, 0o644, 1)])
    """)
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=60, env=dict(os.environ, PYTHONPATH=os.getcwd()),
                           check=False)
    assert child.stdout.strip() == "inside" and child.returncode == -9, child.stderr
    idx.add_promoted_many("ns", [Entry("after", "c" * 64, 1, 0o644, 1)])  # not blocked
    assert idx.get_promoted("ns", "after") is not None
    assert idx.get_promoted("ns", "before") is not None
    assert idx.get_promoted("ns", "lost") is None
    idx.close()
