"""The fetch worker: shared-root reads run in a child of the mount process (issue 8).

A mount process serves FUSE; its fetch worker (casfs.node.fetchworker) fills
the local object cache from the shared root. These tests kill and wedge that
worker during real reads through a real mount and check what the job sees:

* I1/I2: a worker killed mid-fetch is replaced and the fetch is sent again:
  the job gets the correct bytes; a worker that dies on every fetch costs a
  miss (ENOENT), never EIO or ENOTCONN; the FUSE connection stays up.
* I4 and recovery: a wedged worker (SIGSTOP, as a stuck S3 client) or a
  stalled root costs misses bounded by the fetch timeout; the hung worker is
  replaced, so once the root answers again cold reads hit, without remount.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fusehelpers import MountedView
from waiting import wait_until

from tests.node.conftest import Node

pytestmark = [pytest.mark.fuse, pytest.mark.expect_log(
    r"fetch worker \d+: (its connection closed|\d+ requests got nothing)",
    # The watchdog's poll can see a killed worker's exit before its reader sees EOF.
    r"fetch worker \d+ died \(exit status -9\)",
    r"fetch worker connection: ",
    r"unavailable, serving a miss: ",
    r"the shared root answered none of the last 3 fetches",
)]

FILES = {f"d/f{i}": bytes([65 + i]) * (3000 + i) for i in range(6)}


def _import(root: Path, tmp_path: Path, env: dict[str, str] | None = None) -> None:
    src = tmp_path / "src"
    for rel, data in FILES.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(root),
                        "--state-dir", str(tmp_path / "seed"), "import", str(src), "-n",
                        "testns"], capture_output=True, text=True, timeout=120, check=False,
                       env=env)
    assert r.returncode == 0, r.stderr


def _worker(node: Node, w: Any) -> dict[str, Any]:
    return node.ask(w, "status")["fetch_worker"] or {}


def _fills_in_flight(state: Path) -> bool:
    return any(p.name.startswith(".tmp-fill-") for p in (state / "objects").glob("*/*"))


def _read(path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["cat", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@contextmanager
def _root_on_fuse(tmp_path: Path) -> Iterator[tuple[Path, MountedView]]:
    """A shared root on a FUSE filesystem whose server the test can SIGSTOP."""
    (tmp_path / "empty").mkdir()
    served = MountedView(tmp_path / "empty", tmp_path / "root-store", tmp_path / "rootfs")
    with served:
        yield tmp_path / "rootfs" / "root", served


def test_worker_killed_mid_fetch_job_gets_the_bytes(tmp_path: Path) -> None:
    """I1, I2: kill -9 of the fetch worker while it waits on the root: the fetch is
    sent again to a fresh worker and the job reads the right bytes."""
    with _root_on_fuse(tmp_path) as (root, served):
        _import(root, tmp_path)
        node = Node("n", root, tmp_path / "state", tmp_path / "mnt")
        w = node.mount(fetch_timeout=10.0)
        mp = w.cfg.mountpoint
        try:
            mount_pid = node.ask(w, "status")["pid"]
            first = wait_until(lambda: _worker(node, w).get("pid"), "a fetch worker")
            assert (mp / "d/f1").read_bytes() == FILES["d/f1"]  # the worker opened the root
            assert served.proc is not None
            os.kill(served.proc.pid, signal.SIGSTOP)  # the fetch waits inside the worker
            try:
                reader = _read(mp / "d/f0")
                wait_until(lambda: _fills_in_flight(tmp_path / "state"), "the worker's fill")
                os.kill(first, signal.SIGKILL)
            finally:
                os.kill(served.proc.pid, signal.SIGCONT)
            out, err = reader.communicate(timeout=30)
            assert reader.returncode == 0, err
            assert out == FILES["d/f0"]  # I1
            st = _worker(node, w)
            assert st["pid"] not in (None, first) and st["worker_deaths"] >= 1
            assert node.ask(w, "status")["pid"] == mount_pid  # the FUSE process lived on
            for rel, data in FILES.items():  # everything else through the new worker
                assert (mp / rel).read_bytes() == data
        finally:
            node.stop_all()


def test_worker_dying_on_every_fetch_is_a_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                               ) -> None:
    """I2: a fetch that kills its worker each time (a crashing decoder, an OOM kill) is
    ENOENT for the job after one retry; the mount serves on, cached files included."""
    root = tmp_path / "root"
    _import(root, tmp_path)
    node = Node("n", root, tmp_path / "state", tmp_path / "mnt")
    w = node.mount(fetch_timeout=10.0)
    mp = w.cfg.mountpoint
    try:
        assert (mp / "d/f1").read_bytes() == FILES["d/f1"]  # cached before the poison
        node.stop_all()
        monkeypatch.setenv("CASFS_CRASHPOINT", "fetch-worker")  # every worker fill dies
        w = node.mount(fetch_timeout=10.0)
        mount_pid = node.ask(w, "status")["pid"]
        res = subprocess.run(["cat", str(mp / "d/f2")], capture_output=True, timeout=60,
                             check=False)
        assert res.returncode != 0 and b"No such file" in res.stderr, res.stderr  # I2
        assert (mp / "d/f1").read_bytes() == FILES["d/f1"]  # local: no worker needed
        st = node.ask(w, "status")
        assert st["pid"] == mount_pid
        assert st["counters"]["fetch_worker_lost"] >= 1
        assert st["fetch_worker"]["worker_deaths"] >= 2
    finally:
        node.stop_all()


def test_wedged_worker_is_replaced_and_cold_reads_hit_again(tmp_path: Path) -> None:
    """I4 and recovery: a stopped worker (a stuck client) costs misses within the fetch
    timeout; it is replaced after hang_after, and cold reads hit again, no remount."""
    root = tmp_path / "root"
    _import(root, tmp_path)
    node = Node("n", root, tmp_path / "state", tmp_path / "mnt")
    w = node.mount(fetch_timeout=2.0)  # hang_after = max(2 * 2, 5) = 5 s
    mp = w.cfg.mountpoint
    try:
        first = wait_until(lambda: _worker(node, w).get("pid"), "a fetch worker")
        os.kill(first, signal.SIGSTOP)
        readers = [_read(mp / f"d/f{i}") for i in range(3)]
        for r in readers:
            _, err = r.communicate(timeout=30)
            assert r.returncode != 0 and b"No such file" in err, err  # I2, never EIO
        st = wait_until(lambda: (s := _worker(node, w)).get("worker_hangs") and s.get("pid") and s,
                        "the hung worker's replacement")
        assert st["pid"] != first
        assert (mp / "d/f5").read_bytes() == FILES["d/f5"]  # a cold read hits again
    finally:
        node.stop_all()


def test_stalled_root_recovers_without_remount(tmp_path: Path) -> None:
    """I4 and recovery: more cold reads of a stalled root than there are fetch threads
    all miss within the timeout; once the root answers, cold reads hit again."""
    with _root_on_fuse(tmp_path) as (root, served):
        _import(root, tmp_path)
        node = Node("n", root, tmp_path / "state", tmp_path / "mnt")
        w = node.mount(fetch_timeout=2.0)
        mp = w.cfg.mountpoint
        try:
            first = wait_until(lambda: _worker(node, w).get("pid"), "a fetch worker")
            assert served.proc is not None
            os.kill(served.proc.pid, signal.SIGSTOP)
            try:
                readers = [_read(mp / f"d/f{i}") for i in range(5)]
                for r in readers:
                    _, err = r.communicate(timeout=30)
                    assert r.returncode != 0 and b"No such file" in err, err
                wait_until(lambda: _worker(node, w).get("pid") not in (None, first),
                           "the hung worker's replacement")
            finally:
                os.kill(served.proc.pid, signal.SIGCONT)
            assert (mp / "d/f5").read_bytes() == FILES["d/f5"]
        finally:
            node.stop_all()
