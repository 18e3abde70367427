"""Real mounts of whole nodes: spawned mount processes over a shared root in tmp dirs."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from casfs.node import control
from casfs.node.config import MountConfig
from casfs.node.worker import Worker, spawn


def require_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        if os.environ.get("CASFS_ALLOW_NO_FUSE") == "1":
            pytest.skip("no /dev/fuse (allowed by CASFS_ALLOW_NO_FUSE=1)")
        pytest.fail("/dev/fuse is missing: real-mount tests cannot run here")


class Node:
    """One simulated node: its own state dir, the shared root, mounts at fixed paths."""

    def __init__(self, name: str, root: Path, state: Path, mount_base: Path) -> None:
        self.name = name
        self.root = root
        self.state = state
        self.mount_base = mount_base
        self.workers: list[Worker] = []

    def config(self, family: str = "generic", namespace: str = "testns", **kw: Any) -> MountConfig:
        name = kw.pop("name", family)
        mountpoint = kw.pop("mountpoint", self.mount_base / family)
        # shutdown_timeout bounds the final publication: far past what a loaded CI
        # machine needs, so a slow stop publishes late instead of publishing less.
        # No read-ahead unless a test asks: most tests here count what one open fetches
        # (lazy restore, misses under faults); tests/node/test_readahead.py turns it on.
        # Nor a whole-namespace prefetch, for the same reason (tests of it set a budget).
        opts: dict[str, Any] = {"stable_after": 0.2, "publish_interval": 3600.0,
                                "refresh_interval": 3600.0, "shutdown_timeout": 120.0,
                                "readahead": False, "prefetch_budget": 0}
        opts.update(kw)
        return MountConfig(name=name, family=family, namespace=namespace, mountpoint=mountpoint,
                           root=self.root, state_dir=self.state, **opts)

    def mount(self, family: str = "generic", namespace: str = "testns", **kw: Any) -> Worker:
        require_fuse()
        w = spawn(self.config(family, namespace, **kw))
        self.workers.append(w)
        return w

    def ask(self, w: Worker, cmd: str) -> dict[str, Any]:
        return control.request(w.cfg.socket_path, cmd)

    def stop(self, w: Worker) -> dict[str, Any] | None:
        self.workers.remove(w)
        return w.stop()

    def stop_all(self) -> None:
        for w in list(self.workers):
            try:
                self.stop(w)
            finally:
                subprocess.run(["fusermount3", "-u", "-z", str(w.cfg.mountpoint)],
                               capture_output=True, check=False)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Two nodes (a, b) sharing one root; both mount at the same paths, one after the other."""
    root = tmp_path / "root"
    base = tmp_path / "mnt"
    nodes = {n: Node(n, root, tmp_path / f"state-{n}", base) for n in ("a", "b", "c")}
    try:
        yield {"root": root, "mnt": base, **nodes}
    finally:
        for n in nodes.values():
            n.stop_all()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """One node for the serving model (casfs run / casfs env), cleaned up whatever happens."""
    from fusehelpers import lazy_unmount

    from casfs.node.guard import mounts_at

    require_fuse()
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"),
               CASFS_STATE_DIR=str(tmp_path / "state"), CASFS_MOUNT_BASE=str(tmp_path / "mnt"))
    base = tmp_path / "mnt" / "ns"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield {"tmp": tmp_path, "env": env, "base": base, "root": tmp_path / "root",
               "state": tmp_path / "state", "procs": procs}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for _ in range(3):  # the FUSE mount, then the read-only guard under it
            lazy_unmount(base)
            if mounts_at(base):
                subprocess.run(["umount", "-l", str(base)], capture_output=True, check=False)
