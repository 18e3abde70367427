"""Which tenant a request belongs to: the one place the node decides it.

Namespaces belong to a tenant (casfs.tenants, docs/security.md): a job is
served, and writes into, only its tenant's directories. The tenant of a
request on the control socket comes from the kernel's word about the peer
(SO_PEERCRED: uid, gid, pid; then /proc for its groups and cgroup), never
from the request's body; the operator's [tenants] policy maps that to a
tenant (``u<uid>``, a declared domain, or ``cluster``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from casfs.tenants import Credentials, Tenant, TenantPolicy

Owner = Callable[[str], tuple[int, int, int]]


def requester(req: dict[str, Any]) -> dict[str, int]:
    """pid/uid/gid of whoever asks: the socket's peer, or the job casfsd asks for.

    ``_peer`` is set by the socket server from SO_PEERCRED. casfsd forwards a
    job's request with the job's credentials in ``for_peer``; that is believed
    only from a peer running as this process's own user (casfsd itself: the
    socket is private to that user anyway).
    """
    peer = req.get("_peer") or {"pid": 0, "uid": os.geteuid(), "gid": os.getegid()}
    fwd = req.get("for_peer")
    if isinstance(fwd, dict) and peer.get("uid") == os.geteuid():
        return {k: int(fwd[k]) for k in ("pid", "uid", "gid") if k in fwd}
    return dict(peer)


def tenant_of(req: dict[str, Any], policy: TenantPolicy) -> Tenant:
    """The tenant a control request is served as (UsageError: a pod with no tenant)."""
    who = requester(req)
    uid, gid = int(who.get("uid", os.geteuid())), int(who.get("gid", os.getegid()))
    pid = int(who.get("pid", 0))
    if pid <= 0:  # no process to ask /proc about: the kernel's uid and gid alone
        return policy.resolve(Credentials(uid, gid, frozenset({gid})))
    return policy.resolve(Credentials.of_pid(pid, uid, gid))


def own_tenant(policy: TenantPolicy) -> Tenant:
    """This process's tenant, for a mount it serves to itself (casfs run, dir mode)."""
    return policy.resolve(Credentials.of_self())


def tenant_owner(policy: TenantPolicy) -> Owner:
    """uid, gid and permission bits of each tenant's directory under the mount base.

    0700 for a user, 2770 with the group for a group domain: nobody outside the
    tenant can read its caches or place bytes its jobs will load. The legacy
    ``cluster`` directory is 1777, as every user's directory was before tenants.
    """
    def owner(name: str) -> tuple[int, int, int]:
        try:
            t = policy.tenant(name)
        except Exception:  # a tenant the policy no longer knows: nobody's
            return os.geteuid(), os.getegid(), 0o700
        return t.uid, t.gid, t.dir_mode
    return owner
