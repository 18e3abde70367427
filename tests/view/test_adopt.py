"""A SIGKILLed FUSE process's connection, held by a supervisor, served by a new process.

Real kernel, real pyfuse3 (tests/view/adoptfs.py), real processes: a job holds
a file open, has its cwd in the mount and has a read in flight when the
serving process is killed; the supervisor (this test) holds a dup of the
connection and starts an adopter (casfs.view.adopt). The job never sees
ENOTCONN: its held fd and cwd read the adopter's bytes, and the read in flight
gets EINTR, which Python retries into the adopter.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs.view.adopt import Adoption, synthetic_init

pytestmark = pytest.mark.fuse

FS = [sys.executable, str(Path(__file__).with_name("adoptfs.py"))]
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}

JOB = r"""
import json, os, sys, threading, time
mnt = sys.argv[1]
held = open(os.path.join(mnt, "hello"), "rb", buffering=0)
first = held.read(6)
os.chdir(mnt)
slow = {}
def read_slow():
    t0 = time.monotonic()
    try:
        with open("slow", "rb", buffering=0) as f:
            slow["bytes"] = f.read(6).decode()
    except OSError as e:
        slow["error"] = e.errno
    slow["s"] = time.monotonic() - t0
t = threading.Thread(target=read_slow, daemon=True)
t.start()
print("ready", first.decode(), flush=True)
sys.stdin.readline()
out = {"slow": slow}
for name, op in (("held", lambda: os.pread(held.fileno(), 6, 0)),
                 ("cwd", lambda: open("hello", "rb").read())):
    try:
        out[name] = op().decode()
    except OSError as e:
        out[name] = e.errno
t.join(10)
print(json.dumps(out), flush=True)
"""


def _connection(mnt: Path) -> str | None:
    """The mount's FUSE connection number, from mountinfo (a stat could wait on it)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(mnt):
            return fields[2].split(":")[1]
    return None


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[Path]:
    m = tmp_path / "mnt"
    m.mkdir()
    yield m
    conn = _connection(m)
    if conn is not None:  # whatever happened, nothing may wait on this mount
        ctl = Path("/sys/fs/fuse/connections")
        if not (ctl / conn).exists():
            subprocess.run(["mount", "-t", "fusectl", "none", str(ctl)], check=False)
        with contextlib.suppress(OSError):
            (ctl / conn / "abort").write_text("1")
        subprocess.run(["umount", "-l", str(m)], check=False)


def test_synthetic_init_is_one_whole_fuse_init() -> None:
    msg = synthetic_init()
    length, opcode, unique = int.from_bytes(msg[:4], "little"), msg[4], msg[8:16]
    assert length == len(msg) == 104 and opcode == 26
    assert int.from_bytes(unique, "little") % 2 == 0  # not an interrupt's id


def test_only_a_fuse_connection_is_adopted(tmp_path: Path) -> None:
    with open(tmp_path / "f", "w") as f, pytest.raises(ValueError, match="not a /dev/fuse"):
        Adoption(f.fileno())


@pytest.mark.parametrize("how", ["resend", "interrupt"])
def test_a_killed_process_connection_is_served_by_its_adopter(mnt: Path, how: str) -> None:
    sup, child = socket.socketpair()
    procs: list[subprocess.Popen[str]] = []
    try:
        old = subprocess.Popen([*FS, "serve", str(mnt), str(child.fileno())],
                               pass_fds=[child.fileno()], cwd="/", env=ENV, text=True)
        procs.append(old)
        sup.settimeout(20)
        _, fds, _, _ = socket.recv_fds(sup, 16, 1)
        held = fds[0]
        job = subprocess.Popen([sys.executable, "-c", JOB, str(mnt)], cwd="/", text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        procs.append(job)
        assert job.stdout is not None and job.stdin is not None
        assert job.stdout.readline().split() == ["ready", "AAAAAA"]
        time.sleep(0.3)  # the read of "slow" is in flight: the old process holds it

        old.send_signal(signal.SIGKILL)
        old.wait()
        t0 = time.monotonic()
        # The supervisor holds no file in the mount: a close in the child
        # between fork and exec would wait on the mount's server (FLUSH).
        new = subprocess.Popen([*FS, "adopt", str(held), str(mnt), how], pass_fds=[held],
                               cwd="/", env=ENV, text=True, stdout=subprocess.PIPE)
        procs.append(new)
        os.close(held)
        assert new.stdout is not None
        adopted = json.loads(new.stdout.readline())
        served_after = time.monotonic() - t0
        job.stdin.write("go\n")
        job.stdin.flush()
        out = json.loads(job.stdout.readline())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    print("adopted", adopted, "served after", round(served_after, 3), "s")
    if how == "resend":  # Linux 6.9+: the lost read is served again, no EINTR
        assert adopted["how"] == "resent", adopted
    else:
        assert adopted["first"] is not None
    assert out["held"] == "BBBBBB", out  # the job's open file survived the crash
    assert out["cwd"] == "BBBBBB", out  # and its cwd
    assert out["slow"].get("bytes") == "BBBBBB", out  # the lost read: EINTR, retried
    assert served_after < 5, served_after
