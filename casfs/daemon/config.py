"""casfsd configuration: one TOML file, checked completely before anything is mounted.

Precedence: built-in defaults < the file < command-line flags. Every key is
documented in docs/configuration.md; the loader refuses anything it does not
know, with one line naming the key (``mounts[1].stable_after: expected a
number, got "fast"``), so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from casfs import families
from casfs.errors import CasfsError, ConfigError
from casfs.fingerprint import AUTO, Fingerprint, fingerprint
from casfs.node.config import MountConfig

if TYPE_CHECKING:
    from casfs.node.host import HostConfig
from casfs.node.logfmt import FORMATS, LEVELS
from casfs.node.options import DEFAULTS as MOUNT_DEFAULTS
from casfs.node.options import MODES, MountOptions
from casfs.node.quota import MECHANISMS as QUOTA_MECHANISMS
from casfs.node.quota import QuotaPolicy, loopfs_unavailable
from casfs.node.tenant import DEFAULT_CONFIG, load_tenants, tenants_from
from casfs.tenants import (
    CLUSTER,
    DEFAULT_POLICY,
    TenantPolicy,
)
from casfs.util import names
from casfs.util.defaults import default_mount_base, default_root, default_state_dir
from casfs.util.fsinfo import check_local_fs
from casfs.util.location import RootLocation, S3Location, check_endpoint, is_url, parse_location
from casfs.util.toml import (
    Table,
    as_abs_path,
    as_bool,
    as_bytes,
    as_count,
    as_non_negative,
    as_positive,
    as_str,
    as_str_list,
    read_file,
)

DEFAULT_METRICS_PORT = 9464
JOBS_SOCKET_NAME = "casfsd.sock"
DEFAULT_CACHE_MAX_BYTES = 20 << 30
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
DEFAULT_QUOTA = QuotaPolicy()


@dataclass(frozen=True)
class MountSpec:
    name: str
    family: str
    namespace: str  # concrete (an "auto" setting is resolved at load)
    namespace_setting: str  # as configured: "auto" or the explicit name
    path: Path
    options: MountOptions
    tenant: str = ""  # who may use (and so has written) this mount; "" until load() decides
    ingredients: dict[str, Any] = field(default_factory=dict)  # of an "auto" namespace


@dataclass(frozen=True)
class JobsLimits:
    """Bounds at the jobs socket, which every local user reaches ([jobs]).

    Per tenant, so one tenant's flood never costs another its lease: the
    namespaces served for it on this node, the leases it holds, the connections
    it has open and the requests of it being answered at once. A connection that
    sends no request within ``request_timeout`` is closed; idle connections cost
    no thread (casfs.daemon.controlsock), ``workers`` threads answer requests.
    """

    namespaces_per_tenant: int = 32
    leases_per_tenant: int = 128
    connections_per_tenant: int = 64
    connections: int = 1024
    requests_per_tenant: int = 4
    workers: int = 32
    request_timeout: float = 10.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class MetricsOptions:
    """Labels of the per-family metrics ([metrics]; casfs.daemon.metrics): the tenant
    label (or none), the namespace label (off: namespaces are hashes, many of them),
    and at most ``max_label_values`` values of each, the later ones counted as ``_other``."""

    tenant_label: bool = True
    namespace_label: bool = False
    max_label_values: int = 100


@dataclass(frozen=True)
class DaemonConfig:
    root: RootLocation
    state_dir: Path
    mount_base: Path
    cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES
    log_level: str = "info"
    log_format: str = "auto"
    metrics_listen: tuple[str, int] | None = None
    metrics: MetricsOptions = MetricsOptions()
    mounts: tuple[MountSpec, ...] = ()
    source: Path | None = None  # the file it came from
    serve_base: Path | None = None  # on-demand namespaces: <serve_base>/<tenant>/<namespace>
    lease_grace: float = 60.0  # a namespace stays this long after its last lease
    reclaim_after: float = 7 * 86400.0  # node state of namespaces idle this long; 0: never
    # Retention by use (casfs.promote.retention): drop files unused this many days; 0: off.
    unused_for_days: float = 0.0
    retention_interval: float = 86400.0  # seconds between two retention passes
    defaults: MountOptions = MOUNT_DEFAULTS
    tenants: TenantPolicy = DEFAULT_POLICY
    jobs: JobsLimits = JobsLimits()
    quota: QuotaPolicy = DEFAULT_QUOTA

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def control_socket(self) -> Path:
        return self.run_dir / "casfsd.sock"

    @property
    def jobs_socket(self) -> Path:
        """Where every user's ``casfs env`` asks for its caches (casfs.node.client)."""
        return self.mount_base / JOBS_SOCKET_NAME

    def mount_config(self, m: MountSpec) -> MountConfig:
        o = m.options
        tenant = self.tenants.tenant(m.tenant) if m.tenant else None
        return MountConfig(
            name=m.name, family=m.family,
            namespace=tenant.store_namespace(m.namespace) if tenant else m.namespace,
            tenant=m.tenant, tenants=self.tenants.to_dict(), mountpoint=m.path,
            root=self.root, state_dir=self.state_dir, stable_after=o.stable_after,
            publish_interval=o.publish_interval, refresh_interval=o.refresh_interval,
            shutdown_timeout=o.shutdown_timeout, allow_other=o.allow_other,
            cache_max_bytes=self.cache_max_bytes, namespace_max_bytes=o.namespace_max_bytes,
            scratch_patterns=o.exclude, mode=o.mode, fetch_timeout=o.fetch_timeout,
            guard=True,  # supervised: a restart follows a crash, so guard the gap
            ingredients=dict(m.ingredients), packs=o.packs, wait_warm=o.wait_warm,
            prefetch_budget=o.prefetch_budget,
            quota=self.quota.to_dict(),
        )

    def mount_configs(self) -> list[MountConfig]:
        return [self.mount_config(m) for m in self.mounts]

    def host_config(self) -> HostConfig | None:
        """The node's mount process for namespaces jobs ask for (None: turned off)."""
        from casfs.node.host import HostConfig

        if self.serve_base is None:
            return None
        o = self.defaults
        return HostConfig(
            base=self.serve_base, root=self.root, state_dir=self.state_dir,
            stable_after=o.stable_after, publish_interval=o.publish_interval,
            refresh_interval=o.refresh_interval, shutdown_timeout=o.shutdown_timeout,
            fetch_timeout=o.fetch_timeout, allow_other=o.allow_other,
            cache_max_bytes=self.cache_max_bytes, namespace_max_bytes=o.namespace_max_bytes,
            scratch_patterns=o.exclude, grace=self.lease_grace, packs=o.packs,
            prefetch_budget=o.prefetch_budget,
            reclaim_after=self.reclaim_after,
            tenants=self.tenants.to_dict(), quota=self.quota.to_dict(),
        )


@dataclass
class Overrides:
    """Command-line flags; None means "not given" (the file or the default wins)."""

    root: str | None = None
    state_dir: str | None = None
    log_level: str | None = None
    log_format: str | None = None
    metrics_listen: str | None = None


def as_root(v: Any, key: str) -> RootLocation:
    """An absolute directory or an s3:// URL."""
    s = as_str(v, key)
    if is_url(s):
        try:
            return parse_location(s)
        except ConfigError as e:
            raise ConfigError(f"{key}: {e.message}") from None
    return as_abs_path(s, key)


def as_endpoint(v: Any, key: str) -> str:
    s = as_str(v, key)
    if not s.startswith(("http://", "https://")):
        raise ConfigError(f"{key}: expected an http:// or https:// URL, got {s!r}")
    return check_endpoint(s, key)


def as_listen(v: Any, key: str) -> tuple[str, int] | None:
    """ "HOST:PORT", ":PORT" (localhost), "[::1]:PORT", or "" / false for off."""
    if v is False or v == "":
        return None
    s = as_str(v, key)
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{key}: expected HOST:PORT such as 127.0.0.1:9464, got {s!r}")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def as_level(v: Any, key: str) -> str:
    s = as_str(v, key).lower()
    if s not in LEVELS:
        raise ConfigError(f"{key}: expected one of {', '.join(LEVELS)}, got {v!r}")
    return s


def as_format(v: Any, key: str) -> str:
    s = as_str(v, key)
    if s not in FORMATS:
        raise ConfigError(f"{key}: expected one of {', '.join(FORMATS)}, got {v!r}")
    return s


# --- loading ----------------------------------------------------------------------
def _options(t: Table, base: MountOptions) -> MountOptions:
    return MountOptions(
        stable_after=t.get("stable_after", as_non_negative, base.stable_after),
        publish_interval=t.get("publish_interval", as_positive, base.publish_interval),
        refresh_interval=t.get("refresh_interval", as_positive, base.refresh_interval),
        shutdown_timeout=t.get("shutdown_timeout", as_positive, base.shutdown_timeout),
        allow_other=t.get("allow_other", as_bool, base.allow_other),
        namespace_max_bytes=t.get("namespace_max_bytes", as_bytes, base.namespace_max_bytes),
        exclude=t.get("exclude", as_str_list, base.exclude),
        mode=_mode(t, base.mode),
        fetch_timeout=t.get("fetch_timeout", as_positive, base.fetch_timeout),
        packs=t.get("packs", as_bool, base.packs),
        wait_warm=t.get("wait_warm", as_non_negative, base.wait_warm),
        prefetch_budget=t.get("prefetch_budget", as_bytes, base.prefetch_budget),
    )


_SHARE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*%")


def as_bytes_or_share(v: Any, key: str) -> int | float | None:
    """A byte count (see as_bytes), a share of the state filesystem ("10%": a float),
    or 0 / "off": none."""
    if v == 0 or v == "off":
        return None
    if isinstance(v, str) and (m := _SHARE_RE.fullmatch(v.strip())):
        share = float(m.group(1)) / 100
        if not 0 < share <= 1:
            raise ConfigError(f"{key}: a share must be above 0% and at most 100%, got {v!r}")
        return share
    return as_bytes(v, key)


def as_count_or_off(v: Any, key: str) -> int | None:
    if v == 0 or v == "off":
        return None
    return as_count(v, key)


def _quota(t: Table) -> QuotaPolicy:
    d = QuotaPolicy()
    reserve = t.get("reserve", lambda v, k: "auto" if v == "auto" else as_bytes_or_share(v, k),
                    "auto")
    mechanism = t.get("mechanism", as_str, d.mechanism)
    if mechanism not in QUOTA_MECHANISMS:
        raise ConfigError(f"{t.key('mechanism')}: expected one of {', '.join(QUOTA_MECHANISMS)},"
                          f" got {mechanism!r}")
    policy = QuotaPolicy(bytes=t.get("bytes", as_bytes_or_share, d.bytes),
                         inodes=t.get("inodes", as_count_or_off, d.inodes),
                         reserve=None if reserve == "auto" else (reserve or 0),
                         mechanism=mechanism)
    t.finish()
    if mechanism == "loopfs":
        if policy.bytes is None:
            raise ConfigError(f"{t.key('bytes')}: mechanism \"loopfs\" makes each tenant a"
                              " filesystem of this size: it cannot be off")
        if (why := loopfs_unavailable()) is not None:
            raise ConfigError(f"{t.key('mechanism')}: \"loopfs\" is unavailable here: {why}")
    return policy


def _mode(t: Table, default: str) -> str:
    mode = t.get("mode", as_str, default)
    if mode not in MODES:
        raise ConfigError(f"{t.key('mode')}: expected one of {', '.join(MODES)}, got {mode!r}")
    return mode


def _mount(t: Table, defaults: MountOptions, mount_base: Path,
           resolved: dict[str, Fingerprint]) -> MountSpec:
    name = t.get("name", as_str)
    if name is None:
        raise ConfigError(f"{t.key('name')}: every [[mounts]] table needs a name")
    if not NAME_RE.fullmatch(name):
        raise ConfigError(f"{t.key('name')}: {name!r} is not a valid mount name"
                          " (letters, digits, '.', '_', '-'; at most 64)")
    family = t.get("family", as_str, name if name in families.names() else families.FALLBACK)
    if family not in families.names():
        raise ConfigError(f"{t.key('family')}: expected one of {', '.join(families.names())},"
                          f" got {family!r}")
    setting = t.get("namespace", as_str, AUTO)
    ingredients: dict[str, Any] = {}
    if setting == AUTO:
        if family not in resolved:
            resolved[family] = fingerprint(family)
        namespace, ingredients = resolved[family].namespace, resolved[family].ingredients
    elif names.is_namespace(setting):
        namespace = setting
    else:
        raise ConfigError(f"{t.key('namespace')}: {setting!r} is not \"auto\" or a valid"
                          f" namespace ({names.RULE})")
    path = t.get("path", as_abs_path, mount_base / name)
    tenant = t.get("tenant", as_str, "")
    opts = _options(t, defaults)
    t.finish()
    return MountSpec(name=name, family=family, namespace=namespace, namespace_setting=setting,
                     path=path, options=opts, tenant=tenant, ingredients=dict(ingredients))


def _jobs(t: Table) -> JobsLimits:
    d = JobsLimits()
    limits = JobsLimits(**{
        f.name: t.get(f.name, as_positive if f.type in (float, "float") else as_count,
                      getattr(d, f.name))
        for f in dataclasses.fields(JobsLimits)})
    t.finish()
    if limits.requests_per_tenant > limits.workers:
        raise ConfigError(f"{t.key('requests_per_tenant')}: more than jobs.workers"
                          f" ({limits.workers}): one tenant could take every worker")
    if limits.connections_per_tenant > limits.connections:
        raise ConfigError(f"{t.key('connections_per_tenant')}: more than jobs.connections"
                          f" ({limits.connections})")
    return limits


def _mount_tenant(m: MountSpec, policy: TenantPolicy, key: str) -> MountSpec:
    """A static mount's tenant: as set, else cluster (cluster mode) or the daemon's own uid.

    A static mount is one directory at one path: only its tenant may use it
    (its root is that tenant's, 0700 or 2770), never every user of the node.
    """
    name = m.tenant or (CLUSTER if policy.mode == CLUSTER else f"u{os.geteuid()}")
    if policy.mode == CLUSTER and name != CLUSTER:
        raise ConfigError(f"{key}.tenant: tenants.mode is \"cluster\": every mount is the"
                          f" cluster's, got {name!r}")
    try:
        policy.tenant(name)
    except CasfsError as e:
        raise ConfigError(f"{key}.tenant: {e.message}") from None
    return replace(m, tenant=name)


def load(path: Path | None, overrides: Overrides | None = None) -> DaemonConfig:
    """Parse and check the whole configuration; ConfigError naming the key if anything is off.

    ``path`` None means no file: the zero-config daemon (a mount per family of
    ``families.DEFAULT_DAEMON`` under the default mount base).
    """
    ov = overrides or Overrides()
    data = read_file(path) if path is not None else {}
    top = Table(data, "")
    store = top.table("store")
    root = store.get("root", as_root, default_root())
    endpoint = store.get("endpoint", as_endpoint, "")
    unused_for_days = store.get("unused_for_days", as_non_negative, 0.0)
    retention_interval = store.get("retention_interval", as_non_negative, 86400.0) or 86400.0
    store.finish()
    node = top.table("node")
    state_dir = node.get("state_dir", as_abs_path, default_state_dir().absolute())
    mount_base = node.get("mount_base", as_abs_path, default_mount_base().absolute())
    cache_max = node.get("cache_max_bytes", as_bytes, DEFAULT_CACHE_MAX_BYTES)
    on_demand = node.get("on_demand", as_bool, True)
    serve_base = node.get("serve_base", as_abs_path, mount_base / "ns") if on_demand else None
    lease_grace = node.get("lease_grace", as_non_negative, 60.0)
    reclaim_after = node.get("reclaim_after", as_non_negative, 7 * 86400.0)
    node.finish()
    logt = top.table("log")
    level = logt.get("level", as_level, "info")
    fmt = logt.get("format", as_format, "auto")
    logt.finish()
    metrics = top.table("metrics")
    listen = metrics.get("listen", as_listen, None)
    mopts = MetricsOptions(
        tenant_label=metrics.get("tenant_label", as_bool, True),
        namespace_label=metrics.get("namespace_label", as_bool, False),
        max_label_values=metrics.get("max_label_values", as_count, 100))
    metrics.finish()
    tenants = tenants_from(top.table("tenants"))
    jobs = _jobs(top.table("jobs"))
    quota = _quota(top.table("quota"))
    dt = top.table("defaults")
    defaults = _options(dt, MountOptions())
    dt.finish()
    top.used.add("mounts")
    raw_mounts = data.get("mounts")
    if raw_mounts is None and path is None:
        raw_mounts = [{"name": f} for f in families.DEFAULT_DAEMON]
    if raw_mounts is None and on_demand:
        raw_mounts = []  # namespaces are served when jobs ask for them
    if not isinstance(raw_mounts, list) or not (raw_mounts or on_demand):
        raise ConfigError("mounts: at least one [[mounts]] table is needed"
                          " (or node.on_demand = true)")
    resolved: dict[str, Fingerprint] = {}
    mounts = tuple(_mount_tenant(_mount(Table(m, f"mounts[{i}]"), defaults, mount_base,
                                        resolved), tenants, f"mounts[{i}]")
                   for i, m in enumerate(raw_mounts))
    top.finish()

    if ov.root is not None:
        root = parse_location(ov.root)
    if endpoint:
        if not isinstance(root, S3Location):
            raise ConfigError("store.endpoint: only for an s3:// store.root")
        root = dataclasses.replace(root, endpoint=endpoint)
    if ov.state_dir is not None:
        state_dir = Path(ov.state_dir).absolute()
    if ov.log_level is not None:
        level = as_level(ov.log_level, "--log-level")
    if ov.log_format is not None:
        fmt = as_format(ov.log_format, "--log-format")
    if ov.metrics_listen is not None:
        listen = as_listen(ov.metrics_listen, "--metrics-listen")
    cfg = DaemonConfig(root=root, state_dir=state_dir, mount_base=mount_base,
                       cache_max_bytes=cache_max, log_level=level, log_format=fmt,
                       metrics_listen=listen, metrics=mopts, mounts=mounts, source=path,
                       serve_base=serve_base, lease_grace=lease_grace, defaults=defaults,
                       reclaim_after=reclaim_after, unused_for_days=unused_for_days,
                       retention_interval=retention_interval,
                       tenants=tenants, jobs=jobs, quota=quota)
    check(cfg)
    return cfg


def check(cfg: DaemonConfig) -> None:
    """The checks that relate keys to each other and to this machine."""
    try:
        check_local_fs(cfg.state_dir, "node.state_dir")
    except CasfsError as e:
        raise ConfigError(e.message) from None
    seen_names: dict[str, int] = {}
    seen_paths: dict[Path, int] = {}
    seen_ns: dict[str, int] = {}
    state = cfg.state_dir.resolve()
    local = [("node.state_dir", state)]
    if isinstance(cfg.root, Path):
        local.append(("store.root", cfg.root.resolve()))
    for i, m in enumerate(cfg.mounts):
        key = f"mounts[{i}]"
        if m.name in seen_names:
            raise ConfigError(f"{key}.name: {m.name!r} is already used by"
                              f" mounts[{seen_names[m.name]}]")
        seen_names[m.name] = i
        mp = m.path.resolve()
        for j_path, j in seen_paths.items():
            if mp == j_path:
                raise ConfigError(f"{key}.path: {m.path} is already mounted by mounts[{j}]")
            if j_path in mp.parents or mp in j_path.parents:
                raise ConfigError(f"{key}.path: {m.path} and mounts[{j}].path are nested")
        seen_paths[mp] = i
        if cfg.serve_base is not None:
            sb = cfg.serve_base.resolve()
            if mp == sb or sb in mp.parents or mp in sb.parents:
                raise ConfigError(f"{key}.path: {m.path} and node.serve_base {cfg.serve_base}"
                                  " are nested")
        for what, p in local:
            if mp == p or p in mp.parents:
                raise ConfigError(f"{key}.path: {m.path} is inside {what} {p}")
            if mp in p.parents:
                raise ConfigError(f"{key}.path: {what} {p} is inside the mount point {m.path}")
        ns = cfg.mount_config(m).namespace  # per tenant: two tenants may share a name
        if ns in seen_ns:
            raise ConfigError(f"{key}.namespace: {m.namespace} is already served by"
                              f" mounts[{seen_ns[ns]}] (one mount per namespace)")
        seen_ns[ns] = i
        try:
            cfg.mount_config(m).check()
        except CasfsError as e:
            raise ConfigError(f"{key}: {e.message}") from None
    hc = cfg.host_config()
    if hc is not None:
        try:
            hc.check()
        except CasfsError as e:
            raise ConfigError(f"node.serve_base: {e.message}") from None


__all__ = ["DEFAULT_CONFIG", "DEFAULT_METRICS_PORT", "JOBS_SOCKET_NAME", "DaemonConfig",
           "JobsLimits", "MetricsOptions", "MountOptions", "MountSpec", "Overrides", "check",
           "load", "load_tenants"]
