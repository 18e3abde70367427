"""One server per view mode, behind one small protocol: no code outside asks which mode.

- ``fuse`` (casfs.node.modes.fuse): the FUSE overlay of lower and upper.
- ``overlay`` (casfs.node.modes.overlay): kernel overlayfs over hard links to
  local objects and a read-only FUSE layer for the rest.
- ``dir`` (casfs.node.modes.directory): a plain directory, restored and
  watched with inotify; no FUSE at all.

A server is built from the mount's parts (``ViewParts``), serves until
stopped (``serve``), learns of each generation the lower feed serves
(``replaced_changed``, ``lower_added``, ``generation_served``: the
FeedListener protocol), tells promotion what it must know about writers
(``busy``, ``unchanged``, ``wants_scan``: the ViewHooks protocol), discards
a killed job's torn files at release, and closes.
"""

from __future__ import annotations

from casfs.node.modes.base import (
    Busy,
    ModeServer,
    Presenter,
    Serving,
    Unchanged,
    ViewParts,
    effective_mode,
    give_to_tenant,
    remove_beneath,
)

__all__ = [
    "Busy",
    "ModeServer",
    "Presenter",
    "Serving",
    "Unchanged",
    "ViewParts",
    "build",
    "effective_mode",
    "give_to_tenant",
    "remove_beneath",
]


def build(parts: ViewParts) -> ModeServer:
    """The server of ``parts.cfg.mode``."""
    mode = parts.cfg.mode
    if mode == "dir":
        from casfs.node.modes.directory import DirServer

        return DirServer(parts)
    if mode == "overlay":
        from casfs.node.modes.overlay import OverlayServer

        return OverlayServer(parts)
    from casfs.node.modes.fuse import FuseServer

    return FuseServer(parts)
