"""Whole nodes over a shared root on a real S3 server (SeaweedFS): publish on one node,
read on another, concurrent publishers, and the server dying under a live mount."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from seaweed import SECRET_KEY, SeaweedServer
from waiting import wait_until

from casfs.errors import CasfsError
from casfs.store.root import SharedRoot
from casfs.util.location import parse_location
from node.conftest import Node

pytestmark = [pytest.mark.fuse, pytest.mark.slow]


def _published(url: str, ns: str = "testns") -> dict[str, Any]:
    gens = SharedRoot.open(url).generations()
    return gens.entries(ns).entries if gens.latest(ns) else {}


@pytest.fixture
def s3_cluster(s3_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    SharedRoot.open(s3_url, create=True)
    loc = parse_location(s3_url)
    base = tmp_path / "mnt"
    nodes = {n: Node(n, loc, tmp_path / f"state-{n}", base) for n in ("a", "b")}  # type: ignore[arg-type]
    try:
        yield {"url": s3_url, **nodes}
    finally:
        for n in nodes.values():
            n.stop_all()


def test_write_on_a_then_read_on_b_through_s3(s3_cluster: dict[str, Any]) -> None:
    a, b = s3_cluster["a"], s3_cluster["b"]
    w = a.mount()
    mp = w.cfg.mountpoint
    (mp / "KEY").mkdir()
    payload = os.urandom(300_000)
    (mp / "KEY" / "k.cubin").write_bytes(payload)
    (mp / "KEY" / "k.json").write_text('{"name": "k"}')
    a.stop(w)
    assert set(_published(s3_cluster["url"])) == {"KEY/k.cubin", "KEY/k.json"}
    wb = b.mount()
    assert (wb.cfg.mountpoint / "KEY" / "k.cubin").read_bytes() == payload
    assert (wb.cfg.mountpoint / "KEY" / "k.json").read_text() == '{"name": "k"}'
    st = b.ask(wb, "stats")
    assert st["counters"]["objects_fetched"] == 2
    assert SECRET_KEY not in str(st)  # status/stats never carry credentials
    # ... nor does any mount process's command line (visible to every user in /proc)
    for worker in b.workers:
        cmdline = Path(f"/proc/{worker.proc.pid}/cmdline").read_bytes()
        assert SECRET_KEY.encode() not in cmdline and b"s3://" not in cmdline


def test_two_nodes_publish_concurrently(s3_cluster: dict[str, Any], tmp_path: Path) -> None:
    a, b = s3_cluster["a"], s3_cluster["b"]
    wa = a.mount(mountpoint=tmp_path / "mnt-a")
    wb = b.mount(mountpoint=tmp_path / "mnt-b")
    for node, w in (("a", wa), ("b", wb)):
        for i in range(20):
            (w.cfg.mountpoint / f"{node}-{i}.bin").write_bytes(f"{node} {i}".encode() * 100)
    stops = [threading.Thread(target=n.stop, args=(w,)) for n, w in ((a, wa), (b, wb))]
    for t in stops:
        t.start()
    for t in stops:
        t.join()
    got = _published(s3_cluster["url"])
    assert set(got) == {f"{n}-{i}.bin" for n in "ab" for i in range(20)}


@pytest.mark.expect_log(
    r"unavailable, serving a miss: local object cache .*Error performing GET",
    r"promotion round failed \(will retry\): cannot reach the shared root",
    # The promotion worker opens its root when the mount serves (prepare), racing this
    # test's first read and kill: with it open, a round gets as far as the pack
    # locations and the pack's PUT, and says so instead (CI, once in many runs).
    r"cannot read pack locations of testns: .*Error performing GET",
    r"(cannot write a pack|writing a pack failed \(will retry\)).*Error performing PUT",
)
def test_server_down_mid_mount_is_a_miss_and_publication_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = SeaweedServer(tmp_path / "weed")  # its own server: this test kills it
    srv.start()
    try:
        srv.create_bucket("casfs-down")
        for k, v in srv.env().items():
            monkeypatch.setenv(k, v)
        url = f"s3://casfs-down/root?endpoint={srv.endpoint}"
        root = SharedRoot.open(url, create=True)
        from casfs.store.entry import Entry

        files = {f"f{i}": os.urandom(5000 + i) for i in range(4)}
        ents = [Entry(p, root.objects.put_bytes(d).digest, len(d), 0o644, 0)
                for p, d in files.items()]
        assert root.generations().publish("testns", ents, node="seed").seq == 1
        node = Node("b", parse_location(url), tmp_path / "state-b", tmp_path / "mnt")  # type: ignore[arg-type]
        try:
            w = node.mount(fetch_timeout=3.0, shutdown_timeout=60.0, publish_interval=0.5)
            mp = w.cfg.mountpoint
            assert (mp / "f0").read_bytes() == files["f0"]  # a hit while the server is up
            srv.kill()
            # Server gone: an unfetched object is a miss (ENOENT), never EIO or a hang.
            with pytest.raises(OSError) as e:
                (mp / "f1").read_bytes()
            assert e.value.errno == errno.ENOENT
            assert (mp / "f0").read_bytes() == files["f0"]  # cached: still served
            (mp / "new.txt").write_bytes(b"written while the store is down")
            assert (mp / "new.txt").read_bytes() == b"written while the store is down"
            st = node.ask(w, "stats")
            assert st["counters"].get("fetch_errors", 0) >= 1
            srv.launch()  # back: the pending publication goes through, retried by the mount

            def published_new() -> bool:
                with contextlib.suppress(CasfsError, OSError):  # the server warming up
                    return "new.txt" in _published(url)
                return False

            wait_until(published_new, "the publication retried once the server is back",
                       timeout=300, interval=0.5)
            node.stop(w)
        finally:
            node.stop_all()
        got = SharedRoot.open(url).generations().entries("testns").entries
        assert "new.txt" in got and set(files) <= set(got)
    finally:
        srv.kill()


def test_packed_objects_served_by_a_mount_and_after_its_restart(
    s3_cluster: dict[str, Any], tmp_path: Path
) -> None:
    from casfs.families import rules
    from casfs.promote.importer import import_tree

    src = tmp_path / "src"
    files = {f"k{i % 3}/f{i}.ptx": os.urandom(500 + 37 * i) for i in range(24)}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    root = SharedRoot.open(s3_cluster["url"])
    rep = import_tree(root, src, "testns", rules=rules("generic"), node="seed")
    assert rep.packs == 1  # an s3:// root packs small files by default
    b = s3_cluster["b"]
    w = b.mount()
    names = sorted(files)
    for rel in names[:12]:
        assert (w.cfg.mountpoint / rel).read_bytes() == files[rel]
    assert b.ask(w, "stats")["counters"]["packed_reads"] == 12  # ranged GETs, verified
    b.stop(w)
    w = b.mount()  # restarted: its index is warm, no manifest re-read until a fetch needs it
    for rel in names[12:]:
        assert (w.cfg.mountpoint / rel).read_bytes() == files[rel]
    assert b.ask(w, "stats")["counters"]["packed_reads"] == 12


@pytest.mark.expect_log(
    r"rejected object: object \w+: unknown object format version",
    r"unavailable, serving a miss: object \w+: unknown object format version",
    r"unavailable, serving a miss: no answer from the shared root",
)
def test_hung_server_and_wrong_bytes_are_misses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    import boto3

    from casfs.store.entry import Entry
    from casfs.store.objects import object_key

    srv = SeaweedServer(tmp_path / "weed")  # its own server: this test freezes it
    srv.start()
    try:
        srv.create_bucket("casfs-slow")
        for k, v in srv.env().items():
            monkeypatch.setenv(k, v)
        url = f"s3://casfs-slow/root?endpoint={srv.endpoint}"
        root = SharedRoot.open(url, create=True)
        files = {f"f{i}": os.urandom(4000 + i) for i in range(4)}
        ents = [Entry(p, root.objects.put_bytes(d).digest, len(d), 0o644, 0)
                for p, d in files.items()]
        assert root.generations().publish("testns", ents, node="seed").seq == 1
        # wrong bytes under f1's name: the server returns them, casfs must refuse them
        boto3.client("s3", endpoint_url=srv.endpoint).put_object(
            Bucket="casfs-slow", Key=f"root/{object_key(ents[1].digest)}", Body=b"CASF" + b"x" * 40)
        node = Node("b", parse_location(url), tmp_path / "state-b", tmp_path / "mnt")  # type: ignore[arg-type]
        try:
            w = node.mount(fetch_timeout=3.0)
            mp = w.cfg.mountpoint
            assert (mp / "f0").read_bytes() == files["f0"]
            with pytest.raises(OSError) as e:
                (mp / "f1").read_bytes()
            assert e.value.errno == errno.ENOENT  # wrong bytes: a miss, never served
            assert srv.proc is not None
            os.killpg(srv.proc.pid, signal.SIGSTOP)  # the server hangs: accepts, never answers
            try:
                with pytest.raises(OSError) as e:
                    (mp / "f2").read_bytes()
                assert e.value.errno == errno.ENOENT  # a fetch timeout: a miss, not a hang
                assert (mp / "f0").read_bytes() == files["f0"]  # cached: still served
            finally:
                os.killpg(srv.proc.pid, signal.SIGCONT)
            st = node.ask(w, "stats")["counters"]
            assert st.get("rejections", 0) >= 1  # f1
            # f2: the client's own request timeout (= fetch_timeout) or the view's
            timed_out = sum(st.get(k, 0) for k in ("fetch_errors", "fetch_timeouts", "fetch_slow"))
            assert timed_out >= 2, sorted(st.items())
            # The server answers again: a cold read hits, no remount (the fetch worker)
            assert (mp / "f3").read_bytes() == files["f3"]
            node.stop(w)
        finally:
            node.stop_all()
    finally:
        srv.kill()


@pytest.mark.expect_log(
    r"rejected object: object \w+: content does not match its name",
    r"unavailable, serving a miss: object \w+: content does not match its name",
)
def test_promoted_packs_are_verified_on_lazy_fetch_through_s3(
        s3_cluster: dict[str, Any]) -> None:
    """Promotion writes small files into packs; another node's lazy fetch of a packed
    object reads its byte range and verifies it: a damaged member is a miss (ENOENT)."""
    from tests.fusehelpers import corrupt_pack_member

    a, b = s3_cluster["a"], s3_cluster["b"]
    # Only the publication's round promotes: a periodic round catching some of the
    # files mid-write (stable_after 0.2 s, a loaded machine) wrote a second pack.
    w = a.mount(stable_after=3600.0)
    files = {f"KEY{i % 3}/f{i}.ptx": os.urandom(900 + 41 * i) for i in range(12)}
    files["big.so"] = os.urandom(300_000)  # over SMALL_OBJECT: stays loose
    for rel, data in files.items():
        (w.cfg.mountpoint / rel).parent.mkdir(parents=True, exist_ok=True)
        (w.cfg.mountpoint / rel).write_bytes(data)
    assert a.ask(w, "publish")["ok"]
    assert a.ask(w, "stats")["counters"]["packs_promoted"] == 1
    a.stop(w)
    rows = _published(s3_cluster["url"])
    assert set(rows) == set(files)
    assert all((rows[r].extras or {}).get("pack") for r in files if r != "big.so")
    assert not (rows["big.so"].extras or {}).get("pack")
    bad = "KEY1/f4.ptx"
    corrupt_pack_member(s3_cluster["url"], "testns", bad)
    wb = b.mount()
    for rel, data in files.items():
        if rel != bad:
            assert (wb.cfg.mountpoint / rel).read_bytes() == data
    with pytest.raises(OSError) as e:
        (wb.cfg.mountpoint / bad).read_bytes()
    assert e.value.errno == errno.ENOENT  # wrong bytes from a pack: a miss, never served
    c = b.ask(wb, "stats")["counters"]
    assert c["packed_reads"] >= 12 and c["rejections"] >= 1


@pytest.mark.expect_log(
    r"shared root unavailable, serving local state only: cannot reach the shared root",
)
def test_a_hung_server_at_mount_start_holds_the_start_briefly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """I4: a server that accepts and never answers when a mount starts (a job's
    `casfs run`) delays mount-ready by the root's short open bound, not the whole
    fetch timeout; once it answers again the mount reopens the root and hits."""
    import signal

    from casfs.node.rootlink import ROOT_OPEN_TIMEOUT
    from casfs.store.entry import Entry

    srv = SeaweedServer(tmp_path / "weed")  # its own server: this test freezes it
    srv.start()
    try:
        srv.create_bucket("casfs-hung")
        for k, v in srv.env().items():
            monkeypatch.setenv(k, v)
        url = f"s3://casfs-hung/root?endpoint={srv.endpoint}"
        root = SharedRoot.open(url, create=True)
        data = os.urandom(5000)
        ent = Entry("f", root.objects.put_bytes(data).digest, len(data), 0o644, 0)
        assert root.generations().publish("testns", [ent], node="seed").seq == 1
        node = Node("b", parse_location(url), tmp_path / "state-b", tmp_path / "mnt")  # type: ignore[arg-type]
        fetch_timeout = 9.0
        assert srv.proc is not None
        try:
            os.killpg(srv.proc.pid, signal.SIGSTOP)
            try:
                w = node.mount(fetch_timeout=fetch_timeout, refresh_interval=1.0)
                ready = node.ask(w, "stats")["mount_ready_s"]
                # without the open bound the start waited fetch_timeout on the marker
                assert ready < fetch_timeout - 1, ready
                assert fetch_timeout - 1 > ROOT_OPEN_TIMEOUT
                with pytest.raises(OSError) as e:
                    (w.cfg.mountpoint / "f").read_bytes()
                assert e.value.errno == errno.ENOENT  # nothing served yet: a miss
            finally:
                os.killpg(srv.proc.pid, signal.SIGCONT)
            # the server answers again: a refresh reopens the root and serves generation 1
            wait_until(lambda: node.ask(w, "stats").get("served_seq") == 1, what="served gen 1")
            assert (w.cfg.mountpoint / "f").read_bytes() == data
            node.stop(w)
        finally:
            node.stop_all()
    finally:
        srv.kill()
