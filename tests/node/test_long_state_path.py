"""A state dir whose control socket path is longer than sun_path (108 bytes) still
mounts and answers (casfs.util.unixpath); it failed every mount with "AF_UNIX path
too long", and casfs run fell back to private caches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fuse


def test_casfs_run_with_a_state_dir_too_long_for_a_socket_path(tmp_path: Path) -> None:
    deep = tmp_path / ("s" * 60) / ("t" * 60)
    state = deep / "state"
    assert len(str(state / "run" / "casfs-host.sock")) > 108
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"), CASFS_STATE_DIR=str(state),
               CASFS_MOUNT_BASE=str(tmp_path / "mnt"))
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
                        "--stable-after", "0", "--", "/bin/sh", "-c",
                        'echo k > "$CASFS_CACHE_DIR/kernel.so"'],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "private" not in r.stderr and "1 published" in r.stderr, r.stderr
