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

_UID_TENANT = re.compile(r"uid-(\d+)")


def tenant_for(uid: int) -> str:
    return f"uid-{uid}"


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
