"""A file with two names rewritten through one: both names are published rewritten.

A review (2026-12-06): a job wrote ``a``, linked ``b`` to it and, once both were
promoted (not yet published), rewrote the file in place through one name. The job
and its node read the new bytes under both names; the published generation had the
other name's old bytes, in fuse mode (only the name written through was marked) and
dir mode (inotify names only that one). Real casfs run, real job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from casfs.store.root import SharedRoot

pytestmark = pytest.mark.fuse

JOB = """
import os, sys, time
d = os.environ["CASFS_CACHE_DIR"]
with open(os.path.join(d, "a"), "wb") as f:
    f.write(b"old-bytes")
os.link(os.path.join(d, "a"), os.path.join(d, "b"))
time.sleep(2.5)  # stable_after passes: both promoted (the interval is long)
with open(os.path.join(d, sys.argv[1]), "r+b") as f:
    f.write(b"NEW-BYTES")
time.sleep(1)
"""


@pytest.mark.parametrize("mode,through", [("fuse", "a"), ("fuse", "b"), ("dir", "a"),
                                          ("dir", "b"), ("overlay", "b")])
def test_a_rewrite_through_one_name_is_published_under_both(
        tmp_path: Path, mode: str, through: str) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"),
               CASFS_STATE_DIR=str(tmp_path / "a"), CASFS_MOUNT_BASE=str(tmp_path / "mnt"),
               CASFS_SOCKET=str(tmp_path / "no-daemon.sock"))
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
                        "--mode", mode, "--stable-after", "0.3", "--publish-interval", "60",
                        "--python", sys.executable, "--", sys.executable, str(script),
                        through],
                       env=env, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    root = SharedRoot.open(tmp_path / "root")
    gens = root.generations()
    (ns,) = gens.namespaces()
    entries = gens.snapshot(gens.latest(ns)).entries
    got = {name: root.objects.get_bytes(entries[name].digest) for name in ("a", "b")}
    assert got == {"a": b"NEW-BYTES", "b": b"NEW-BYTES"}, (got, r.stderr[-2000:])
