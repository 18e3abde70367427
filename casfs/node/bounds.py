"""Per-tenant bounds on what a lease may make the node's mount process serve.

casfsd forwards a lease from its jobs socket (which every local user reaches)
with its ``[jobs]`` limits (casfs.daemon.config.JobsLimits) in ``limits``; the
mount process, which alone knows what it serves and which leases stand,
decides here. Each namespace served costs the shared mount process timers,
a promoter and a prefetcher for as long as it is served (and again after a
restart, which serves what was served), so one tenant naming hundreds of
namespaces would tax every other tenant's jobs. A request with no ``limits``
(root's control socket, a user's own mount process) is not bounded.

Refusals are one line naming the tenant and the ``[jobs]`` key; casfsd logs
them as warnings (casfs.daemon.jobs).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

Key = tuple[str, str]  # (tenant, namespace)


class _Lease(Protocol):
    keys: set[Key]


def limit(limits: dict[str, Any], name: str) -> int | None:
    v = limits.get(name)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def lease_refusal(tenant: str, namespaces: Iterable[str], *, new_lease: bool,
                  leases: Iterable[_Lease], serving: Iterable[Key],
                  limits: dict[str, Any]) -> tuple[str, str] | None:
    """(the bound, one line) if granting would take ``tenant`` past a bound, else None.

    ``namespaces``: those the lease asks for; ``new_lease``: it is a lease of its
    own (not more namespaces on one the tenant holds); ``serving``: the keys
    served, being attached or being released (each still costs the process).
    """
    if new_lease and (most := limit(limits, "leases_per_tenant")) is not None:
        held = sum(1 for lease in leases if any(k[0] == tenant for k in lease.keys))
        if held >= most:
            return ("leases_per_tenant",
                    f"tenant {tenant} holds {held} leases on this node, the most it may"
                    f" (jobs.leases_per_tenant = {most}): refused")
    most = limit(limits, "namespaces_per_tenant")
    if most is not None:
        wanted = set(namespaces)
        have = {ns for t, ns in serving if t == tenant}
        new = wanted - have
        if new and len(have) + len(new) > most:
            return ("namespaces_per_tenant",
                    f"tenant {tenant} has {len(have)} namespaces served on this node and"
                    f" asks for {len(new)} more; it may have {most}"
                    f" (jobs.namespaces_per_tenant): refused")
    return None
