"""A killed job's hold is decided at the next lease check, never after another
namespace's release (issue 21, "the decision must not wait on other work").

Before: the host's lease check released idle namespaces inline, final
publication and all; a job killed meanwhile was judged only once that was
done, with a window of one poll interval before the late check. Its half-written
file, quiet for longer than ``stable_after`` by then, had been promoted and was
published at release. Now releases run beside the checks, and the window
covers the time since the previous check began."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from casfs.node import control
from casfs.node.host import spawn_host
from casfs.store.root import SharedRoot

from .test_host import host_cfg

pytestmark = [pytest.mark.fuse, pytest.mark.expect_log(
    r"a job was killed: \d+ files it may have been writing are not published")]

HOLD_OPEN = ("import sys, time\n"
             "f = open(sys.argv[1], 'wb'); f.write(b'half of a linker output'); f.flush()\n"
             "time.sleep(600)\n")


def test_a_kill_during_another_namespaces_release_is_held(
        node: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    flag = node["tmp"] / "release-go"
    monkeypatch.setenv("CASFS_PAUSEPOINT", "host-release")
    monkeypatch.setenv("CASFS_PAUSEPOINT_FILE", str(flag))
    w = spawn_host(host_cfg(node, grace=0.0, exit_when_idle=False, stable_after=1.0),
                   log_to_stderr=True)
    sock = w.cfg.socket_path
    procs: list[subprocess.Popen[bytes]] = []
    try:
        alpha_job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        procs.append(alpha_job)
        assert control.request(sock, "lease", pid=alpha_job.pid, run=True,
                               caches=[{"family": "generic", "namespace": "alpha"}])["ok"]
        beta_job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        procs.append(beta_job)
        r = control.request(sock, "lease", pid=beta_job.pid, run=True,
                            caches=[{"family": "generic", "namespace": "beta"}])
        beta = Path(r["caches"][0]["path"])
        # alpha's job ends: its release starts and stalls (a slow final publication).
        alpha_job.kill()
        alpha_job.wait()
        wait_until(lambda: Path(f"{flag}.reached").exists(), "alpha's release", proc=w.proc)
        # beta's job writes a file, holds it open, and is killed with it half-written.
        writer = subprocess.Popen([sys.executable, "-c", HOLD_OPEN, str(beta / "torn.so")])
        procs.append(writer)
        wait_until(lambda: (beta / "torn.so").exists(), "the write")
        time.sleep(0.3)
        writer.kill()
        writer.wait()
        beta_job.kill()
        beta_job.wait()
        # Longer than stable_after while alpha's release is stuck: a late decision would
        # find the file promoted already.
        time.sleep(4.0)
        flag.touch()
        wait_until(lambda: not control.request(sock, "status")["namespaces"],
                   "both released", proc=w.proc)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        w.stop()
    gens = SharedRoot.open(node["root"]).generations()
    published = gens.entries("beta").entries if gens.latest("beta") else {}
    assert "torn.so" not in published
