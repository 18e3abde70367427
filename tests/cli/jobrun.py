"""A job through a real ``casfs run`` on a fresh state, and what it published."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from casfs.store.root import SharedRoot


def run_job(tmp_path: Path, mode: str, job: str, *args: str,
            publish_interval: str = "60") -> str:
    """``job`` (Python source) run by ``casfs run --mode mode`` with promotion quick
    (stable_after 0.3 s); its stderr (the summary lines). Fails on a non-zero exit."""
    script = tmp_path / "job.py"
    script.write_text(job)
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"),
               CASFS_STATE_DIR=str(tmp_path / "a"), CASFS_MOUNT_BASE=str(tmp_path / "mnt"),
               CASFS_SOCKET=str(tmp_path / "no-daemon.sock"))
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
                        "--mode", mode, "--stable-after", "0.3", "--publish-interval",
                        publish_interval, "--python", sys.executable, "--", sys.executable,
                        str(script), *args],
                       env=env, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stderr


def published(tmp_path: Path, *names: str) -> dict[str, bytes]:
    """The bytes of ``names`` in the newest generation of the root's one namespace."""
    root = SharedRoot.open(tmp_path / "root")
    gens = root.generations()
    (ns,) = gens.namespaces()
    entries = gens.snapshot(gens.latest(ns)).entries
    return {n: root.objects.get_bytes(entries[n].digest) for n in names}
