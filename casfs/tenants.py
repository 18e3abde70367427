"""Tenants (trust domains): who may have written the cache bytes a job is served.

A cache holds code (dlopen'ed ``.so`` files, launched cubins), so a job is
served, and writes into, only namespaces of its own tenant. A tenant is

- ``u<uid>``: by default every uid is its own tenant;
- a declared domain (``[[tenants.domains]]`` in casfsd's TOML): a set of uids,
  unix groups and/or Kubernetes pods (by cgroup path or by an operator-set pod
  label) that trust each other;
- ``cluster`` with ``[tenants] mode = "cluster"``: everyone trusts everyone
  (single-tenant fleets; casfs before tenants behaved like this).

On the shared root a tenant's namespaces are named ``<tenant>~<namespace>``
(``store_namespace``). The *legacy* tenants, ``cluster`` and root (``u0``), use
the plain namespace name, so single-tenant fleets and root-run daemons keep the
names (and caches) they had. ``~`` is not a namespace character, so a name
parses one way only.

This module only decides; the store enforces (``casfs.store.tenancy``) and the
view hands out per-tenant directories. Imported by every layer above util.
"""

from __future__ import annotations

import fnmatch
import grp
import json
import os
import pwd
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from casfs.errors import UsageError

SEP = "~"
TENANT_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
USER_RE = re.compile(r"u(0|[1-9][0-9]{0,9})")
CLUSTER = "cluster"
ROOT = "u0"
# Who root acts as to write in a group domain's directory (dir mode): "nobody", a uid
# no member is, given the domain's group; the group's permission bits then decide.
MEMBER_UID = 65534
MODES = ("uid", "cluster")
TRUSTS = ("owner", "signature")
# The label an operator puts on a pod to name its tenant (deploy/kubernetes).
POD_LABEL = "casfs.io/tenant"
# kubelet names pod cgroups "/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice"
# (systemd driver, '-' in the uid written as '_'; kind: "kubelet-kubepods-...") or
# "/kubepods/<qos>/pod<uid>/" (cgroupfs). One path component each:
_UID = r"([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
_POD_COMPONENT_RE = re.compile(rf"(?:[a-z0-9_-]*kubepods[a-z0-9_-]*-)?pod{_UID}(?:\.slice)?")
# What may lie above a pod's component: the runtime's own, root-owned hierarchy
# ("kubepods.slice", "kubepods-besteffort.slice", "kubelet.slice", "kubepods", the
# cgroupfs driver's QoS directories), or ".." (casfsd in a cgroup namespace of its
# own sees other containers' paths relative to its own cgroup).
_POD_ANCESTOR_RE = re.compile(r"\.\.|kube[a-z0-9_.-]*|besteffort|burstable|guaranteed")


@dataclass(frozen=True)
class Domain:
    """A declared trust domain: its members trust each other's cache bytes."""

    name: str
    uids: frozenset[int] = frozenset()
    gids: frozenset[int] = frozenset()
    cgroups: tuple[str, ...] = ()  # fnmatch patterns over a process's cgroup path
    keys: tuple[str, ...] = ()  # ed25519 public keys (base64) trusted to sign for it

    def has_uid(self, uid: int) -> bool:
        """Is ``uid`` a member, directly or through one of the domain's groups (NSS)?"""
        if uid in self.uids:
            return True
        if not self.gids:
            return False
        try:
            pw = pwd.getpwuid(uid)
            groups = set(os.getgrouplist(pw.pw_name, pw.pw_gid))
        except (KeyError, OSError):
            return False
        return bool(groups & self.gids)


@dataclass(frozen=True)
class Tenant:
    """A resolved tenant and the owner its directories get."""

    id: str
    uid: int  # owner of the tenant's directories (per-tenant view, namespace dirs)
    gid: int  # their group: the domain's group, so members can write
    group_shared: bool = False  # members other than ``uid`` write too (0770 + setgid)

    @property
    def legacy(self) -> bool:
        return self.id in (CLUSTER, ROOT)

    @property
    def dir_mode(self) -> int:
        """Mode of the tenant's directories: never writable (or readable) by others."""
        if self.id == CLUSTER:
            return 0o1777  # one domain: every user of the node shares it, as before tenants
        return 0o2770 if self.group_shared else 0o700

    @property
    def share_bits(self) -> int:
        """Permission bits its members' new entries also get, so members can write them."""
        if self.id == CLUSTER:
            return 0o077
        return 0o070 if self.group_shared else 0

    def store_namespace(self, namespace: str) -> str:
        return store_namespace(self.id, namespace)


@dataclass(frozen=True)
class Credentials:
    """Who is asking: from SO_PEERCRED (uid, gid, pid) plus /proc (groups, cgroup)."""

    uid: int
    gid: int
    groups: frozenset[int] = frozenset()
    cgroup: str = ""
    pid: int | None = None

    @classmethod
    def of_pid(cls, pid: int, uid: int, gid: int) -> Credentials:
        """uid/gid come from the kernel (SO_PEERCRED); groups and cgroup from /proc.

        /proc is believed only while the process there still has the peer's uid
        (checked before and after reading): a pid reused by another user's
        process must not lend it its groups or its pod.
        """
        bare = cls(uid, gid, frozenset({gid}), "", pid)
        try:
            groups, owner = _proc_status(pid)
            cgroup = read_cgroup(pid)
            if owner != uid or _proc_status(pid)[1] != uid:
                return bare
        except (OSError, ValueError):
            return bare  # the process went away: uid/gid are still the kernel's word
        return cls(uid, gid, frozenset({gid, *groups}), cgroup, pid)

    @classmethod
    def of_self(cls) -> Credentials:
        """This process, as a mount it starts itself (casfs run) sees it.

        No cgroup: pod rules are for casfsd deciding about *other* processes; a
        process that reaches the shared root itself is trusted as its uid only.
        """
        return cls(os.geteuid(), os.getegid(), frozenset({os.getegid(), *os.getgroups()}),
                   "", os.getpid())


def _proc_status(pid: int) -> tuple[set[int], int]:
    """(supplementary groups, real uid) of ``pid``."""
    groups: set[int] = set()
    uid = -1
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Groups:"):
                groups.update(int(g) for g in line.split()[1:])
            elif line.startswith("Uid:"):
                uid = int(line.split()[1])
    return groups, uid


def read_cgroup(pid: int) -> str:
    """The cgroup v2 path of ``pid`` (or the first v1 hierarchy's), "" if unknown."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    for line in lines:  # v2: "0::/path"
        if line.startswith("0::"):
            return line[3:]
    parts = lines[0].split(":", 2) if lines else []
    return parts[2] if len(parts) == 3 else ""


def pod_uid(cgroup: str) -> str | None:
    """The Kubernetes pod whose cgroup ``cgroup`` lies in (None: not in a pod).

    Only a cgroup the container runtime made counts: the pod's component must be
    reached from the root of the hierarchy (or of casfsd's cgroup namespace)
    through the runtime's own components alone. Users may create cgroups in the
    subtree systemd delegates to them (``.../user@<uid>.service/...``), with any
    name, ``kubepods-pod<uuid>.slice`` included; such a process is not in a pod
    and is placed by its uid (``u<uid>``), as any other process of that user.
    """
    for part in cgroup.split("/")[1 if cgroup.startswith("/") else 0:]:
        m = _POD_COMPONENT_RE.fullmatch(part)
        if m:
            return m.group(1).replace("_", "-")
        if not _POD_ANCESTOR_RE.fullmatch(part):
            return None  # a user's delegated subtree, a system service's, a session's...
    return None


def store_namespace(tenant: str, namespace: str) -> str:
    """The name of a tenant's namespace on the shared root."""
    if tenant in (CLUSTER, ROOT):
        return namespace
    return f"{tenant}{SEP}{namespace}"


def split_store_namespace(name: str) -> tuple[str | None, str]:
    """(tenant, namespace) of a shared-root namespace name; tenant None for a legacy name."""
    tenant, sep, ns = name.partition(SEP)
    return (tenant, ns) if sep else (None, name)


def check_tenant_id(name: str, what: str) -> str:
    if not isinstance(name, str) or not TENANT_RE.fullmatch(name):
        raise UsageError(f"{what}: {name!r} is not a valid tenant name"
                         " (1-32 of [a-z0-9_-], starting with a letter or digit)")
    return name


@dataclass(frozen=True)
class TenantPolicy:
    """The operator's tenant settings (``[tenants]``) and the decisions made from them."""

    mode: str = "uid"
    trust: str = "owner"
    domains: tuple[Domain, ...] = ()
    signing_key: Path | None = None  # this node signs what it publishes with it
    trusted_keys: tuple[str, ...] = ()  # node keys trusted to sign for every tenant
    pod_tenants: Path | None = None  # JSON {pod uid: tenant}, kept by the operator
    # Seconds a signed statement of a namespace's newest generation holds (signature
    # trust; casfs.store.freshness): re-signed at each publication.
    head_expiry: float = 7 * 86400.0
    _by_name: dict[str, Domain] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name.update({d.name: d for d in self.domains})

    def domain(self, name: str) -> Domain | None:
        return self._by_name.get(name)

    # --- who is this? ----------------------------------------------------------
    def resolve(self, creds: Credentials) -> Tenant:
        """The tenant of a requesting process; UsageError if a pod has none."""
        if self.mode == CLUSTER:
            return self.tenant(CLUSTER)
        pod = pod_uid(creds.cgroup)
        if pod is not None:
            # In a pod, uids say nothing (every image runs as 0 or 1000): the pod decides.
            name = self._pod_tenant(pod, creds.cgroup)
            if name is None:
                raise UsageError(
                    f"pod {pod} has no casfs tenant: label it {POD_LABEL}=<domain> or declare"
                    " a [[tenants.domains]] entry whose cgroups pattern matches it")
            return self.tenant(name)
        for d in self.domains:
            if creds.uid in d.uids:
                return self.tenant(d.name)
        for d in self.domains:
            if d.gids & creds.groups:
                return self.tenant(d.name)
        return self.tenant(f"u{creds.uid}")

    def _pod_tenant(self, pod: str, cgroup: str) -> str | None:
        if self.pod_tenants is not None:
            try:
                mapping = json.loads(self.pod_tenants.read_bytes())
            except (OSError, ValueError):
                mapping = {}
            name = mapping.get(pod) if isinstance(mapping, dict) else None
            if isinstance(name, str) and self.domain(name) is not None:
                return name
        for d in self.domains:
            if any(fnmatch.fnmatchcase(cgroup, p) for p in d.cgroups):
                return d.name
        return None

    def tenant(self, name: str) -> Tenant:
        """The Tenant called ``name`` (``u<uid>``, a declared domain, or ``cluster``)."""
        if name == CLUSTER:
            return Tenant(CLUSTER, 0, 0)
        m = USER_RE.fullmatch(name)
        if m:
            uid = int(m.group(1))
            return Tenant(name, uid, _primary_gid(uid))
        d = self.domain(name)
        if d is None:
            raise UsageError(f"unknown tenant {name!r}: not u<uid> and not a declared domain")
        if d.gids:  # root-owned, the domain's group may write (config refuses >1 uid alone)
            return Tenant(name, 0, min(d.gids), group_shared=True)
        if len(d.uids) == 1:
            (uid,) = d.uids
            return Tenant(name, uid, _primary_gid(uid))
        return Tenant(name, 0, 0)  # pods only: served through casfsd (root) alone

    # --- may this owner have written for that tenant? ---------------------------
    def may_write(self, tenant: str | None, uid: int) -> bool:
        """May a file owned by ``uid`` hold records of ``tenant`` (None: a legacy name)?"""
        if uid == 0 or self.mode == CLUSTER:
            return True  # root is the node's own daemon; cluster mode trusts everyone
        if tenant is None:
            return False  # legacy names belong to root in uid mode
        m = USER_RE.fullmatch(tenant)
        if m:
            return int(m.group(1)) == uid
        d = self.domain(tenant)
        return d is not None and d.has_uid(uid)

    def group_may_write(self, tenant: str | None, gid: int) -> bool:
        """May members of group ``gid`` write a directory of ``tenant``?"""
        if self.mode == CLUSTER:
            return True
        d = self.domain(tenant) if tenant else None
        return d is not None and gid in d.gids

    def keys_for(self, tenant: str | None) -> tuple[str, ...]:
        """Public keys whose signature this node accepts on a record of ``tenant``."""
        d = self.domain(tenant) if tenant else None
        return self.trusted_keys + (d.keys if d else ())


    # --- to and from the worker processes (JSON) ----------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode, "trust": self.trust,
            "signing_key": str(self.signing_key) if self.signing_key else None,
            "trusted_keys": list(self.trusted_keys),
            "pod_tenants": str(self.pod_tenants) if self.pod_tenants else None,
            "head_expiry": self.head_expiry,
            "domains": [{"name": d.name, "uids": sorted(d.uids), "gids": sorted(d.gids),
                         "cgroups": list(d.cgroups), "keys": list(d.keys)}
                        for d in self.domains],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TenantPolicy:
        if not d:
            return DEFAULT_POLICY
        return cls(
            mode=d["mode"], trust=d["trust"],
            signing_key=Path(d["signing_key"]) if d.get("signing_key") else None,
            trusted_keys=tuple(d.get("trusted_keys", ())),
            pod_tenants=Path(d["pod_tenants"]) if d.get("pod_tenants") else None,
            head_expiry=float(d.get("head_expiry", 7 * 86400.0)),
            domains=tuple(Domain(x["name"], frozenset(x["uids"]), frozenset(x["gids"]),
                                 tuple(x["cgroups"]), tuple(x["keys"]))
                          for x in d.get("domains", ())),
        )


DEFAULT_POLICY = TenantPolicy()


def _primary_gid(uid: int) -> int:
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


def group_id(v: int | str) -> int:
    """A gid from a number or a group name (NSS); UsageError if unknown."""
    if isinstance(v, int):
        return v
    try:
        return grp.getgrnam(v).gr_gid
    except KeyError:
        raise UsageError(f"unknown group {v!r}") from None


def user_id(v: int | str) -> int:
    if isinstance(v, int):
        return v
    try:
        return pwd.getpwnam(v).pw_uid
    except KeyError:
        raise UsageError(f"unknown user {v!r}") from None
