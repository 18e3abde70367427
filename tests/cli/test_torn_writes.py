"""A job killed while it writes a cache file must not publish the half-written file
(a linker's output, a file written in place): other nodes would load it as a hit.
Real ``casfs run`` processes, real FUSE mounts, real SIGKILLs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from casfs.store.root import SharedRoot

pytestmark = pytest.mark.fuse

# Writes a complete file, waits past stable_after, then half of another and is killed
# (by itself, or with casfs run by the test) in the middle of it.
JOB = """
import os, signal, sys, time
d = os.environ["CASFS_CACHE_DIR"]
os.makedirs(f"{d}/k", exist_ok=True)
with open(f"{d}/k/done.so", "wb") as f:
    f.write(b"complete" * 1000)
time.sleep(3.5)  # stable_after (2 s) and more: published whatever comes next
f = open(f"{d}/k/torn.so", "wb")
f.write(b"half" * 1000)
f.flush()
open(sys.argv[1], "w").close()  # tell the test
if sys.argv[2] == "self":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(300)
"""


def env_for(tmp: Path, node: str) -> dict[str, str]:
    return dict(os.environ, CASFS_ROOT=str(tmp / "root"), CASFS_STATE_DIR=str(tmp / node),
                CASFS_MOUNT_BASE=str(tmp / "mnt"), CASFS_SOCKET=str(tmp / "no-daemon.sock"))


def run_cmd(tmp: Path, *job: str) -> list[str]:
    script = tmp / "job.py"
    script.write_text(JOB)
    return [sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
            "--python", sys.executable, "--", sys.executable, str(script), *job]


def published(root: Path) -> dict[str, int]:
    gens = SharedRoot.open(root).generations()
    names = [n for n in gens.namespaces() if n.startswith("generic-")]
    if not names:
        return {}
    (ns,) = names
    return {p: e.size for p, e in gens.snapshot(gens.latest(ns)).entries.items()}


@pytest.mark.expect_log(
    r"a job was killed: \d+ files it may have been writing are not published",
)
def test_a_job_killed_mid_write_publishes_what_it_finished_only(tmp_path: Path) -> None:
    marker = tmp_path / "torn-written"
    r = subprocess.run(run_cmd(tmp_path, str(marker), "self"), env=env_for(tmp_path, "a"),
                       capture_output=True, text=True, timeout=300, check=False)
    assert marker.exists(), r.stderr[-3000:]
    assert r.returncode == 128 + signal.SIGKILL, r.stderr[-3000:]
    assert published(tmp_path / "root") == {"k/done.so": 8000}, r.stderr[-3000:]
    assert "files it may have been writing are not published" in (
        tmp_path / "a" / "log" / "host.log").read_text()
    # Not left on the node either: the next job here misses it, and publishes nothing of it.
    r = subprocess.run(
        [sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic", "--python",
         sys.executable, "--", "sh", "-c", 'test ! -e "$CASFS_CACHE_DIR/k/torn.so" && '
         'test -s "$CASFS_CACHE_DIR/k/done.so"'],
        env=env_for(tmp_path, "a"), capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert published(tmp_path / "root") == {"k/done.so": 8000}


@pytest.mark.expect_log(
    r"a job was killed: \d+ files it may have been writing are not published",
)
def test_casfs_run_killed_with_its_job_publishes_what_the_job_finished_only(
        tmp_path: Path) -> None:
    """A scheduler's kill takes casfs run and the job at once: the mount process (it
    outlives them) finds casfs run's lease gone without a release."""
    marker = tmp_path / "torn-written"
    p = subprocess.Popen(run_cmd(tmp_path, str(marker), "wait"), env=env_for(tmp_path, "a"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists()
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    log_path = tmp_path / "a" / "log" / "host.log"
    deadline = time.monotonic() + 120  # the lease check, the final publication, the exit
    while time.monotonic() < deadline and "casfs.view.session: unmounted" not in (
            log_path.read_text()):
        time.sleep(0.5)
    log = log_path.read_text()
    assert published(tmp_path / "root") == {"k/done.so": 8000}, log[-3000:]
    assert "files it may have been writing are not published" in log
