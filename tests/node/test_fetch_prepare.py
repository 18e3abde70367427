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
