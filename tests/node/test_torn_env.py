"""A ``casfs env`` job killed mid-write never publishes its torn files (issue 21).

The lease of ``eval "$(casfs env)"`` is held by the job's shell, no child of casfs:
nobody reaps it, nobody says how it ended. The node's mount process learns it
from the kernel (casfs.node.procexit): a holder killed by a signal holds what its
namespaces changed just before, never published, removed at release; a holder
that exits cleanly publishes everything. A holder that died while no mount
process ran is unknown, and counts as killed.

Before: a casfs env lease's end was never a kill; the half-written file was
promoted and published for every node.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from casfs.node import control
from casfs.node.host import spawn_host

from .test_host import host_cfg, published

pytestmark = [pytest.mark.fuse, pytest.mark.skipif(
    os.geteuid() != 0, reason="the kernel tells root how any process ended")]

KILLED = r"a job was killed: \d+ files it may have been writing are not published"

# The job: lease with casfs env, finish one file, later write half of another and
# stay (the test kills it there), or finish it and exit 0.
JOB = ('set -e; eval "$("$PY" -m casfs.cli.main env --family generic --namespace "$NS")"\n'
       'mkdir -p "$CASFS_CACHE_DIR/k"\n'
       'echo finished > "$CASFS_CACHE_DIR/k/done.json"\n'
       'sleep 3\n'
       'printf "half of a linker output" > "$CASFS_CACHE_DIR/k/$LAST"\n'
       'touch "$FLAG"\n'
       'if [ "$END" = exit ]; then exit 0; fi\n'
       'exec sleep 600\n')


def job(node: dict[str, Any], ns: str, last: str, end: str) -> subprocess.Popen[bytes]:
    env = dict(node["env"], PY=sys.executable, NS=ns, LAST=last, END=end,
               FLAG=str(node["tmp"] / f"{ns}.flag"))
    p = subprocess.Popen(["sh", "-c", JOB], env=env, start_new_session=True)
    node["procs"].append(p)
    return p


@pytest.mark.expect_log(KILLED)
def test_a_killed_casfs_env_job_publishes_nothing_half_written(node: dict[str, Any]) -> None:
    # stable_after: done.json (3 s before the kill) is out of the hold, the half file in.
    w = spawn_host(host_cfg(node, grace=0.0, exit_when_idle=False, stable_after=1.0),
                   log_to_stderr=True)
    sock = w.cfg.socket_path
    try:
        killed = job(node, "killed", "torn.so", "kill")
        clean = job(node, "clean", "whole.so", "exit")
        wait_until(lambda: (node["tmp"] / "killed.flag").exists(), "the half write",
                   proc=w.proc)
        time.sleep(0.3)
        os.killpg(killed.pid, signal.SIGKILL)  # the shell holding the lease, and its job
        assert killed.wait() == -signal.SIGKILL
        assert clean.wait(timeout=60) == 0
        wait_until(lambda: not control.request(sock, "status")["namespaces"],
                   "both released", proc=w.proc, timeout=120)
    finally:
        w.stop()
    assert published(node["root"], "killed") == {"k/done.json": b"finished\n"}
    # Exited 0 right after its last write: everything is published.
    assert published(node["root"], "clean") == {"k/done.json": b"finished\n",
                                                "k/whole.so": b"half of a linker output"}
    upper = next(node["state"].rglob("upper"))
    assert not list(upper.rglob("torn.so"))  # removed: the next job misses it


@pytest.mark.expect_log(KILLED)
def test_a_holder_that_ended_while_no_mount_process_ran_counts_as_killed(
        node: dict[str, Any]) -> None:
    cfg = host_cfg(node, grace=0.0, exit_when_idle=False, stable_after=30.0)
    w = spawn_host(cfg, log_to_stderr=True)
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                              stdin=subprocess.PIPE)
    try:
        r = control.request(w.cfg.socket_path, "lease", pid=holder.pid,
                            caches=[{"family": "generic", "namespace": "alpha"}])
        path = Path(r["caches"][0]["path"])
        (path / "k").mkdir()
        (path / "k" / "torn.so").write_bytes(b"half of a linker's output")
        w.proc.kill()  # the node's mount process dies, its lease with it
        w.proc.wait()
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(cfg.base)], capture_output=True)
    assert holder.stdin is not None
    holder.stdin.close()
    assert holder.wait() == 0  # a clean end, but nobody was there to see it
    w = spawn_host(cfg, log_to_stderr=True)
    try:
        wait_until(lambda: not control.request(w.cfg.socket_path, "status")["namespaces"],
                   "alpha released after its holder", proc=w.proc, timeout=120)
    finally:
        w.stop()
    assert "k/torn.so" not in published(node["root"], "alpha")
