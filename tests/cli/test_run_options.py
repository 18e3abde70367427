"""casfs run's numeric options: a bad one is argparse's one line, before anything starts.

`--publish-interval -1` (or nan, or `--refresh-interval nan`) was accepted: the node's
mount process died of a trio ValueError, the job's write got ECONNABORTED and
`casfs run` still exited 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(("flag", "value"), [
    ("--publish-interval", "-1"), ("--publish-interval", "nan"), ("--refresh-interval", "nan"),
    ("--refresh-interval", "0"), ("--stable-after", "inf"), ("--stable-after", "-2"),
    ("--fetch-timeout", "inf"), ("--wait-warm", "inf")])
def test_a_bad_number_is_one_line_and_nothing_starts(tmp_path: Path, flag: str,
                                                     value: str) -> None:
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"),
               CASFS_STATE_DIR=str(tmp_path / "state"), CASFS_MOUNT_BASE=str(tmp_path / "mnt"))
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
                        flag, value, "--", "true"], env=env, capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"casfs run: error: argument {flag}: must be a number"
        f" {'>=' if flag in ('--stable-after', '--wait-warm') else '>'} 0: {value}")
    assert not (tmp_path / "state").exists()  # refused before any mount process


def test_good_numbers_are_taken(tmp_path: Path) -> None:
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"),
               CASFS_STATE_DIR=str(tmp_path / "state"), CASFS_MOUNT_BASE=str(tmp_path / "mnt"))
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
                        "--mode", "dir", "--publish-interval", "0.5", "--stable-after", "0",
                        "--refresh-interval", "2", "--", "true"], env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
