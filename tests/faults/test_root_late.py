"""A root that failed to open at a mount's start is tried once more by the final
publication, even within the retry pause: a short job on a loaded node (a first open
that creates an S3 root took over the 3 s bound) had its files left unpublished,
its summary line saying only "0 promoted, 0 published"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fusehelpers import MountedView

from casfs.store.root import SharedRoot
from tests.node.conftest import Node

pytestmark = [pytest.mark.fuse, pytest.mark.expect_log(
    r"shared root unavailable, serving local state only",
)]


def test_the_final_publication_retries_a_root_that_failed_at_start(tmp_path: Path) -> None:
    served = MountedView(tmp_path / "empty", tmp_path / "root-store", tmp_path / "rootfs")
    (tmp_path / "empty").mkdir()
    with served:
        root = tmp_path / "rootfs" / "root"
        r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "init", str(root)],
                           capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode == 0, r.stderr
        assert served.proc is not None
        node = Node("n", root, tmp_path / "state", tmp_path / "mnt")
        os.kill(served.proc.pid, signal.SIGSTOP)  # the root hangs while the mount starts
        try:
            w = node.mount(fetch_timeout=2.0)
            assert node.ask(w, "status")["root_available"] is False
            (w.cfg.mountpoint / "kernel.so").write_bytes(b"compiled")
        finally:
            os.kill(served.proc.pid, signal.SIGCONT)
        time.sleep(0.5)  # promoted and published by nothing yet: the root is "down"
        st = node.stop(w)  # the job ends well within the root's retry pause
        assert st is not None and st["last_publish"]["ok"], st
        gens = SharedRoot.open(root).generations()
        assert "kernel.so" in gens.entries("testns").entries
