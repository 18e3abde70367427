"""The protocol a view-mode server implements, and what servers share (casfs.node.modes)."""


from __future__ import annotations

import dataclasses
import logging
import os
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio

from casfs.families import CacheRules, Relocator
from casfs.index.memtree import StagedLowerTree
from casfs.index.node_index import NodeIndex
from casfs.index.objcache import LocalObjectCache
from casfs.node.access import Access
from casfs.node.config import MountConfig
from casfs.promote.tracker import WriteTracker
from casfs.store.entry import Entry
from casfs.tenants import MEMBER_UID, Tenant
from casfs.util import beneath
from casfs.util.counters import Counters

log = logging.getLogger(__name__)

Presenter = Callable[[Entry, str], bytes | None]
Busy = Callable[[list[str]], set[str]] | None
Unchanged = Callable[[str, os.stat_result], bool] | None


@dataclass
class ViewParts:
    """What a mode server is built from: the mount's parts below the view."""

    cfg: MountConfig
    rules: CacheRules
    index: NodeIndex
    tracker: WriteTracker
    counters: Counters
    lower: StagedLowerTree
    cache: LocalObjectCache
    access: Access
    served_seq: Callable[[], int]
    tenant: Tenant | None
    root_mode: int  # the mode the writable directory was given (the tenant's)
    relocator: Relocator | None

    def is_replaced(self, path: str) -> bool:
        return self.rules.replace_rule(path) is not None

    @property
    def lower_dir_mode(self) -> int:
        """Mode of directories of the lower (and of overlay's links layer): the tenant's;
        without tenants 0777 as before (the root, 1777, is what keeps users apart)."""
        return self.tenant.dir_mode if self.tenant is not None else 0o777

    @property
    def tenant_owner(self) -> tuple[int, int] | None:
        """(uid, gid) the tenant's directories belong to; None without tenants."""
        return (self.tenant.uid, self.tenant.gid) if self.tenant is not None else None

    @property
    def tenant_acting(self) -> tuple[int, int] | None:
        """(uid, gid) whose fs credentials write in the tenant's directory (dir mode).
        A group domain's directories are root's (uid 0, which as_tenant would leave
        with all of root's power there): its members' stand-in, MEMBER_UID, with the
        group, so that the group's permissions decide, as for any member."""
        t = self.tenant
        if t is not None and t.group_shared:
            return (MEMBER_UID, t.gid)
        return self.tenant_owner

    @property
    def tenant_shared(self) -> bool:
        """The tenant's directory is a group's: what dir mode makes there is the group's
        to write too (casfs.view.dirmode.restore's ``shared``)."""
        return self.tenant is not None and self.tenant.group_shared

    def presenter(self) -> Presenter | None:
        """Bytes to generate for files the family presents differently (never linked)."""
        relocator = self.relocator
        if relocator is None:
            return None

        def present(e: Entry, src: str) -> bytes | None:
            if relocator.size(e) is None:
                return None
            with open(src, "rb") as f:  # a cached object: the state dir, root's
                # Not the announced stored form: an empty file, which Triton takes for a miss.
                return relocator.content(e, f.read()) or b""

        return present


@dataclass
class Serving:
    """What the mount gives a server to serve with."""

    ready: Callable[[], None]  # mount-ready: register, tell the parent
    background: Callable[[trio.Nursery], Awaitable[None]]  # control socket, tasks, prefetch
    shutdown: Callable[[], Awaitable[None]]  # the final publication, bounded
    wait_warm: Callable[[float], None]  # hold mount-ready until the hot set is local
    stopping: Callable[[], bool]
    entry: Callable[[], dict[str, Any]] = field(default=dict)  # our registry entry
    handing: Any = None  # casfs.node.handover.Handing: the mount's part in replacements
    # overlay: layers of its own (a successor, or another process of the namespace drains)
    private_layers: bool = False
    adoption: Any = None  # casfs.view.adopt.Adoption: serve a crashed process's connection


class ModeServer(Protocol):
    name: str
    ops: Any  # the FUSE operations (casfs.view.ops.OverlayOperations), None in dir mode
    busy: Busy  # see casfs.node.publishing.ViewHooks
    unchanged: Unchanged
    reader: tuple[int, int] | None
    # The view is served (at least partly) by a FUSE connection: lower objects are
    # fetched on open, promotion and fetches run in worker processes to protect the
    # connection, and the mount point is guarded between processes.
    has_fuse: bool

    def wire(self, on_open: Callable[[str, str], None],
             on_miss: Callable[[str, Entry], None] | None) -> None:
        """Call ``on_open(path, digest)`` on each open of a lower file the view serves,
        ``on_miss(path, entry)`` when one must be fetched (read-ahead)."""

    def wants_scan(self, final: bool) -> bool: ...
    def recover(self, scan: Callable[[], int], took_over: bool) -> None:
        """Find what was written while no process served the mount: ``scan`` marks the
        files awaiting promotion (returns how many); ``took_over``: a predecessor left
        this process the mount point (its jobs may be writing meanwhile)."""
    def discard_torn(self, held: list[str]) -> list[str]: ...
    def replaced_changed(self, paths: list[str]) -> None: ...
    def upper_changed_elsewhere(self, paths: list[str]) -> None:
        """A draining predecessor changed these upper paths (casfs.node.handover)."""
    def lower_added(self, paths: list[str]) -> None: ...
    def generation_served(self, seq: int) -> None: ...
    def release_published_replaced(self) -> int: ...
    def serve(self, how: Serving) -> None: ...
    def stepped_aside(self) -> None:
        """Handed over: the mount point is the successor's (casfs.node.handover)."""

    def writing(self) -> list[str] | None:
        """Paths open for writing through this view; None: the write tracker knows."""
    def status(self) -> dict[str, Any] | None: ...
    def close(self) -> None: ...


def give_to_tenant(path: Path, tenant: Tenant | None) -> int:
    """Owner and mode of the directory jobs get: the tenant's, never world-writable.

    Without tenants (a MountConfig without one) it stays 1777, as before.
    """
    if tenant is None:
        return 0o1777
    if os.geteuid() == 0:
        os.chown(path, tenant.uid, tenant.gid)
    os.chmod(path, tenant.dir_mode)  # after chown, which clears setgid
    return tenant.dir_mode


def remove_beneath(top: Path, rels: list[str], owner: tuple[int, int] | None,
                   name: str) -> list[str]:
    """Unlink the regular files ``rels`` beneath ``top``, no symlink followed, with
    ``owner``'s file-system credentials if given; the paths removed."""
    if not rels:
        return []
    try:
        base = beneath.open_base(top)
    except OSError as e:
        log.warning("%s: cannot remove torn files: %s", name, e)
        return []
    removed = []
    try:
        with beneath.as_tenant(*(owner or (None, None))):
            for rel in rels:
                try:  # beneath the directory, no symlink followed: never outside it
                    if stat.S_ISDIR(beneath.lstat(base, rel).st_mode):
                        continue
                    beneath.unlink(base, rel)
                except FileNotFoundError:
                    removed.append(rel)  # gone already: nothing torn is left
                    continue
                except OSError as e:
                    log.warning("%s: cannot remove %s: %s", name, rel, e)
                    continue
                removed.append(rel)
    finally:
        os.close(base)
    return removed


def effective_mode(cfg: MountConfig, counters: Counters) -> MountConfig:
    """``cfg`` as it can be served here: overlay mode without overlayfs (or without the
    privilege to mount it) serves in fuse mode, said once and counted."""
    if cfg.mode == "overlay":
        from casfs.view import overlay

        why = overlay.unavailable_reason()
        if why is not None:
            log.warning("%s: %s: serving in fuse mode instead", cfg.name, why)
            counters.inc("overlay_fallback")
            return dataclasses.replace(cfg, mode="fuse")
    return cfg
