"""A lease is its tenant's: another tenant who learns its id (``CASFS_LEASE`` in the
holder's environment) can neither release nor extend it (a review's note,
2026-12-06). Released, its namespaces would go after their grace under its holder's
running job. The request comes as casfsd forwards a job's (``for_peer``: believed
from a peer of this process's own user), for another uid."""

from __future__ import annotations

from typing import Any

import pytest

from casfs.node import control
from casfs.node.host import spawn_host

from .test_host import end, host_cfg, sleeper

pytestmark = [pytest.mark.fuse]
HERS = {"pid": 0, "uid": 4242, "gid": 4242}  # another tenant, as casfsd forwards her


def test_another_tenant_can_neither_release_nor_extend_a_lease(node: dict[str, Any]) -> None:
    w = spawn_host(host_cfg(node, grace=0.0, exit_when_idle=False), log_to_stderr=True)
    sock = w.cfg.socket_path
    job, hers = sleeper(), sleeper()
    try:
        r = control.request(sock, "lease", pid=job.pid,
                            caches=[{"family": "generic", "namespace": "alpha"}])
        assert r["ok"], r
        lid = r["lease"]
        # hers: "no such lease", and the lease and its namespace are still there
        out = control.request(sock, "release", lease=lid, wait=True, for_peer=HERS)
        assert out == {"ok": False, "error": "no such lease"}
        served = [ns["namespace"] for ns in control.request(sock, "status")["namespaces"]]
        assert served == ["alpha"]
        # her lease naming that id is a new lease of hers, not an extension of it
        mine = control.request(sock, "lease", pid=hers.pid, lease=lid, for_peer=HERS,
                               caches=[{"family": "generic", "namespace": "beta"}])
        assert mine["ok"] and mine["lease"] != lid, mine
        assert control.request(sock, "release", lease=mine["lease"], wait=True,
                               for_peer=HERS)["ok"]
        # the owner releases its own as ever
        assert control.request(sock, "release", lease=lid, wait=True)["ok"]
        end(job)
    finally:
        for j in (job, hers):
            j.kill()
            j.wait()
        w.stop()
