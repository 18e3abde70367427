"""What a killed job may have left half-written is removed from the upper when its
namespace is released; a namespace whose last job was killed is released at once,
not after the host's grace: a job leasing it meanwhile would read those files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from casfs.node import control
from casfs.node.host import spawn_host

from .test_host import host_cfg

pytestmark = [pytest.mark.fuse]


@pytest.mark.expect_log(
    r"a job was killed: \d+ files it may have been writing are not published",
)
def test_a_killed_jobs_torn_file_is_gone_for_the_next_job_within_the_grace(
        node: dict[str, Any]) -> None:
    # stable_after: what the job wrote before its kill is in the hold window, however
    # slow this machine is.
    w = spawn_host(host_cfg(node, grace=3600.0, exit_when_idle=False, stable_after=30.0),
                   log_to_stderr=True)
    sock = w.cfg.socket_path
    alpha = [{"family": "generic", "namespace": "alpha"}]
    jobs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            for _ in range(2)]
    try:
        # casfs run's own lease (run=True): its holder dying unreleased means killed.
        r = control.request(sock, "lease", pid=jobs[0].pid, caches=alpha, run=True)
        path = Path(r["caches"][0]["path"])
        (path / "k").mkdir()
        (path / "k" / "torn.so").write_bytes(b"half of a linker's output")
        jobs[0].kill()
        jobs[0].wait()
        wait_until(lambda: not control.request(sock, "status")["namespaces"],
                   "alpha released after its killed job", proc=w.proc)
        r = control.request(sock, "lease", pid=jobs[1].pid, caches=alpha)
        assert r["ok"], r
        assert not (Path(r["caches"][0]["path"]) / "k" / "torn.so").exists()
    finally:
        for j in jobs:
            j.kill()
            j.wait()
        w.stop()
