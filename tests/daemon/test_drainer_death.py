"""A replaced mount process that dies while it drains (a review, 2026-12-06).

After a planned restart or a reload that changes a mount, the old process keeps
serving what jobs hold open on its detached mount ("draining"). Killed then
(kill -9, an OOM kill), before:

- after a reload, casfsd still held a copy of its FUSE connection (left on the
  replaced slot): nothing served it, and the job's next request (its ``close``)
  hung in D state, unkillable, until casfsd exited;
- fuse mode: the job's data in flight never reached the upper, and its successor,
  finding the drainer's writers file gone, published the torn file (0 bytes);
- overlay mode: overlayfs writes the upper without the process, so the job wrote
  on, but the successor published its file half-written (first writer kept).

Now the held connection goes with its worker; a dead FUSE drainer's files are held
as torn (not published; removed at release unless written again); a dead overlay
drainer's files stay unpublished while jobs write through its detached overlay.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from waiting import wait_until

from tests.daemon.conftest import Daemon, write_config

pytestmark = [pytest.mark.fuse, pytest.mark.slow]

OPTS = {"stable_after": 0.2, "publish_interval": 0.5, "refresh_interval": 3600.0}
HALF = 65536

# A job: writes half of a file through a held fd, waits for GO, writes the rest.
JOB = f"""
import json, os, sys, time
HALF = {HALF}
path, out = sys.argv[1], sys.argv[2]
res = {{"errors": []}}
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"A" * HALF)
open(out + ".half", "w").close()
while not os.path.exists(out + ".go"):
    time.sleep(0.02)
for what, call in (("write", lambda: os.write(fd, b"B" * HALF)), ("close", lambda: os.close(fd))):
    try:
        call()
    except OSError as e:
        res["errors"].append(what + ": " + str(e.errno))
json.dump(res, open(out, "w"))
"""


def _pid(d: Daemon) -> int:
    return int(next(m for m in d.status() if m["name"] == "m")["pid"])


def _fuse_fds(pid: int) -> int:
    fds = f"/proc/{pid}/fd"
    return sum(1 for x in os.listdir(fds) if os.readlink(f"{fds}/{x}") == "/dev/fuse")


def _published(d: Daemon, rel: str) -> bytes | None:
    r = subprocess.run([str(d.casfsd.parent / "casfs"), "cat", "testns", rel], env=d.env(),
                       capture_output=True, timeout=60)
    return r.stdout if r.returncode == 0 else None


@pytest.mark.expect_log(r"worker pid \d+ drained and exited \(status -9\)",
                        r"replaced mount process pid \d+ died with 1 files open for writing")
@pytest.mark.parametrize("mode", ["fuse", "overlay"])
def test_a_drainer_killed_under_a_writing_job(
        daemons: Callable[..., Daemon], tmp_path: Path, mode: str) -> None:
    mounts = [{"name": "m", "family": "generic", "namespace": "testns", "mode": mode}]
    d = daemons("a", mounts, defaults=dict(OPTS), node={"on_demand": False})
    assert d.proc is not None
    mp = d.mount_paths[0]
    res = tmp_path / "job.json"
    job = subprocess.Popen([sys.executable, "-c", JOB, str(mp / "torn.bin"), str(res)],
                           cwd="/")
    try:
        wait_until(lambda: Path(f"{res}.half").exists(), "the job's first half", proc=job)
        # A reload changing the mount: handed over, the old process drains the job's fd.
        old = _pid(d)
        write_config(d.config, root=d.root, state=d.state, mounts=mounts,
                     defaults={**OPTS, "stable_after": 0.25}, node={"on_demand": False})
        d.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "took over" in d.log() and _pid(d) != old, "the handover",
                   proc=d.proc)
        time.sleep(1.0)  # rounds of the successor's promotion see the drainer's writers
        assert _fuse_fds(d.proc.pid) == 1  # the successor's only: the old one let go
        os.kill(old, signal.SIGKILL)
        time.sleep(1.0)  # the successor's rounds run on without the drainer
        Path(f"{res}.go").touch()
        job.wait(timeout=30)  # before: hung in D state after a reload, for good
        errors = json.loads(res.read_text())["errors"]
        wait_until(lambda: "drained and exited (status -9)" in d.log(), "the death seen",
                   proc=d.proc)
        time.sleep(2.0)  # promotion rounds (stable_after 0.25, every 0.5 s)
        d.cli("publish")
        got = _published(d, "torn.bin")
        if mode == "overlay":  # the kernel's overlay wrote on: the whole file, once closed
            assert errors == [] and got == b"A" * HALF + b"B" * HALF, (errors, got and len(got))
        else:  # its connection ended: the job was told, and nothing torn was published
            assert errors, errors
            assert got is None, len(got)
            assert "died with 1 files open for writing" in d.log()
            # Written again through the successor: published as ever.
            (mp / "torn.bin").write_bytes(b"C" * 100)
            wait_until(lambda: _published(d, "torn.bin") == b"C" * 100,
                       "the rewrite published", proc=d.proc)
    finally:
        if job.poll() is None:
            job.kill()
