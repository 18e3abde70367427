"""casfsd's jobs socket: what every local user may ask, and the bounds on it.

The socket (``<node.mount_base>/casfsd.sock``, 0666) takes ``lease`` and
``release`` and forwards them to the node's mount process with the peer's
credentials (SO_PEERCRED). Everything a request could cost other tenants is
bounded per tenant (``[jobs]``, casfs.daemon.config.JobsLimits):

- connections open and requests answered at once (casfs.daemon.controlsock,
  which serves idle connections without a thread each);
- leases held and namespaces served (the mount process decides,
  casfs.node.bounds, from the ``limits`` casfsd adds to the request);
- the process holding a lease: the caller itself, or one of its ancestors
  or descendants running as the caller's uid in the caller's tenant
  (``holder_refusal``). ``casfs run`` names itself, then its job (a child);
  ``casfs env`` names the shell that runs it (its parent). Any other
  process could keep the namespaces served for as long as it lives (pid 1:
  forever), or be a stranger whose death makes the job look killed.

Every refusal is one line to the client and a WARNING in casfsd's log that
starts ``jobs socket: refused tenant <tenant>``; an INFO where the process
named has already exited, or exits while its lease is granted (a very short job
under load: its ``casfs run`` names it after it ended; nothing is held and
nothing is wrong).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from casfs.daemon.config import JobsLimits
from casfs.errors import CasfsError
from casfs.node import leases
from casfs.tenants import Credentials, TenantPolicy

log = logging.getLogger(__name__)

Forward = Callable[[str, dict[str, Any]], dict[str, Any]]
MAX_DEPTH = 4096  # a process tree deeper than this is no job's
WARN_EVERY = 10.0  # seconds: a flood logs one line per tenant and bound this often


class RateLimitedWarnings:
    """One WARNING per (tenant, kind) per ``every`` seconds, with how many were held back."""

    def __init__(self, every: float = WARN_EVERY) -> None:
        self.every = every
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], tuple[float, int]] = {}

    def warn(self, tenant: str, kind: str, line: str, level: int = logging.WARNING) -> None:
        now = time.monotonic()
        with self._lock:
            last, held = self._last.get((tenant, kind), (-1e9, 0))
            if now - last < self.every:
                self._last[(tenant, kind)] = (last, held + 1)
                return
            self._last[(tenant, kind)] = (now, 0)
            if len(self._last) > 4096:  # many tenants over time: forget the old ones
                self._last = {k: v for k, v in self._last.items() if now - v[0] < self.every}
        more = f" ({held} more like it in the last {now - last:.0f}s)" if held else ""
        log.log(level, "jobs socket: refused tenant %s: %s%s", tenant, line, more)


def _stat_fields(pid: int) -> list[bytes] | None:
    """Fields 3.. of /proc/PID/stat (state, ppid, ...), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2:].split()


def parent(pid: int) -> int | None:
    fields = _stat_fields(pid)
    try:
        return int(fields[1]) if fields else None
    except (IndexError, ValueError):
        return None


def real_ids(pid: int) -> tuple[int, int] | None:
    """(real uid, real gid) of ``pid``, None if gone."""
    uid = gid = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    uid = int(line.split()[1])
                elif line.startswith("Gid:"):
                    gid = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return (uid, gid) if uid is not None and gid is not None else None


def is_ancestor(anc: int, pid: int) -> bool:
    """Whether ``anc`` is a (strict) ancestor of ``pid``."""
    cur: int | None = pid
    for _ in range(MAX_DEPTH):
        cur = parent(cur) if cur else None
        if not cur:
            return False
        if cur == anc:
            return True
    return False


def holder_refusal(peer: dict[str, int], holder: int, policy: TenantPolicy,
                   tenant: str) -> str | None:
    """Why process ``holder`` may not hold a lease the peer asks for, or None.

    The strict rule that real clients satisfy: the peer (SO_PEERCRED) itself, or
    a live ancestor or descendant of it whose real uid is the peer's uid and
    whose tenant is the peer's ``tenant``.
    """
    me = int(peer.get("pid", 0))
    if holder == me and me > 0:
        return None
    if me <= 0:
        return "the kernel named no process for this connection: a lease must name none"
    if holder <= 0 or leases.start_time(holder) is None:
        return f"no such process to hold the lease: {holder}"
    ids = real_ids(holder)
    uid = int(peer.get("uid", -1))
    if ids is None or ids[0] != uid:
        return (f"process {holder} may not hold this lease: it does not run as the"
                f" caller's uid {uid}")
    if not (is_ancestor(holder, me) or is_ancestor(me, holder)):
        return (f"process {holder} may not hold this lease: it is neither the caller"
                f" (pid {me}) nor one of its ancestors or descendants")
    try:
        theirs = policy.resolve(Credentials.of_pid(holder, ids[0], ids[1])).id
    except CasfsError as e:
        theirs = f"none ({e.message})"
    if theirs != tenant:
        return (f"process {holder} may not hold this lease: its tenant is {theirs},"
                f" the caller's is {tenant}")
    return None


class JobsSocket:
    """The jobs socket's request handler (casfsd's ``_jobs``)."""

    def __init__(self, policy: TenantPolicy, limits: JobsLimits, forward: Forward) -> None:
        self.policy = policy
        self.limits = limits
        self._forward = forward
        self.warnings = RateLimitedWarnings()

    def tenant_key(self, peer: dict[str, int] | None) -> str:
        """The tenant a connection counts against (a pod with no tenant: its uid's)."""
        if not peer:
            return "?"
        uid, gid, pid = int(peer["uid"]), int(peer["gid"]), int(peer["pid"])
        try:
            if pid > 0:
                return self.policy.resolve(Credentials.of_pid(pid, uid, gid)).id
            return self.policy.resolve(Credentials(uid, gid, frozenset({gid}))).id
        except CasfsError:
            return f"u{uid}"

    def refuse(self, tenant: str, kind: str, line: str,
               level: int = logging.WARNING) -> dict[str, Any]:
        self.warnings.warn(tenant, kind, line, level)
        return {"ok": False, "error": line, "bound": kind}

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        cmd = req.get("cmd")
        if cmd not in ("lease", "release"):
            return {"ok": False, "error": f"unknown command {cmd!r} (jobs socket)"}
        req = {k: v for k, v in req.items() if k != "limits"}  # never the client's word
        if cmd == "release":
            return self._forward("release", req)
        peer = req.get("_peer") or {}
        tenant = self.tenant_key(peer)
        try:
            holder = int(req.get("pid") or peer.get("pid") or 0)
        except (TypeError, ValueError):
            return {"ok": False, "error": f"lease: pid {req.get('pid')!r} is not a process id"}
        started = leases.start_time(holder) if holder > 0 else None
        why = holder_refusal(peer, holder, self.policy, tenant)
        if why is not None:
            gone = holder > 0 and started is None and holder != int(peer.get("pid", 0))
            return self.refuse(tenant, "holder_gone" if gone else "holder", why,
                               logging.INFO if gone else logging.WARNING)
        caches = req.get("caches")
        most = self.limits.namespaces_per_tenant
        if isinstance(caches, list) and len(caches) > most:
            return self.refuse(tenant, "namespaces_per_tenant",
                               f"a lease of tenant {tenant} names {len(caches)} namespaces;"
                               f" it may have {most} (jobs.namespaces_per_tenant)")
        req["pid"] = holder
        req["limits"] = self.limits.to_dict()
        reply = self._forward("lease", req)
        if reply.get("bound"):
            self.warnings.warn(tenant, str(reply["bound"]), str(reply.get("error")))
        elif reply.get("ok") and not leases.alive(holder, started):
            # The holder died and its pid was reused while the lease was granted.
            self._forward("release", {"lease": reply.get("lease"), "_peer": peer})
            return self.refuse(tenant, "holder_gone", f"process {holder} exited while its"
                                                      " lease was granted", logging.INFO)
        return reply
