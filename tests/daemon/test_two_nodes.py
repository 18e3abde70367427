"""Two daemons on one machine stand in for two nodes: one shared root, separate state dirs
and mount paths. What A publishes shows up in B's running mount, without restarting B."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from waiting import wait_until

from .conftest import Daemon

pytestmark = [pytest.mark.fuse, pytest.mark.slow]


def _pair(daemons: Callable[..., Daemon], tmp_path: Path,
          b_refresh: float) -> tuple[Daemon, Daemon]:
    root = tmp_path / "shared-root"
    a = daemons("a", [{"name": "kern", "family": "generic", "namespace": "shared-ns"}],
                root=root, defaults={"stable_after": 0.2, "publish_interval": 0.5})
    # B's NOTIFY_SOCKET is an abstract socket ("@name"), as systemd may hand out
    b = daemons("b", [{"name": "kern", "family": "generic", "namespace": "shared-ns"}],
                root=root, defaults={"stable_after": 0.2, "publish_interval": 0.5,
                                     "refresh_interval": b_refresh},
                notify_address=f"@casfs-test-{uuid.uuid4().hex}")
    assert a.mount_paths[0] != b.mount_paths[0]
    return a, b


def _worker_pid(d: Daemon) -> int:
    return int(d.status()[0]["pid"])


def test_live_refresh_shows_other_nodes_files(daemons: Callable[..., Daemon],
                                              tmp_path: Path) -> None:
    a, b = _pair(daemons, tmp_path, b_refresh=0.5)
    b_pid, b_worker = b.proc.pid, _worker_pid(b)  # type: ignore[union-attr]
    (a.mount_paths[0] / "x").mkdir()
    (a.mount_paths[0] / "x" / "kernel.cubin").write_bytes(b"compiled on node A")
    wait_until(lambda: a.published("shared-ns") == {"x/kernel.cubin"}, "A's publication",
               proc=a.proc)
    seen = b.mount_paths[0] / "x" / "kernel.cubin"
    wait_until(lambda: os.path.exists(seen), "A's file in B's mount", proc=b.proc)
    assert seen.read_bytes() == b"compiled on node A"
    assert "kernel.cubin" in os.listdir(b.mount_paths[0] / "x")
    # B was not restarted: same daemon, same worker
    assert b.proc is not None and b.proc.poll() is None and b.proc.pid == b_pid
    assert _worker_pid(b) == b_worker
    assert b.status()[0]["served_seq"] >= 1

    # a second publication by A appears too, and the first file is unchanged
    (a.mount_paths[0] / "y.json").write_text("second")
    seen2 = b.mount_paths[0] / "y.json"
    wait_until(lambda: os.path.exists(seen2), "A's second file in B's mount", proc=b.proc)
    assert seen2.read_text() == "second"
    assert seen.read_bytes() == b"compiled on node A"
    assert a.terminate() == 0 and b.terminate() == 0


def test_casfs_refresh_pulls_now(daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    a, b = _pair(daemons, tmp_path, b_refresh=3600)  # B never refreshes by itself
    (a.mount_paths[0] / "late.bin").write_bytes(b"from A")
    wait_until(lambda: a.published("shared-ns") == {"late.bin"}, "A's publication",
               proc=a.proc)
    assert b.status()[0]["served_seq"] == 0
    out = b.cli("refresh").stdout
    assert "serving generation 1" in out, out
    assert (b.mount_paths[0] / "late.bin").read_bytes() == b"from A"
    assert a.terminate() == 0 and b.terminate() == 0
