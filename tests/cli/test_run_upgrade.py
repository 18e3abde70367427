"""A newer casfs installed while ``casfs run`` jobs run (issue 25).

The node's mount process that the first ``casfs run`` started keeps serving
every job, the next ``casfs run`` of the newer code included (it leases from
the running process rather than starting its own): no job sees a change. The
newer code serves once that process has exited when idle, at the next job.
Real ``casfs run`` processes and FUSE mounts; "the newer release" is a copy of
this casfs changed in place, as an upgrade installed over the running one is.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import wait_until

pytestmark = [pytest.mark.fuse, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
HOLD = 'echo {name} > "$CASFS_CACHE_DIR/{name}.txt"; while [ ! -e {stop} ]; do sleep 0.05; done'


def _host_pid(state: Path) -> int | None:
    for p in (state / "run").glob("*.json"):
        try:
            info = json.loads(p.read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and info.get("host") and os.path.exists(
                f"/proc/{info.get('pid')}"):
            return int(info["pid"])
    return None


def test_a_newer_casfs_run_leases_from_the_running_host_then_starts_its_own(
        tmp_path: Path) -> None:
    from fusehelpers import lazy_unmount, require_fuse

    require_fuse()
    site = tmp_path / "site"
    shutil.copytree(REPO / "casfs", site / "casfs", ignore=shutil.ignore_patterns("__pycache__"))
    state = tmp_path / "state"
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"), CASFS_STATE_DIR=str(state),
               CASFS_MOUNT_BASE=str(tmp_path / "mnt"), CASFS_SERVE_BASE=str(tmp_path / "ns"),
               CASFS_SOCKET=str(tmp_path / "no-daemon.sock"), PYTHONPATH=str(site))

    def run(name: str, script: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
             "--namespace", "upg", "--publish-interval", "0.5", "--stable-after", "0.2",
             "--python", sys.executable, "--", "/bin/sh", "-c", script],
            env=env, cwd="/", stdout=open(tmp_path / f"{name}.out", "wb"),
            stderr=subprocess.STDOUT)

    jobs: list[subprocess.Popen[bytes]] = []
    try:
        jobs.append(run("one", HOLD.format(name="one", stop=tmp_path / "stop1")))
        wait_until(lambda: _host_pid(state) is not None, "the first job's host", timeout=60)
        old = _host_pid(state)
        assert old is not None
        # The first job runs (its file is written) before the second one looks for it:
        # the host serves before the job's command starts.
        wait_until(lambda: any((tmp_path / "ns").glob("*/upg/one.txt")), "the first job",
                   timeout=60)
        with open(site / "casfs" / "__init__.py", "a") as f:
            f.write("\n# an upgrade, installed while a job runs\n")
        two = run("two", 'cat "$CASFS_CACHE_DIR/one.txt" && echo two > "$CASFS_CACHE_DIR/two.txt"')
        jobs.append(two)
        assert two.wait(120) == 0, (tmp_path / "two.out").read_text()
        assert "one" in (tmp_path / "two.out").read_text()  # the same namespace, served live
        assert _host_pid(state) == old  # the newer casfs run leased from the running host
        (tmp_path / "stop1").touch()
        assert jobs[0].wait(120) == 0, (tmp_path / "one.out").read_text()
        wait_until(lambda: not os.path.exists(f"/proc/{old}"), "the old host's idle exit",
                   timeout=60)
        three = run("three", HOLD.format(name="three", stop=tmp_path / "stop3"))
        jobs.append(three)
        wait_until(lambda: _host_pid(state) not in (None, old), "the newer code's host",
                   timeout=60)
        (tmp_path / "stop3").touch()
        assert three.wait(120) == 0, (tmp_path / "three.out").read_text()
        four = run("four", 'cat "$CASFS_CACHE_DIR/one.txt" "$CASFS_CACHE_DIR/two.txt"'
                           ' "$CASFS_CACHE_DIR/three.txt"')
        jobs.append(four)
        assert four.wait(120) == 0, (tmp_path / "four.out").read_text()
        assert (tmp_path / "four.out").read_text().split()[:3] == ["one", "two", "three"]
    finally:
        for p in ("stop1", "stop3"):
            (tmp_path / p).touch()
        for j in jobs:
            if j.poll() is None:
                j.kill()
                j.wait()
        lazy_unmount(tmp_path / "ns")
