"""A warm wait and a shared root that does not answer at the start (overlay mode).

The warm wait waits for the root within its bound (casfs.node.mount.MountService.
wait_warm; a stalled root that comes back: tests/faults/test_fleet_faults.py), and a
start held that long is said once on stderr, where the job's output goes
(casfs.node.worker._read_line)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from casfs.node import worker
from casfs.view import overlay
from tests.node.conftest import require_fuse


def _child(delay: float) -> tuple[subprocess.Popen[bytes], int]:
    r, w = os.pipe()
    code = f"import os, time; time.sleep({delay}); os.write({w}, b'READY\\n')"
    proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=[w])
    os.close(w)
    return proc, r


@pytest.mark.parametrize("delay, said", [(0.0, 0), (1.5, 1)])
def test_a_slow_ready_is_said_once(delay: float, said: int) -> None:
    proc, r = _child(delay)
    calls: list[float] = []
    try:
        line = worker._read_line(r, 30.0, proc, (0.4, lambda: calls.append(time.monotonic())))
    finally:
        os.close(r)
        proc.wait()
    assert line == "READY"
    assert len(calls) == said  # once, however long the wait goes on after it


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: connections are refused


@pytest.mark.fuse
@pytest.mark.slow
@pytest.mark.expect_log(r"shared root unavailable", r"shared root still unavailable")
def test_a_dead_root_holds_a_warm_wait_at_most_its_bound(tmp_path: Path) -> None:
    """An S3 root nobody answers: ``casfs run --mode overlay --wait-warm 6`` waits for it
    at most those seconds (plus one bounded open), says so on stderr, then runs the job
    with a cache of the node's own (a miss), which works and exits 0."""
    require_fuse()
    if (why := overlay.unavailable_reason()) is not None:
        pytest.fail(why)
    port = _closed_port()
    env = dict(os.environ, CASFS_ROOT=f"s3://casfs-dead/root?endpoint=http://127.0.0.1:{port}",
               AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y", AWS_REGION="us-east-1",
               AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               CASFS_STATE_DIR=str(tmp_path / "s"), CASFS_MOUNT_BASE=str(tmp_path / "mnt"),
               CASFS_SERVE_BASE=str(tmp_path / "serve"),
               CASFS_SOCKET=str(tmp_path / "no-casfsd.sock"))
    job = ("import os, time\nd = os.environ['TRITON_CACHE_DIR']\n"
           "open(os.path.join(d, 'k'), 'w').write('v')\n"
           "print('JOB', time.time(), open(os.path.join(d, 'k')).read())\n")
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--mode", "overlay",
                        "--family", "triton", "--wait-warm", "6", "--fetch-timeout", "2", "--",
                        sys.executable, "-c", job],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    started = float(p.stdout.split("JOB ", 1)[1].split()[0])
    assert p.stdout.split()[-1] == "v"
    # waited for the root (retried every 5 s), at most the bound and one open more
    assert 5.0 <= started - t0 <= 6.0 + 4.0 + 3.0, (started - t0, p.stderr[-2000:])
    notes = [ln for ln in p.stderr.splitlines() if "waiting for the cache to be local" in ln]
    assert len(notes) == 1 and "at most 6s" in notes[0], p.stderr[-2000:]
