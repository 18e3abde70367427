"""casfs run killed outright (SIGKILL) while its job runs on.

A scheduler, an OOM kill or a user may kill the wrapper and not the job: the
job's cache directory must stay served until the job itself ends (I2: never
ENOENT/EROFS on its own cache directory), and what it writes is published.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import wait_until

from casfs.errors import CasfsError
from casfs.node import client, control

from .conftest import require_fuse

pytestmark = [pytest.mark.fuse]

JOB = r"""
import os, pathlib, sys, time
d = pathlib.Path(os.environ["CASFS_CACHE_DIR"])
out = pathlib.Path(sys.argv[1])
(d / "early").write_bytes(b"early")
(out / "started").write_text(str(os.getpid()))
while not (out / "go").exists():
    time.sleep(0.05)
try:
    (d / "late").write_bytes(b"late bytes")
    got = (d / "late").read_bytes() + b"|" + (d / "early").read_bytes()
    (out / "result").write_bytes(got)
except OSError as e:
    (out / "result").write_text(f"error: {e}")
while not (out / "exit").exists():
    time.sleep(0.05)
"""


def test_job_keeps_its_caches_when_casfs_run_is_killed(tmp_path: Path) -> None:
    """Was: the node's mount process followed only `casfs run`'s own pid: once that was
    killed the namespace was released and unmounted under the running job, whose next
    write into its cache directory failed (ENOENT; EROFS on the guard below)."""
    require_fuse()
    out = tmp_path / "out"
    out.mkdir()
    state = tmp_path / "state"
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"), CASFS_STATE_DIR=str(state),
               CASFS_MOUNT_BASE=str(tmp_path / "mnt"))
    run = subprocess.Popen([sys.executable, "-m", "casfs.cli.main", "run", "--family",
                            "generic", "--namespace", "killed", "--stable-after", "0.2", "--",
                            sys.executable, "-c", JOB, str(out)],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    job_pid = 0
    try:
        job_pid = int(wait_until(lambda: (out / "started").exists()
                                 and (out / "started").read_text(), "the job's start",
                                 proc=run))
        run.send_signal(signal.SIGKILL)
        run.wait()
        log = state / "log" / "host.log"

        def noticed() -> bool:
            """The mount process has dealt with casfs run's death: it released the
            namespace (the bug), or it holds it for the job alone."""
            if "released killed" in log.read_text():
                return True
            try:
                st = control.request(client.host_socket(state), "status")
            except (CasfsError, OSError):
                return False
            return [ns["holders"] for ns in st.get("namespaces", [])] == [[job_pid]]

        wait_until(noticed, "the mount process to notice casfs run's death")
        (out / "go").touch()
        result = wait_until(lambda: (out / "result").exists() and (out / "result").read_bytes(),
                            "the job's result")
        assert result == b"late bytes|early"

        def published() -> set[str]:
            cli = [sys.executable, "-m", "casfs.cli.main"]
            subprocess.run([*cli, "publish"], env=env, capture_output=True, timeout=120,
                           check=False)
            ls = subprocess.run([*cli, "ls", "--json", "killed"], env=env,
                                capture_output=True, text=True, timeout=120, check=False)
            return {row["path"] for row in json.loads(ls.stdout or "[]")}

        # Published while the job runs. (Once casfs run is gone nobody can tell
        # whether the job was killed: what it wrote last before it ends is not.)
        wait_until(lambda: published() == {"early", "late"}, "the job's files published")
        (out / "exit").touch()
        wait_until(lambda: "nothing left to serve" in log.read_text(),
                   "the mount process to stop once the job has ended")
        assert published() == {"early", "late"}
    finally:
        if run.poll() is None:
            run.kill()
        if job_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(job_pid, signal.SIGKILL)


# Spawns its command as a child subreaper that never reaps: what a container's init
# that does not reap looks like to the processes under it.
NO_REAP = r"""
import ctypes, os, subprocess, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
run = subprocess.Popen(sys.argv[2:])
open(sys.argv[1], "w").write(str(run.pid))
while not os.path.exists(sys.argv[1] + ".done"):
    time.sleep(0.05)
"""


def test_an_orphaned_job_that_ends_unreaped_releases_its_caches(tmp_path: Path) -> None:
    """casfs run killed, then its job ends under an init that never reaps it (a zombie).

    Was: the zombie counted as a live process, so its lease held the namespace for
    ever: never released nor published at release, the mount process never exited.
    """
    require_fuse()
    out = tmp_path / "out"
    out.mkdir()
    state = tmp_path / "state"
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"), CASFS_STATE_DIR=str(state),
               CASFS_MOUNT_BASE=str(tmp_path / "mnt"))
    pidfile = tmp_path / "run.pid"
    job = JOB.replace('(d / "late")', '(d / "unused")')
    reaper = subprocess.Popen([sys.executable, "-c", NO_REAP, str(pidfile), sys.executable,
                               "-m", "casfs.cli.main", "run", "--family", "generic",
                               "--namespace", "killed", "--stable-after", "0.2", "--",
                               sys.executable, "-c", job, str(out)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (out / "started").exists() and pidfile.exists()
                   and pidfile.read_text(), "the job's start", proc=reaper)
        os.kill(int(pidfile.read_text()), signal.SIGKILL)  # casfs run: a zombie now
        (out / "go").touch()
        wait_until(lambda: (out / "result").exists(), "the job's last write")
        (out / "exit").touch()  # the job ends: a zombie too, its parent never reaps
        log = state / "log" / "host.log"
        wait_until(lambda: "nothing left to serve" in log.read_text(),
                   "the mount process to release the dead job's caches")
    finally:
        pidfile.with_name("run.pid.done").touch()
        reaper.wait(timeout=120)


def test_a_stopped_mount_process_is_asked_once_then_the_job_runs(tmp_path: Path) -> None:
    """The node's mount process stopped (SIGSTOP: what a wedged one looks like): a new
    job waits one CASFS_LEASE_TIMEOUT for its lease, then runs with a private cache.

    Was: the stuck socket was asked again on each of 5 tries, each waiting the full
    lease timeout: 10 minutes before the job started (by default).
    """
    require_fuse()
    out = tmp_path / "out"
    out.mkdir()
    state = tmp_path / "state"
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"), CASFS_STATE_DIR=str(state),
               CASFS_MOUNT_BASE=str(tmp_path / "mnt"), CASFS_LEASE_TIMEOUT="5")
    cli = [sys.executable, "-m", "casfs.cli.main"]
    first = subprocess.Popen([*cli, "run", "--family", "generic", "--namespace", "first", "--",
                              sys.executable, "-c", JOB, str(out)],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    host = 0
    try:
        wait_until(lambda: (out / "started").exists(), "the first job's start", proc=first)
        host = json.loads((state / "run" / "host.json").read_text())["pid"]
        os.kill(host, signal.SIGSTOP)
        job = "import os; print(os.environ['CASFS_CACHE_DIR'])"
        r = subprocess.run([*cli, "run", "--family", "generic", "--namespace", "second", "--",
                            sys.executable, "-c", job],
                           env=env, capture_output=True, text=True, timeout=300, check=False)
        assert r.returncode == 0, r.stderr
        assert "casfs-private-" in r.stdout, (r.stdout, r.stderr)
        assert "(a stopped or stuck mount process?)" in r.stderr, r.stderr
    finally:
        if host:
            os.kill(host, signal.SIGCONT)
        for name in ("go", "exit"):
            (out / name).touch()
        first.wait(timeout=300)
