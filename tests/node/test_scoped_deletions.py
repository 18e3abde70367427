"""Issue 8 item 8 through the real CLI: a job that clears its cache does not blind later jobs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fuse


def _logs(tmp_path: Path) -> str:
    """The node's mount process logs, for a failure message (this test once failed
    under load with no clue: k/a ENOENT in the third job, no lookup miss counted)."""
    return "".join(f"\n--- {p}\n{p.read_text(errors='replace')[-6000:]}"
                   for p in sorted((tmp_path / "state").glob("log/*.log")))


def casfs_run(tmp_path: Path, script: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"),
               CASFS_STATE_DIR=str(tmp_path / "state"), CASFS_MOUNT_BASE=str(tmp_path / "mnt"))
    return subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
                           "--stable-after", "0.2", *extra, "--", "sh", "-c", script],
                          env=env, capture_output=True, text=True, timeout=120, check=False)


def test_rm_rf_by_one_job_is_not_seen_by_the_next(tmp_path: Path) -> None:
    """Each `casfs run` is one activation of the namespace (dir mode: test_dir_mode.py)."""
    mode = "fuse"
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")
    r = casfs_run(tmp_path, 'mkdir -p "$CASFS_CACHE_DIR/k" && echo kernel > "$CASFS_CACHE_DIR/k/a"'
                  ' && echo top > "$CASFS_CACHE_DIR/b"', "--mode", mode)
    assert r.returncode == 0 and "2 published" in r.stderr, r.stderr
    # The second job clears the cache, as `rm -rf $TRITON_CACHE_DIR/*` does, and
    # sees it empty for the rest of its run.
    r = casfs_run(tmp_path, 'rm -rf "$CASFS_CACHE_DIR"/* && test -z "$(ls -A "$CASFS_CACHE_DIR")"'
                  ' && echo mine > "$CASFS_CACHE_DIR/c"', "--mode", mode)
    assert r.returncode == 0, r.stderr
    # The third job finds the cluster's cache again (and the second job's file).
    r = casfs_run(tmp_path, 'cat "$CASFS_CACHE_DIR/k/a" "$CASFS_CACHE_DIR/b" "$CASFS_CACHE_DIR/c"',
                  "--mode", mode)
    assert r.returncode == 0, r.stderr + _logs(tmp_path)
    assert r.stdout.split() == ["kernel", "top", "mine"]
