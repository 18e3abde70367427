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


def test_another_tenant_cannot_follow_a_lease(node: dict[str, Any]) -> None:
    """A job's lease follows its casfs run's (client.follow), so that casfs run dying
    first counts the job as killed unless its own lease still stands. Another tenant
    following a leaked run lease's id would make that killed job's last writes look
    finished, and published; and a lease still attaching its first namespaces (none to
    tell its tenant by) was anyone's to take over. A lease is its tenant's from its
    start now; another's ``follows`` is dropped."""
    import json

    w = spawn_host(host_cfg(node, grace=0.0, exit_when_idle=False), log_to_stderr=True)
    sock = w.cfg.socket_path
    run, job, hers = sleeper(), sleeper(), sleeper()
    try:
        r = control.request(sock, "lease", pid=run.pid, run=True,
                            caches=[{"family": "generic", "namespace": "alpha"}])
        assert r["ok"], r
        caches = [{"family": "generic", "namespace": "alpha"}]
        own = control.request(sock, "lease", pid=job.pid, follows=r["lease"], caches=caches)
        theirs = control.request(sock, "lease", pid=hers.pid, follows=r["lease"],
                                 for_peer=HERS,
                                 caches=[{"family": "generic", "namespace": "beta"}])
        assert own["ok"] and theirs["ok"], (own, theirs)
        kept = {x["id"]: x for x in json.loads(w.cfg.served_file.read_bytes())["leases"]}
        assert kept[own["lease"]]["follows"] == r["lease"]
        assert kept[theirs["lease"]]["follows"] is None
        assert kept[theirs["lease"]]["tenant"] == "u4242"
        assert kept[r["lease"]]["tenant"] == kept[own["lease"]]["tenant"] != "u4242"
        for lid, who in ((theirs["lease"], HERS), (own["lease"], None), (r["lease"], None)):
            kw: dict[str, Any] = {"for_peer": who} if who else {}
            assert control.request(sock, "release", lease=lid, wait=True, **kw)["ok"]
    finally:
        for j in (run, job, hers):
            j.kill()
            j.wait()
        w.stop()
