"""A namespace the host releases gives back the fds it kept: its object cache's
idle shared fds (a long-lived host attaches and releases a namespace for every
job: what one release keeps open, the next jobs' releases add to)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from casfs.errors import NotFoundError
from casfs.node import control
from casfs.node.host import HostConfig, spawn_host
from casfs.store.root import SharedRoot

from .test_host import end, sleeper

pytestmark = [pytest.mark.fuse]

FILES = 12


def _published(root: Path, ns: str) -> int:
    r = SharedRoot.open(root)
    try:
        return len(r.generations().entries(ns).entries)
    except NotFoundError:
        return 0


def _cfg(node: dict[str, Any], name: str) -> HostConfig:
    return HostConfig(base=node["tmp"] / name / "ns", root=node["root"],
                      state_dir=node["tmp"] / name / "state", stable_after=0.2,
                      publish_interval=3600.0, refresh_interval=3600.0, grace=0.0,
                      lease_poll=0.1, exit_when_idle=False, shutdown_timeout=120.0)


def _cycle(sock: Path, body: Any) -> None:
    """One job: lease alpha, run ``body`` on its directory, end; wait for the release."""
    job = sleeper()
    try:
        r = control.request(sock, "lease", pid=job.pid,
                            caches=[{"family": "generic", "namespace": "alpha"}])
        assert r["ok"], r
        body(Path(r["caches"][0]["path"]))
        end(job)
    finally:
        job.kill()
        job.wait()
    wait_until(lambda: not control.request(sock, "status")["namespaces"], "alpha's release")


def _settled(sock: Path) -> None:
    """Wait for the lease check that releases alpha to end (alpha leaves the status
    at the start of its release): checks take turns, and a release can wait for one."""
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        r = control.request(sock, "lease", pid=job.pid,
                            caches=[{"family": "generic", "namespace": "other"}])
        assert r["ok"], r
        assert control.request(sock, "release", lease=r["lease"], wait=True)["ok"]
    finally:
        job.kill()
        job.wait()


def _object_fds(pid: int) -> Counter[str]:
    fds = (os.readlink(f"/proc/{pid}/fd/{f}") for f in os.listdir(f"/proc/{pid}/fd"))
    return Counter(t for t in fds if "/state/objects/" in t)


def test_a_released_namespace_closes_its_idle_object_fds(node: dict[str, Any]) -> None:
    data = {f"f{i}": bytes([i]) * 100_000 for i in range(FILES)}  # loose objects, not packed
    writer = spawn_host(_cfg(node, "a"), log_to_stderr=True)
    reader = spawn_host(_cfg(node, "b"), log_to_stderr=True)
    try:
        def write(p: Path) -> None:
            for name, b in data.items():
                (p / name).write_bytes(b)
        _cycle(writer.cfg.socket_path, write)
        wait_until(lambda: _published(node["root"], "alpha") == FILES, "alpha's publication")

        def read(p: Path) -> None:
            for name, b in data.items():
                assert (p / name).read_bytes() == b  # from this node's object cache
        for _ in range(3):
            _cycle(reader.cfg.socket_path, read)
        _settled(reader.cfg.socket_path)
        left = _object_fds(reader.proc.pid)
        assert not left, f"{sum(left.values())} fds of {len(left)} objects"  # nothing serves alpha
    finally:
        reader.stop()
        writer.stop()
