"""SIGKILL of casfsd's mount processes under jobs: the connection is served on.

casfsd holds a dup of the FUSE connection of each fuse mode worker and of the
node's mount process for on-demand namespaces (casfs.node.fuseconn); when one
dies it starts a new one with that connection (casfs.view.adopt), which
restores the dead process's inode numbers and open handles from their
journals (casfs.view.op_restore; the host: casfs.view.mux's handle table and
slot layout too). Real casfsd, real mount, 16 reader processes, each with a
file held open, a mapped ``.so``, an append-only log held open for writing and
its cwd in the mount, reading, listing, creating and writing in a loop while
the process is killed twice: a configured fuse mode mount; an overlay mode
mount whose files are published ones this node never had (so every open,
lookup and listing below the overlay reaches its FUSE layer, the process that
dies); and two leased namespaces of the node's host (8 readers each). What
they may see: nothing but right bytes; no error of any kind, and nothing
written is lost. The longest wait is printed (``-s``), not asserted.
"""

from __future__ import annotations

import contextlib
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

from .conftest import Daemon

pytestmark = [pytest.mark.fuse, pytest.mark.slow]

FAST = {"stable_after": 0.5, "publish_interval": 1.0, "refresh_interval": 1.0}
READERS = 16
KILLS = 2
HEALTHY_AFTER = 10.0  # casfs.daemon.supervisor: an adopter must have served this long

READER = r"""
import errno, json, mmap, os, sys, time
mnt, stop, ident = sys.argv[1], sys.argv[2], sys.argv[3]
DATA = bytes(range(256)) * 1024
so_bytes = open(os.path.join(mnt, "lib.so"), "rb").read()
held = os.open(os.path.join(mnt, "data.bin"), os.O_RDONLY)
so = open(os.path.join(mnt, "lib.so"), "rb")
mm = mmap.mmap(so.fileno(), 0, prot=mmap.PROT_READ)
log_path = os.path.join(mnt, f"w-{ident}.log")
w = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.chdir(os.path.join(mnt, "sub"))
errors, ok, wrong, lines, created, slowest, i = {}, 0, [], 0, 0, 0.0, 0

def check(name, got, want):
    global ok
    if got == want:
        ok += 1
    else:
        wrong.append(name)

print("ready", flush=True)
while not os.path.exists(stop):
    i += 1
    off = (i * 4096) % len(DATA)
    t = time.monotonic()
    step = "held"
    try:
        check("held", os.pread(held, 4096, off), DATA[off:off + 4096])
        step = "mmap"
        o2 = (i * 8192) % len(so_bytes)
        check("mmap", mm[o2:o2 + 4096], so_bytes[o2:o2 + 4096])
        step = "cwd"
        with open("f.txt", "rb") as f:
            check("cwd", f.read(), b"in sub\n")
        step = "path"
        with open(os.path.join(mnt, "data.bin"), "rb") as f:
            check("path", f.read(4096), DATA[:4096])
        step = "list"
        check("list", "f.txt" in os.listdir("."), True)
        step = "write"
        os.write(w, b"line %d\n" % lines)
        lines += 1
        if i % 10 == 0:
            step = "create"
            name = f"new-{ident}-{i}"
            with open(name, "wb") as f:
                f.write(name.encode())
            with open(name, "rb") as f:
                check("created", f.read(), name.encode())
            created += 1
    except OSError as e:
        what = step + " " + errno.errorcode.get(e.errno, str(e.errno))
        errors[what] = errors.get(what, 0) + 1
    slowest = max(slowest, time.monotonic() - t)
    time.sleep(0.002)
os.close(w)
print(json.dumps({"ok": ok, "wrong": wrong, "errors": errors, "lines": lines,
                  "created": created, "slowest_s": round(slowest, 3)}), flush=True)
"""


def _worker_pid(d: Daemon, where: str) -> int | None:
    if where == "on_demand":  # the host's namespaces (their "path"), all one process
        pids = {int(m["pid"]) for m in d.status() if m.get("path") and m.get("pid")}
        return pids.pop() if len(pids) == 1 else None
    m = next((m for m in d.status() if m.get("name") == "kern"), {})
    return int(m["pid"]) if m.get("state", "up") == "up" and m.get("pid") else None


def _lease(d: Daemon, build: str) -> tuple[subprocess.Popen[str], Path]:
    """A job holding a lease on its stack's namespace: (its process, the path)."""
    env = dict(d.env(), CASFS_BUILD_KEY=build,
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    job = subprocess.Popen(["sh", "-c", 'eval "$(casfs env --family generic)" && '
                            'echo "$CASFS_CACHE_DIR" && exec sleep 600'],
                           env=env, stdout=subprocess.PIPE, text=True)
    assert job.stdout is not None
    return job, Path(job.stdout.readline().strip())


def _abort(under: Path) -> None:
    """Whatever happened, nothing may wait on a mount under ``under`` (fusectl abort)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4].startswith(str(under)) and fields[8].startswith("fuse"):
            ctl = Path("/sys/fs/fuse/connections")
            conn = fields[2].split(":")[1]
            if not (ctl / conn).exists():
                subprocess.run(["mount", "-t", "fusectl", "none", str(ctl)], check=False)
            with contextlib.suppress(OSError):
                (ctl / conn / "abort").write_text("1")


def _files(at: Path) -> None:
    (at / "data.bin").write_bytes(bytes(range(256)) * 1024)
    (at / "lib.so").write_bytes(os.urandom(200_000))
    (at / "sub").mkdir()
    (at / "sub" / "f.txt").write_bytes(b"in sub\n")


@pytest.mark.expect_log(
    r"worker pid \d+ killed by signal 9; restarting: a new process serves its connection",
    # on_demand: the lease holders are SIGKILLed at the end, which is a killed job's end
    # (said if the host sees it before casfsd stops: a race of the teardown).
    r"a job was killed: \d+ files it may have been writing are not published",
)
@pytest.mark.parametrize("where", ["configured", "overlay", "on_demand"])
def test_killed_worker_connection_is_served_on(daemons: Callable[..., Daemon],
                                               tmp_path: Path, where: str) -> None:
    mount = {"name": "kern", "family": "generic", "namespace": "kern-test"}
    if where == "overlay":
        mount["mode"] = "overlay"
    d = daemons("a", [mount], defaults=FAST, start=where != "overlay")
    if where == "overlay":  # published by another node: below the overlay, in FUSE
        (tmp_path / "src").mkdir()
        _files(tmp_path / "src")
        subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(d.root),
                        "--state-dir", str(tmp_path / "other-node"), "import",
                        str(tmp_path / "src"), "-n", "kern-test"], check=True, timeout=300,
                       capture_output=True)
        d.start()
    jobs: list[subprocess.Popen[str]] = []
    dirs = [] if where == "on_demand" else [d.mount_paths[0]]
    if where == "on_demand":
        for build in ("stack-1", "stack-2"):  # two namespaces: two slots of one connection
            job, path = _lease(d, build)
            jobs.append(job)
            dirs.append(path)
        assert len({str(p) for p in dirs}) == 2 and _worker_pid(d, where), d.status()
    for mnt in dirs:
        if where != "overlay":
            _files(mnt)
    stop = tmp_path / "stop"
    readers: list[subprocess.Popen[str]] = []
    results = []
    killed = []
    try:
        for n in range(READERS):
            readers.append(subprocess.Popen([sys.executable, "-c", READER,
                                             str(dirs[n % len(dirs)]), str(stop), str(n)],
                                            cwd="/", text=True, stdout=subprocess.PIPE))
        for r in readers:
            assert r.stdout is not None and r.stdout.readline().strip() == "ready"
        for k in range(KILLS):
            time.sleep(1.0 if k == 0 else HEALTHY_AFTER + 1)
            pid = _worker_pid(d, where)
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            wait_until(lambda p=pid: (_worker_pid(d, where) or p) != p, "the adopter serves",
                       timeout=60, proc=d.proc)
        time.sleep(2.0)  # the readers go on against the last adopter
        stop.write_text("")
        for r in readers:
            out, _ = r.communicate(timeout=60)
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        stop.write_text("")
        if any(r.poll() is None for r in readers):
            _abort(tmp_path)  # a failure must not leave the suite waiting on the mount
        for p in readers + jobs:
            if p.poll() is None:
                p.kill()
                p.wait()
    print(where, "readers:", json.dumps(results))
    log = d.log()
    for pid in killed:
        assert f"serves the connection of pid {pid}" in log, log[-3000:]
    assert "cleared the dead mount" not in log
    for r in results:
        assert r["errors"] == {}, r  # no ENOTCONN, ECONNABORTED, EIO, ESTALE, EROFS...
        assert r["wrong"] == [], r
        assert r["ok"] > 0 and r["created"] > 0
    # Every line written through a held fd, across both crashes, is in its file.
    for n, r in enumerate(results):
        text = (dirs[n % len(dirs)] / f"w-{n}.log").read_bytes()
        assert text == b"".join(b"line %d\n" % i for i in range(r["lines"])), n
    assert d.terminate() == 0
