"""Zero-config defaults: where the shared root, node state and mounts live.

With no configuration one machine works out of the box: the shared root is a
directory under the user's data dir and node state under the user's state
dir (XDG). Mount points are fixed per family and the same on every machine.
Triton 3.x group files hold absolute paths; casfs stores them path-free and
presents them at the path a namespace is served at, so a cache hits at any
path, but generations published by older releases name their path and hit
only there (docs/architecture.md, "Design choices": caches that move).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import platformdirs

from casfs.util.location import RootLocation, parse_location

log = logging.getLogger(__name__)
_said: set[str] = set()  # warnings given once per process


def default_root() -> RootLocation:
    """$CASFS_ROOT (a directory or an s3:// URL), else a directory under the user data dir."""
    env = os.environ.get("CASFS_ROOT")
    if env and env.strip():
        return parse_location(env)
    default = Path(platformdirs.user_data_dir("casfs")) / "root"
    if env is not None and "CASFS_ROOT" not in _said:  # `CASFS_ROOT=$UNSET_VAR`: say so
        _said.add("CASFS_ROOT")
        log.warning("CASFS_ROOT is set but empty: using the default shared root %s (this"
                    " node's alone)", default)
    return default


def default_state_dir() -> Path:
    env = os.environ.get("CASFS_STATE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_state_dir("casfs"))


def default_mount_base() -> Path:
    """Fixed per user, the same on every node: /run/casfs for root, /tmp/casfs-<uid> otherwise.

    Not $XDG_RUNTIME_DIR: logind removes it at logout (a job's mount under it
    would vanish with its user's last session), and many batch launchers leave it
    unset. /tmp/casfs-<uid> is made 0700 by its user and refused if anyone else
    made it first (casfs.util.owned, checked before every mount).
    """
    env = os.environ.get("CASFS_MOUNT_BASE")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/run/casfs")
    return Path("/tmp") / f"casfs-{os.geteuid()}"


def default_mountpoint(family: str) -> Path:
    return default_mount_base() / family


def default_serve_base() -> Path:
    """Where the node's mount process serves ``<tenant>/<namespace>`` directories."""
    env = os.environ.get("CASFS_SERVE_BASE")
    if env:
        return Path(env)
    return default_mount_base() / "ns"
