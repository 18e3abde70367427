"""Which tenant a request belongs to: the one place that decides it.

Namespaces belong to a tenant (docs/architecture.md, "One serving model"): a
job is served, and writes into, only its tenant's directories. Until an
operator declares other trust domains, the tenant is the requesting uid,
taken from the socket's peer credentials (never from the request's body).
"""

from __future__ import annotations

import os
import pwd
import re
from typing import Any

_UID_TENANT = re.compile(r"uid-(\d+)")


def tenant_for(uid: int) -> str:
    return f"uid-{uid}"


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


def tenant_of(req: dict[str, Any]) -> str:
    """The tenant a control request is served as: the one place that decides it."""
    return tenant_for(int(requester(req).get("uid", os.geteuid())))


def tenant_owner(tenant: str) -> tuple[int, int, int]:
    """uid, gid and permission bits of the tenant's directory under the mount base.

    A uid tenant's directory is private to it (0700): other users can neither
    read its caches nor place bytes its jobs will load.
    """
    m = _UID_TENANT.fullmatch(tenant)
    if m is None:
        return os.geteuid(), os.getegid(), 0o755
    uid = int(m.group(1))
    try:
        gid = pwd.getpwuid(uid).pw_gid
    except KeyError:
        gid = uid
    return uid, gid, 0o700
