"""A shared root that stops answering, through real mounts (issue 8, I2 and I4).

The root lives on a FUSE filesystem (casfs.view.testserve) whose server is
then stopped with SIGSTOP: every access to the root blocks, as on a hard NFS
mount whose server died. A job's read of a file not cached on the node must
become ENOENT within fetch_timeout; cached files keep being served.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fusehelpers import MountedView

from tests.node.conftest import Node

pytestmark = [pytest.mark.fuse, pytest.mark.expect_log(
    r"serving a miss: no answer from the shared root",
    r"shared root unavailable, serving local state only: root-open:.*no answer within",
    r"the shared root answered none of the last 3 fetches",
    r"fetch worker \d+: \d+ requests got nothing for \d+s \(a stuck shared root\?\)",
)]


@contextlib.contextmanager
def _seeded_root(tmp_path: Path, files: dict[str, bytes]) -> Iterator[tuple[Path, MountedView]]:
    """A shared root holding ``files`` (namespace testns), on a FUSE file system whose
    server (``served.proc``) the test can SIGSTOP."""
    served = MountedView(tmp_path / "empty", tmp_path / "root-store", tmp_path / "rootfs")
    (tmp_path / "empty").mkdir()
    with served:
        root = tmp_path / "rootfs" / "root"
        src = tmp_path / "src"
        src.mkdir()
        for rel, data in files.items():
            (src / rel).write_bytes(data)
        r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(root),
                            "--state-dir", str(tmp_path / "seed"), "import", str(src), "-n",
                            "testns"], capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode == 0, r.stderr
        yield root, served


def test_stalled_root_is_a_bounded_miss(tmp_path: Path) -> None:
    files = {"warm": b"w" * 4000, "cold": b"c" * 4000}
    with _seeded_root(tmp_path, files) as (root, served):
        node = Node("n", root, tmp_path / "state", tmp_path / "mnt")
        w = node.mount(fetch_timeout=2.0)
        mp = w.cfg.mountpoint
        try:
            assert (mp / "warm").read_bytes() == files["warm"]
            assert served.proc is not None
            os.kill(served.proc.pid, signal.SIGSTOP)  # the root stops answering
            try:
                t = time.monotonic()
                res = subprocess.run(["cat", str(mp / "cold")], capture_output=True,
                                     timeout=30, check=False)
                waited = time.monotonic() - t
                assert res.returncode != 0 and b"No such file" in res.stderr, res.stderr
                assert waited < 10, waited  # I4: bounded by fetch_timeout, not the root
                assert (mp / "warm").read_bytes() == files["warm"]  # cached: still served
            finally:
                os.kill(served.proc.pid, signal.SIGCONT)
            assert node.ask(w, "stats")["counters"]["fetch_timeouts"] == 1
        finally:
            node.stop_all()


def test_a_job_opening_many_cold_files_of_a_stalled_root_waits_in_full_only_at_first(
        tmp_path: Path) -> None:
    """I4 for a whole job (casfs.view.breaker): a root that stops answering costs the
    job's first three cold opens the full fetch_timeout, the rest about a second each,
    not 6 x fetch_timeout; once the root answers, a cold read hits."""
    files = {f"cold{i}": bytes([65 + i]) * 4000 for i in range(7)}
    with _seeded_root(tmp_path, files) as (root, served):
        node = Node("n", root, tmp_path / "state", tmp_path / "mnt")
        w = node.mount(fetch_timeout=4.0)
        mp = w.cfg.mountpoint
        try:
            assert served.proc is not None
            os.kill(served.proc.pid, signal.SIGSTOP)
            waits = []
            try:
                for i in range(6):
                    t = time.monotonic()
                    res = subprocess.run(["cat", str(mp / f"cold{i}")], capture_output=True,
                                         timeout=30, check=False)
                    waits.append(time.monotonic() - t)
                    assert res.returncode != 0 and b"No such file" in res.stderr, res.stderr
            finally:
                os.kill(served.proc.pid, signal.SIGCONT)
            assert all(w >= 4.0 for w in waits[:3]) and all(w < 3.5 for w in waits[3:]), waits
            counters = node.ask(w, "stats")["counters"]
            assert counters["fetch_timeouts"] == 3 and counters["fetch_breaker_misses"] == 3
            assert (mp / "cold6").read_bytes() == files["cold6"]  # the root answers: a hit
        finally:
            node.stop_all()


def test_root_stalled_at_mount_start_delays_ready_briefly(tmp_path: Path) -> None:
    """I4: a mount started while the root blocks every access (a dead hard NFS mount)
    is ready within the root's open bound and serves a miss; when the root answers
    again a refresh opens it and serves the published files."""
    from waiting import wait_until

    with _seeded_root(tmp_path, {"cold": b"c" * 4000}) as (root, served):
        node = Node("n", root, tmp_path / "state", tmp_path / "mnt")
        assert served.proc is not None
        try:
            os.kill(served.proc.pid, signal.SIGSTOP)  # the root stops answering
            try:
                w = node.mount(fetch_timeout=9.0, refresh_interval=1.0)
                st = node.ask(w, "stats")
                # without the bound the start blocked until the root answered again
                assert st["mount_ready_s"] < 8, st["mount_ready_s"]
                assert not st["root_available"]
                res = subprocess.run(["cat", str(w.cfg.mountpoint / "cold")],
                                     capture_output=True, timeout=30, check=False)
                assert res.returncode != 0 and b"No such file" in res.stderr, res.stderr
            finally:
                os.kill(served.proc.pid, signal.SIGCONT)
            wait_until(lambda: node.ask(w, "stats")["served_seq"] == 1, what="generation 1")
            assert (w.cfg.mountpoint / "cold").read_bytes() == b"c" * 4000
        finally:
            node.stop_all()


@pytest.mark.expect_log(r"final publication did not finish within \d+s")
def test_a_final_publication_the_root_stalled_is_said_in_the_final_stats(
        tmp_path: Path) -> None:
    """The root stops answering as a job's cache is released: the final publication
    gives up at shutdown_timeout, and the final stats (what `casfs run`'s summary line
    reads) say NOT PUBLISHED and why (a review: "5 promoted, 0 published", the reason
    only in the mount process's log)."""
    from casfs.cli.summary import _not_published

    with _seeded_root(tmp_path, {"seed": b"s" * 100}) as (root, served):
        node = Node("n", root, tmp_path / "state", tmp_path / "mnt")
        w = node.mount(fetch_timeout=2.0, shutdown_timeout=3.0)
        (w.cfg.mountpoint / "new.so").write_bytes(b"n" * 5000)
        assert served.proc is not None
        os.kill(served.proc.pid, signal.SIGSTOP)
        try:
            stats = node.stop(w)
        finally:
            os.kill(served.proc.pid, signal.SIGCONT)
            node.stop_all()
    assert stats is not None
    line = _not_published(stats.get("last_publish") or {})
    assert "NOT PUBLISHED: the final publication did not finish within 3s" in line, stats
