"""A mount process killed outright and not reaped yet (a zombie) is not a running mount.

Its parent reaps it late, or never (a container's init that does not): the
CLI must neither wait on it nor let it hide the node's healthy mounts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import Node

pytestmark = [pytest.mark.fuse]


def _cli(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(node.root),
                           "--state-dir", str(node.state), *args],
                          capture_output=True, text=True, timeout=300, check=False)


def _json(out: str) -> list[dict[str, Any]]:
    doc = json.loads(out)
    return doc if isinstance(doc, list) else [doc]


def _mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


@pytest.mark.expect_log(r"clearing a dead mount at ")
def test_a_zombie_mount_neither_fails_status_nor_holds_umount(cluster: dict[str, Any]) -> None:
    """Was: `casfs status` failed whole ("no answer on one.sock") though the other mount
    was healthy, and `casfs umount` of the dead one waited its whole timeout, then
    failed, leaving the dead FUSE mount (ENOTCONN) in place."""
    a: Node = cluster["a"]
    dead = a.mount(name="one", namespace="one", mountpoint=cluster["mnt"] / "one")
    live = a.mount(name="two", namespace="two", mountpoint=cluster["mnt"] / "two")
    os.kill(dead.proc.pid, signal.SIGKILL)  # not reaped: dead.proc is never waited here
    try:
        st = _cli(a, "status", "--json")
        assert st.returncode == 0, st.stderr
        assert [m["mountpoint"] for m in _json(st.stdout)] == [str(live.cfg.mountpoint)]
        um = _cli(a, "umount", "--timeout", "30", str(dead.cfg.mountpoint))
        assert um.returncode == 0, um.stderr
        assert not _mounted(dead.cfg.mountpoint)
        (live.cfg.mountpoint / "f").write_text("still served")
        assert (live.cfg.mountpoint / "f").read_text() == "still served"
    finally:
        a.workers.remove(dead)
        dead.proc.wait()
        subprocess.run(["fusermount3", "-u", "-z", str(dead.cfg.mountpoint)],
                       capture_output=True, check=False)


def test_a_stopped_mount_is_reported_unreachable_and_the_others_still_answer(
        cluster: dict[str, Any]) -> None:
    """Was: with one mount SIGSTOPped (a wedged process), `casfs status`, `stats` and
    `publish` each waited 60 s on it, then failed whole: no word on the healthy one."""
    a: Node = cluster["a"]
    stuck = a.mount(name="one", namespace="one", mountpoint=cluster["mnt"] / "one")
    live = a.mount(name="two", namespace="two", mountpoint=cluster["mnt"] / "two")
    os.kill(stuck.proc.pid, signal.SIGSTOP)
    try:
        st = _cli(a, "status", "--json")
        assert st.returncode == 1, st.stderr  # a script learns something is wrong
        got = {m["mountpoint"]: m for m in _json(st.stdout)}
        assert got[str(live.cfg.mountpoint)]["namespace"] == "two"
        assert got[str(stuck.cfg.mountpoint)]["unreachable"] is True
        text = _cli(a, "stats")
        assert f"one: UNREACHABLE at {stuck.cfg.mountpoint} (pid {stuck.proc.pid})" in (
            text.stdout), text.stdout + text.stderr
        assert f"two ({live.cfg.mountpoint}):" in text.stdout
    finally:
        os.kill(stuck.proc.pid, signal.SIGCONT)
