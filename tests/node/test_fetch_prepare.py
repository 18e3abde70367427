"""The fetch worker opens a root ahead of its first fill (``prepare``), once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from casfs.errors import CasfsError
from casfs.node import fetchworker
from casfs.node.fetchproc import FetchWorker
from casfs.store.root import SharedRoot
from casfs.util.counters import Counters


def test_a_root_being_opened_is_waited_for_not_opened_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fill arriving while ``prepare`` opens its root uses that open (a second would
    be the client setup ``prepare`` was for, again, on the fetch's path)."""
    opened: list[str] = []

    def slow_open(spec: dict[str, Any], namespace: str) -> object:
        opened.append(namespace)
        time.sleep(0.3)
        return object()

    monkeypatch.setattr(fetchworker, "_open_root", slow_open)
    roots = fetchworker._Roots()
    got: list[object] = []
    spec = {"root": "s3://b/p", "marker": {"id": "x"}}
    threads = [threading.Thread(target=lambda: got.append(roots.get(dict(spec), "ns")[1]))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert opened == ["ns"]
    assert len(got) == 3 and got[0] is got[1] is got[2]
    assert roots.get(spec, "other")[1] is not got[0] and opened == ["ns", "other"]


def test_a_prepared_worker_fills_from_that_root(tmp_path: Path) -> None:
    """A real worker process: ``prepare`` answers, a bad root's says why and the worker
    serves on; a fill with the prepared spec gets the object."""
    root = SharedRoot.open(tmp_path / "root", create=True)
    put = root.objects.put_bytes(b"prepared bytes")
    spec = {"root": str(tmp_path / "root"), "tenant": None, "tenants": None, "timeout": 10.0}
    worker = FetchWorker(tmp_path / "objects")
    counters = Counters()
    try:
        assert worker.call({"op": "prepare", "root": spec, "ns": "ns"},
                           lambda: None, counters)["ok"] is True
        bad = dict(spec, root=str(tmp_path / "no-root"))
        with pytest.raises(CasfsError, match="no casfs shared root"):
            worker.call({"op": "prepare", "root": bad, "ns": "ns"}, lambda: None, counters)
        reply = worker.fill(put.digest, put.size, spec, "ns", None, lambda: None, counters)
        assert reply["n"] == put.size
        got = (tmp_path / "objects" / put.digest[:2] / put.digest[2:]).read_bytes()
        assert got == b"prepared bytes"
        assert worker.counters.snapshot().get("worker_starts") == 1  # served on
    finally:
        worker.close()


def test_a_pack_span_wider_than_any_pack_is_never_read_whole(tmp_path: Path) -> None:
    """A hostile manifest places two 9-byte members of one pack 1.5 GiB apart: the whole-
    namespace prefetch (fill_packs) read that span into memory in one piece (the worker
    at 3 GB, found by a review on 2026-12-06). Now each comes by itself, verified."""
    import struct

    import blake3

    from casfs.store.packloc import pack_key

    SharedRoot.open(tmp_path / "root", create=True)
    a, b = b"member-a\n", b"member-b\n"
    ma, mb = (b"CASF\x01\x00\x00\x00" + struct.pack("<Q", len(d)) + d for d in (a, b))
    pack = "ab" + "cd" * 31
    off_b = (3 << 29) - len(mb)  # 1.5 GiB, a sparse file: no disk taken
    path = tmp_path / "root" / pack_key(pack)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(ma)
        f.seek(off_b)
        f.write(mb)
    da, db = blake3.blake3(a).hexdigest(), blake3.blake3(b).hexdigest()
    spec = {"root": str(tmp_path / "root"), "tenant": None, "tenants": None, "timeout": 10.0}
    worker = FetchWorker(tmp_path / "objects")
    try:
        worker.call({"op": "fill_packs", "root": spec, "ns": "ns",
                     "objects": [[da, len(a), [pack, 0, len(ma)]],
                                 [db, len(b), [pack, off_b, len(mb)]]]},
                    lambda: None, Counters(), lambda one: None)
        for d, data in ((da, a), (db, b)):
            assert (tmp_path / "objects" / d[:2] / d[2:]).read_bytes() == data
        assert worker.pid is not None
        with open(f"/proc/{worker.pid}/status") as st:
            peak_kb = next(int(ln.split()[1]) for ln in st if ln.startswith("VmHWM:"))
        assert peak_kb < 400_000, f"the worker peaked at {peak_kb} kB"
    finally:
        worker.close()
