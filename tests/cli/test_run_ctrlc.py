"""A terminal's Ctrl-C under ``casfs run`` reaches the job once.

The job is in casfs run's process group, the terminal's foreground group: the
kernel sends the Ctrl-C to both. casfs run forwarded its copy too, so a job that
saves a checkpoint on Ctrl-C was interrupted again while saving (a review: a
traceback, exit 130, no checkpoint). Run under a real pseudo-terminal here.
"""

from __future__ import annotations

import os
import pty
import select
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.fuse]

JOB = """
import os, signal, sys, time
if sys.argv[1:] == ["own-group"]:
    os.setpgrp()  # out of the terminal's group: only casfs run can pass Ctrl-C on
hits = []
signal.signal(signal.SIGINT, lambda n, f: hits.append(time.monotonic()))
print("ready", flush=True)
end = time.monotonic() + 30
while not hits and time.monotonic() < end:
    time.sleep(0.02)
time.sleep(1.0)  # "saving the checkpoint": a second Ctrl-C would land here
print(f"interrupts={len(hits)}", flush=True)
"""


def _read_until(fd: int, want: bytes, timeout: float) -> bytes:
    out = b""
    end = time.monotonic() + timeout
    while want not in out and time.monotonic() < end:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the terminal's other side closed
                break
            if not chunk:
                break
            out += chunk
    return out


@pytest.mark.parametrize("group", ["shared", "own-group"])
def test_a_terminal_ctrl_c_reaches_the_job_once(tmp_path: Path, group: str) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"),
               CASFS_STATE_DIR=str(tmp_path / "a"), CASFS_MOUNT_BASE=str(tmp_path / "mnt"),
               CASFS_SOCKET=str(tmp_path / "no-daemon.sock"))
    argv = [sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
            "--python", sys.executable, "--", sys.executable, str(script), group]
    pid, fd = pty.fork()  # the child: a session of its own, this terminal its own
    if pid == 0:
        os.execvpe(argv[0], argv, env)
    try:
        out = _read_until(fd, b"ready", 120)
        assert b"ready" in out, out.decode(errors="replace")[-2000:]
        os.write(fd, b"\x03")  # Ctrl-C, as typed: the line discipline signals the group
        out += _read_until(fd, b"interrupts=", 60)
        out += _read_until(fd, b"casfs: ", 60)  # casfs run's summary after the job
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    text = out.decode(errors="replace")
    assert "interrupts=1" in text, text[-2000:]
    assert os.waitstatus_to_exitcode(status) == 0, text[-2000:]
