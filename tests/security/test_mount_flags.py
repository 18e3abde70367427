"""casfs's mounts never honour a setuid or setgid bit, nor open a device node: a JIT
cache holds no program that needs either. (Defence in depth: the lower's modes are
already masked to 0o777; the bits a job sets on its own files would still have run
with its ids, in a group's view with one member's ids for another.) FUSE mounts had
it from libfuse's defaults; overlay mode's overlay did not (a setuid-root file a
root job left there ran as root for any user, found on 2026-12-06). Real
``casfs run``s in fuse and overlay modes; the job reads its own cache directory's
mount options from /proc/self/mountinfo, and a setuid-root copy of ``id`` it makes
there runs with its caller's ids (another user's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.users import open_tmp, real_users

JOB = r"""
import json, os, shutil, subprocess, sys
d = os.path.realpath(os.environ["CASFS_CACHE_DIR"])
opts, at = None, ""
for line in open("/proc/self/mountinfo"):  # the mount the directory is on: the deepest
    f = line.split()  # mount point at or above it, the last one mounted there
    if (d == f[4] or d.startswith(f[4].rstrip("/") + "/")) and len(f[4]) >= len(at):
        opts, at = f[5], f[4]
shutil.copy("/usr/bin/id", d + "/id")
os.chmod(d + "/id", 0o6755)  # root's file: it would run as root
os.chmod(d, 0o755)
runner = ["setpriv", "--reuid=" + sys.argv[1], "--regid=" + sys.argv[1], "--clear-groups"]
got = subprocess.run(runner + [d + "/id", "-u"], capture_output=True, text=True)
euid = got.stdout.strip() or got.stderr.strip()
print(json.dumps({"opts": opts, "mode": os.stat(d + "/id").st_mode & 0o7777,
                  "euid": euid}))
"""


@pytest.mark.parametrize("mode", ["fuse", "overlay"])
def test_a_setuid_file_in_a_cache_never_runs_setuid(mode: str) -> None:
    with open_tmp() as d, real_users(1, d) as (user,):
        env = dict(os.environ, CASFS_ROOT=str(d / "root"), CASFS_STATE_DIR=str(d / "s"),
                   CASFS_MOUNT_BASE=str(d / "mnt"))
        r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family",
                            "generic", "--mode", mode, "--", sys.executable, "-c", JOB,
                            str(user.uid)], env=env, capture_output=True,
                           text=True, timeout=180, check=False, cwd=Path(d))
        assert r.returncode == 0, r.stderr[-3000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["opts"] is not None and "nosuid" in out["opts"].split(","), out
        assert "nodev" in out["opts"].split(","), out
        assert out["mode"] & 0o6000 == 0o6000  # the bits are kept...
        if mode == "fuse" and out["euid"].endswith("Permission denied"):
            return  # root's own view without allow_other: no other user enters it at all
        assert out["euid"] == str(user.uid)  # ...and never honoured
