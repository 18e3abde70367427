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
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from casfs.errors import CasfsError, ConfigError
from casfs.tenants import (
    CLUSTER,
    DEFAULT_POLICY,
    TRUSTS,
    USER_RE,
    Credentials,
    Domain,
    Tenant,
    TenantPolicy,
    group_id,
    user_id,
)
from casfs.tenants import MODES as TENANT_MODES
from casfs.util.toml import (
    Table,
    as_abs_path,
    as_positive,
    as_str,
    as_str_list,
    describe,
    read_file,
)

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


# --- the [tenants] settings, read from casfsd's TOML by casfsd and by the CLI ----------
TENANT_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")


MAX_HEAD_EXPIRY_DAYS = 36500.0  # a century


def tenants_from(t: Table, *, own_key: bool = True) -> TenantPolicy:
    """``own_key`` False (a user's command): a signing key this user cannot read is
    dropped instead of refused; only casfsd signs, a user's records stay unsigned."""
    mode = t.get("mode", as_str, "uid")
    if mode not in TENANT_MODES:
        raise ConfigError(f"{t.key('mode')}: expected one of {', '.join(TENANT_MODES)},"
                          f" got {mode!r}")
    trust = t.get("trust", as_str, "owner")
    if trust not in TRUSTS:
        raise ConfigError(f"{t.key('trust')}: expected one of {', '.join(TRUSTS)}, got {trust!r}")
    signing_key = t.get("signing_key", as_abs_path, None)
    trusted = t.get("trusted_keys", as_str_list, ())
    pod_tenants = t.get("pod_tenants", as_abs_path, None)
    head_expiry = t.get("head_expiry_days", as_positive, 7.0)  # casfs.store.freshness
    if head_expiry > MAX_HEAD_EXPIRY_DAYS:  # readers refuse statement times past ~1e18
        raise ConfigError(f"{t.key('head_expiry_days')}: at most {MAX_HEAD_EXPIRY_DAYS:.0f}"
                          f" days, got {head_expiry:g}")
    head_expiry *= 86400.0
    t.used.add("domains")
    raw = t.data.get("domains", [])
    if not isinstance(raw, list):
        raise ConfigError(f"{t.key('domains')}: expected an array of tables ([[tenants.domains]])")
    domains = tuple(_domain(Table(d, f"{t.key('domains')}[{i}]")) for i, d in enumerate(raw))
    t.finish()
    from casfs.store import tenancy

    for i, k in enumerate(trusted):
        tenancy.check_public_key(k, f"{t.key('trusted_keys')}[{i}]")
    if signing_key is not None and not own_key and not os.access(signing_key, os.R_OK):
        signing_key = None
    if signing_key is not None:
        tenancy.load_signing_key(signing_key)  # refuse a bad key now, not at the first publish
    seen: set[str] = set()
    for i, d in enumerate(domains):
        if d.name in seen:
            raise ConfigError(f"{t.key('domains')}[{i}].name: {d.name!r} is declared twice")
        seen.add(d.name)
    if trust == "signature" and not trusted and not any(d.keys for d in domains):
        raise ConfigError(f"{t.key('trust')}: \"signature\" needs tenants.trusted_keys or a"
                          " domain's keys (no record could be served)")
    return TenantPolicy(mode=mode, trust=trust, domains=domains, signing_key=signing_key,
                        trusted_keys=trusted, pod_tenants=pod_tenants, head_expiry=head_expiry)


def _ids(t: Table, name: str, conv: Callable[[int | str], int]) -> frozenset[int]:
    out: set[int] = set()
    for i, v in enumerate(t.get(name, _int_or_str_list, [])):
        try:
            out.add(conv(v))
        except CasfsError as e:
            raise ConfigError(f"{t.key(name)}[{i}]: {e.message}") from None
    return frozenset(out)


def _int_or_str_list(v: Any, key: str) -> list[int | str]:
    if not isinstance(v, list) or not all(
            (isinstance(x, int) and not isinstance(x, bool) and x >= 0)
            or (isinstance(x, str) and x) for x in v):
        raise ConfigError(f"{key}: expected an array of ids or names, got {describe(v)}")
    return list(v)


def _domain(t: Table) -> Domain:
    from casfs.store import tenancy

    name = t.get("name", as_str)
    if name is None:
        raise ConfigError(f"{t.key('name')}: every [[tenants.domains]] table needs a name")
    if not TENANT_NAME_RE.fullmatch(name) or USER_RE.fullmatch(name) or name == CLUSTER:
        raise ConfigError(f"{t.key('name')}: {name!r} is not a valid domain name (1-32 of"
                          " [a-z0-9_-]; not u<number>, not \"cluster\")")
    uids = _ids(t, "users", user_id)
    gids = _ids(t, "groups", group_id)
    cgroups = t.get("cgroups", as_str_list, ())
    keys = t.get("keys", as_str_list, ())
    for i, k in enumerate(keys):
        tenancy.check_public_key(k, f"{t.key('keys')}[{i}]")
    t.finish()
    if len(uids) > 1 and not gids:
        raise ConfigError(f"{t.key('groups')}: a domain of several users needs a group they"
                          " share (its directories are 2770 with that group)")
    if not (uids or gids or cgroups):
        raise ConfigError(f"{t.key('name')}: domain {name!r} has no users, groups or cgroups")
    return Domain(name, uids, gids, cgroups, keys)


DEFAULT_CONFIG = Path("/etc/casfs/casfs.toml")


def load_tenants(path: Path | None = None) -> TenantPolicy:
    """The node's [tenants] settings, for commands that run without casfsd (casfs run).

    ``path`` None: ``$CASFS_CONFIG``, else /etc/casfs/casfs.toml; a file this user
    cannot read (or none at all) means the defaults: every uid is its own tenant.
    """
    if path is None:
        env = os.environ.get("CASFS_CONFIG")
        path = Path(env) if env else DEFAULT_CONFIG
        if not env and not os.access(path, os.R_OK):
            return DEFAULT_POLICY
    data = read_file(path)
    return tenants_from(Table(data.get("tenants", {}), "tenants"), own_key=False)


