"""Each mount option and its default, in one place: read by casfsd's TOML loader
([defaults] and [[mounts]], casfs.daemon.config) and by the CLI's flags
(casfs.cli.options), so the two never disagree."""

from __future__ import annotations

from dataclasses import dataclass, fields

MODES = ("fuse", "overlay", "dir")


@dataclass(frozen=True)
class MountOptions:
    """Per-mount behaviour; [defaults] sets them for all mounts, a mount overrides."""

    stable_after: float = 2.0  # seconds a file must be unchanged before it is promoted
    publish_interval: float = 10.0
    refresh_interval: float = 30.0
    shutdown_timeout: float = 30.0  # the longest a final publication may take
    # casfsd: jobs run as other users than the root daemon (the CLI's own mounts: off)
    allow_other: bool = True
    namespace_max_bytes: int | None = None
    exclude: tuple[str, ...] = ()
    mode: str = "fuse"  # "dir" for hosts without FUSE
    fetch_timeout: float = 10.0  # the longest an open waits for the shared root (then a miss)
    packs: bool = True  # promotion packs small objects (casfs.store.packs; records need v2)
    wait_warm: float = 0.0  # overlay mode: seconds READY may wait for the hot set (0: no wait)
    # A namespace whose files add up to at most this many bytes is fetched whole in the
    # background from mount-ready (casfs.node.prefetch); a larger one stays lazy. 0: never.
    prefetch_budget: int = 128 << 20


DEFAULTS = MountOptions()


def default(name: str) -> object:
    """The default of option ``name`` (KeyError for an unknown one)."""
    if name not in {f.name for f in fields(MountOptions)}:
        raise KeyError(name)
    return getattr(DEFAULTS, name)
