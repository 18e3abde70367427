"""A lease granted while the host's lease check looks for a namespace's users
(a scan of /proc, in a thread: the host serves leases meanwhile) keeps its
namespace: the check must not release it from what it saw before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from casfs.node import control
from casfs.node.host import spawn_host

from .test_host import end, host_cfg, sleeper

pytestmark = [pytest.mark.fuse]


def test_a_lease_granted_during_the_users_scan_keeps_its_namespace(
        node: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    flag = node["tmp"] / "scan-go"
    monkeypatch.setenv("CASFS_PAUSEPOINT", "host-users-scanned")
    monkeypatch.setenv("CASFS_PAUSEPOINT_FILE", str(flag))
    # casfs run's own host: no grace, a namespace goes with its last lease.
    w = spawn_host(host_cfg(node, grace=0.0, exit_when_idle=False), log_to_stderr=True)
    sock = w.cfg.socket_path
    alpha = [{"family": "generic", "namespace": "alpha"}]
    jobs = [sleeper() for _ in range(2)]
    try:
        assert control.request(sock, "lease", pid=jobs[0].pid, caches=alpha)["ok"]
        jobs[0].kill()  # the first job ends: alpha is idle, the check scans for its users
        jobs[0].wait()
        wait_until(lambda: Path(f"{flag}.reached").exists(), "the users scan", proc=w.proc)
        r = control.request(sock, "lease", pid=jobs[1].pid, caches=alpha)  # the next job
        assert r["ok"], r
        path = Path(r["caches"][0]["path"])
        flag.touch()  # the scan ends
        # A lease check after that one (they take turns): a release that waits for one.
        beta = control.request(sock, "lease", pid=jobs[1].pid,
                               caches=[{"family": "generic", "namespace": "beta"}])
        assert control.request(sock, "release", lease=beta["lease"], wait=True)["ok"]
        served = [ns["namespace"] for ns in control.request(sock, "status")["namespaces"]]
        assert served == ["alpha"]  # the second job's namespace is still served
        (path / "f").write_text("the second job writes")
        assert (path / "f").read_text() == "the second job writes"
        end(jobs[1])  # exits 0: a kill would hold f (casfs.node.procexit)
    finally:
        for j in jobs:
            j.kill()
            j.wait()
        w.stop()
