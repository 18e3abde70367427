"""Settings of one mount, and of the node's host process, resolved (absolute paths,
concrete namespace). Imports nothing heavy: the CLI builds these before any mount exists."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from casfs import families
from casfs.errors import ConfigError
from casfs.tenants import TenantPolicy
from casfs.util.location import RootLocation, parse_location


@dataclass(frozen=True)
class MountConfig:
    name: str  # the mount's name: control socket, counters, logs
    family: str  # a name in casfs.families
    namespace: str  # concrete (auto already resolved), as named on the root: "<tenant>~<ns>"
    mountpoint: Path
    root: RootLocation  # shared root: a directory or an s3:// location
    state_dir: Path  # node state (LMDB index, object cache, uppers, run files)
    stable_after: float = 2.0
    publish_interval: float = 10.0
    refresh_interval: float = 30.0
    shutdown_timeout: float = 30.0
    fetch_timeout: float = 10.0  # the longest an open waits for a lower object (then a miss)
    prefetch: bool = True  # fetch the namespace's access profile in the background
    readahead: bool = True  # a miss fetches the rest of its directory (casfs.node.readahead)
    # overlay mode: hold mount-ready up to this many seconds until the access profile's
    # hot set is local, so the links layer (fixed at mount) serves it natively; 0: don't
    wait_warm: float = 0.0
    # a namespace up to this many bytes is fetched whole from mount-ready (0: never;
    # casfs.node.prefetch, MountOptions.prefetch_budget)
    prefetch_budget: int = 128 << 20
    allow_other: bool = False
    cache_max_bytes: int = 20 << 30
    namespace_max_bytes: int | None = None
    scratch_patterns: tuple[str, ...] = field(default_factory=tuple)
    debug: bool = False
    # fuse: the FUSE overlay; overlay: kernel overlayfs over local objects and a read-only
    # FUSE view (casfs.view.overlay); dir: a plain watched directory (no FUSE)
    mode: str = "fuse"
    tenant: str = ""  # who uses this mount (casfs.tenants); "" = no tenants (as before)
    tenants: dict[str, Any] = field(default_factory=dict)  # TenantPolicy.to_dict()
    guard: bool = False  # read-only empty bind mount under the mount (casfs.node.guard)
    # The fingerprint ingredients an auto namespace came from (casfs.fingerprint), for
    # the records it publishes (casfs explain); empty for an explicit namespace.
    ingredients: dict[str, Any] = field(default_factory=dict)
    # Promotion puts small objects into pack objects (casfs.store.packs). Records
    # naming packs need format v2: a fleet still running a casfs without packs
    # reads them only once upgraded (docs/format.md, "Migration").
    packs: bool = True
    # Per-tenant bounds on the node's uppers (casfs.node.quota.QuotaPolicy.to_dict();
    # empty: the defaults).
    quota: dict[str, Any] = field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def quota_fs(self) -> Path | None:
        """The tenant's own filesystem ([quota] mechanism "loopfs", casfs.node.quota),
        where its uppers live; None: they live in the state dir."""
        if self.tenant and self.quota.get("mechanism") == "loopfs":
            return self.state_dir / "quota" / self.tenant
        return None

    @property
    def upper(self) -> Path:
        # One upper per namespace: a new torch/triton version (a new namespace)
        # starts clean instead of shadowing its files with stale ones.
        fs = self.quota_fs
        return (self.state_dir if fs is None else fs) / "upper" / self.namespace

    @property
    def overlay_work(self) -> Path:
        """overlayfs's workdir: on the upper's filesystem."""
        fs = self.quota_fs
        if fs is None:
            return self.overlay_base / "work"
        return fs / "work" / self.namespace

    @property
    def overlay_base(self) -> Path:
        """Overlay mode's layers (casfs.view.overlay.OverlayPaths.base)."""
        return self.state_dir / "overlay" / self.namespace

    @property
    def writable_dir(self) -> Path:
        """Where the job's writes land: the upper layer, or the directory itself in dir mode."""
        return self.mountpoint if self.mode == "dir" else self.upper

    @property
    def socket_path(self) -> Path:
        return self.run_dir / f"{self.name}.sock"

    def to_json(self) -> str:
        return dump_config(self)

    @classmethod
    def from_json(cls, text: str) -> MountConfig:
        return load_config(cls, text, ("mountpoint", "state_dir"))

    def check(self) -> None:
        """Refuse layouts that would make the daemon touch its own mount."""
        # The mount point itself is never looked at (its parent is resolved): it may be a
        # mount waiting for its server (a crashed process's, casfs.view.adopt), where a
        # stat would wait too.
        mp = self.mountpoint.parent.resolve() / self.mountpoint.name
        dirs = [("state dir", self.state_dir)]
        if isinstance(self.root, Path):
            dirs.append(("shared root", self.root))
        for what, p in dirs:
            p = p.resolve()
            if mp == p or p in mp.parents:
                raise ConfigError(f"mount {self.name}: mount point {mp} is inside the {what} {p}")
            if mp in p.parents:
                raise ConfigError(f"mount {self.name}: the {what} {p} is inside mount point {mp}")
        if not self.mountpoint.is_absolute():
            raise ConfigError(f"mount {self.name}: mount point must be absolute: {self.mountpoint}")
        if self.mode not in ("fuse", "overlay", "dir"):
            raise ConfigError(f"mount {self.name}: mode must be 'fuse', 'overlay' or 'dir',"
                              f" not {self.mode!r}")
        if not self.wait_warm >= 0:
            raise ConfigError(f"mount {self.name}: wait_warm must be >= 0 seconds")
        if self.stable_after < 0 or self.publish_interval <= 0 or self.refresh_interval <= 0:
            raise ConfigError(f"mount {self.name}: intervals must be positive")


def dump_config(cfg: Any) -> str:
    """A mount process's configuration dataclass as JSON (sent to it over a pipe)."""
    d = asdict(cfg)
    d["root"] = str(cfg.root)  # asdict would turn an S3Location into a dict
    return json.dumps({k: (str(v) if isinstance(v, Path) else
                           list(v) if isinstance(v, tuple) else v) for k, v in d.items()})


def load_config(cls: Any, text: str, paths: tuple[str, ...]) -> Any:
    """The inverse of dump_config for dataclass ``cls``; ``paths`` name its Path fields."""
    d = json.loads(text)
    kw: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in d:
            continue
        v = d[f.name]
        if f.name in paths:
            v = Path(v)
        elif f.name == "root":
            v = parse_location(v)
        elif f.name == "scratch_patterns":
            v = tuple(v)
        elif f.name == "preopen":
            v = tuple(tuple(str(x) for x in t) for t in v)
        kw[f.name] = v
    return cls(**kw)


@dataclass(frozen=True)
class HostConfig:
    base: Path  # the mount point: namespaces are served at <base>/<tenant>/<namespace>
    root: RootLocation
    state_dir: Path
    stable_after: float = 2.0
    publish_interval: float = 10.0
    refresh_interval: float = 30.0
    shutdown_timeout: float = 30.0
    fetch_timeout: float = 10.0
    packs: bool = True  # promotion packs small objects (MountConfig.packs)
    prefetch_budget: int = 128 << 20  # MountConfig.prefetch_budget
    allow_other: bool = False
    cache_max_bytes: int = 20 << 30
    namespace_max_bytes: int | None = None
    scratch_patterns: tuple[str, ...] = field(default_factory=tuple)
    grace: float = 60.0  # a namespace stays served this long after its last lease
    exit_when_idle: bool = False  # casfs run's host: unmount and exit once nothing is served
    lease_poll: float = 1.0
    guard: bool = True  # read-only empty bind mount under the FUSE mount (root only)
    reclaim_after: float = 7 * 86400.0  # node state of namespaces idle this long; 0: never
    debug: bool = False
    name: str = "host"
    tenants: dict[str, Any] = field(default_factory=dict)  # TenantPolicy.to_dict()
    quota: dict[str, Any] = field(default_factory=dict)  # QuotaPolicy.to_dict() (MountConfig)
    # (tenant, family, namespace) a job is about to lease (casfs run's own host): their
    # first reads of the root begin while the host starts (casfs.node.preopen).
    preopen: tuple[tuple[str, str, str], ...] = ()

    # What casfs.node.worker.Worker and the supervisor read from a config.
    @property
    def mountpoint(self) -> Path:
        return self.base

    @property
    def namespace(self) -> str:
        return "*"

    @property
    def family(self) -> str:
        return "*"

    @property
    def mode(self) -> str:
        return "fuse"

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def socket_path(self) -> Path:
        return self.run_dir / f"{self.name}.sock"

    @property
    def served_file(self) -> Path:
        return self.run_dir / f"{self.name}-served.json"

    @property
    def policy(self) -> TenantPolicy:
        return TenantPolicy.from_dict(self.tenants)

    def ns_config(self, tenant: str, family: str, namespace: str) -> MountConfig:
        # On the root the namespace carries its tenant ("<tenant>~<ns>"); the
        # path a job gets is <base>/<tenant>/<ns>, the tenant's own directory.
        return MountConfig(
            name=f"{tenant}/{namespace}", family=family,
            namespace=self.policy.tenant(tenant).store_namespace(namespace),
            tenant=tenant, tenants=self.tenants,
            mountpoint=self.base / tenant / namespace, root=self.root,
            state_dir=self.state_dir, stable_after=self.stable_after,
            publish_interval=self.publish_interval, refresh_interval=self.refresh_interval,
            shutdown_timeout=self.shutdown_timeout, fetch_timeout=self.fetch_timeout,
            packs=self.packs, prefetch_budget=self.prefetch_budget,
            allow_other=self.allow_other, cache_max_bytes=self.cache_max_bytes,
            namespace_max_bytes=self.namespace_max_bytes,
            scratch_patterns=self.scratch_patterns, quota=self.quota,
        )

    def check(self) -> None:
        # The same layout rules as one mount: never inside the state dir or the root.
        MountConfig(name=self.name, family=families.FALLBACK, namespace="x", mountpoint=self.base,
                    root=self.root, state_dir=self.state_dir).check()

    def to_json(self) -> str:
        return dump_config(self)

    @classmethod
    def from_json(cls, text: str) -> HostConfig:
        return load_config(cls, text, ("base", "state_dir"))

