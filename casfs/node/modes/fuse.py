"""fuse mode: the FUSE overlay of the served generation (lower) and the node's upper.

The view sees every open and write, so the write tracker knows every writer
(no ``busy`` check) and no rescan is needed. The upper lies in the root-only
state dir but its shape is the tenant's (it makes directories and symlinks
through the view): root's own operations in it resolve beneath it
(casfs.util.beneath).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from typing import Any

from casfs.node import quota
from casfs.node.modes.base import Busy, Serving, Unchanged, ViewParts, remove_beneath
from casfs.store.entry import Entry
from casfs.util import beneath
from casfs.view import session

log = logging.getLogger(__name__)


class FuseServer:
    name = "fuse"
    has_fuse = True

    def __init__(self, parts: ViewParts) -> None:
        # Imported here: the FUSE layer needs pyfuse3 (libfuse3), dir mode must not.
        from casfs.view.ops import OverlayOperations

        self.parts = parts
        self.busy: Busy = None  # the view sees every writer (a predecessor's: handover)
        self.unchanged: Unchanged = None
        self.reader: tuple[int, int] | None = None  # the upper is root's state dir's
        cfg = parts.cfg
        # The tenant's bounds, shared by its namespaces in this process: the view
        # counts what it writes (casfs.node.quota; the upper is scanned now).
        self.quota = quota.attach(cfg)
        self.ops = OverlayOperations(
            parts.lower, parts.cache, cfg.upper, parts.tracker, parts.counters,
            fetch_timeout=cfg.fetch_timeout, root_mode=parts.root_mode,
            share_bits=parts.tenant.share_bits if parts.tenant else 0,
            replaced=parts.is_replaced, presenter=parts.relocator, quota=self.quota)

    def wire(self, on_open: Callable[[str, str], None],
             on_miss: Callable[[str, Entry], None] | None) -> None:
        self.ops.on_lower_open = on_open
        self.ops.on_lower_miss = on_miss

    def recover(self, scan: Callable[[], int], took_over: bool) -> None:
        scan()  # at once, before serving

    def wants_scan(self, final: bool) -> bool:
        return False

    # --- generations -------------------------------------------------------------
    def replaced_changed(self, paths: list[str]) -> None:
        for p in paths:
            self._release_published_upper(p)
        self.ops.replaced_changed(paths)

    def upper_changed_elsewhere(self, paths: list[str]) -> None:
        self.ops.upper_changed_elsewhere(paths)

    def lower_added(self, paths: list[str]) -> None:
        self.ops.lower_added(paths)

    def generation_served(self, seq: int) -> None:
        pass

    def release_published_replaced(self) -> int:
        """At start: published upper copies of replaced paths a newer version supersedes."""
        p = self.parts
        if not p.rules.replaced:
            return 0
        return sum(self._release_published_upper(r.entry.path)
                   for r in list(p.index.iter_promoted(p.cfg.namespace))
                   if r.state == "published" and p.is_replaced(r.entry.path))

    def _release_published_upper(self, path: str) -> bool:
        """This node's upper copy of a replaced path stops shadowing a newer published one.

        Only a copy that was published and is unchanged since (same size and
        mtime, no writer) is removed; a version the job wrote after that stays,
        is promoted and published, and wins in its turn.
        """
        p = self.parts
        # The upper is shaped by the tenant (through the view): resolved beneath it,
        # no symlink followed, so root never unlinks outside it.
        try:
            base = beneath.open_base(p.cfg.upper)
        except OSError:
            return False
        try:
            try:
                st = beneath.lstat(base, path)
            except OSError:
                return False
            rec = p.index.get_promoted(p.cfg.namespace, path)
            lower = p.lower.lookup(path)
            if (rec is None or rec.state != "published" or not stat.S_ISREG(st.st_mode)
                    or (rec.entry.size, rec.entry.mtime_ns) != (st.st_size, st.st_mtime_ns)
                    or p.tracker.has_writers(path) or not isinstance(lower, Entry)
                    or lower.digest == rec.entry.digest):
                return False
            try:
                beneath.unlink(base, path)
            except OSError as e:
                log.warning("%s: cannot release %s: %s", p.cfg.name, path, e)
                return False
            if self.quota is not None and st.st_nlink == 1:
                self.quota.give_entry(st)
        finally:
            os.close(base)
        p.counters.inc("replaced_upper_released")
        return True

    # --- release -----------------------------------------------------------------------
    def discard_torn(self, held: list[str]) -> list[str]:
        """Remove what a killed job may have half-written from the upper (the namespace
        is being released, nothing serves it now); the paths removed."""
        return remove_beneath(self.parts.cfg.upper, held, None, self.parts.cfg.name)

    # --- serving -----------------------------------------------------------------------
    def serve(self, how: Serving) -> None:
        cfg = self.parts.cfg
        session.serve(self.ops, cfg.mountpoint, fsname=f"casfs-{cfg.name}",
                      allow_other=cfg.allow_other, debug=cfg.debug, on_ready=how.ready,
                      background=how.background, on_shutdown=how.shutdown,
                      handing=how.handing, adoption=how.adoption)

    def stepped_aside(self) -> None:
        pass

    def writing(self) -> list[str] | None:
        return None

    def status(self) -> dict[str, Any] | None:
        return None

    def close(self) -> None:
        # The idle fds this namespace kept (a host releases namespaces all its life:
        # nothing else ever closes them).
        self.ops.close_idle()
        self.ops.close_state()
        if self.quota is not None:  # its upper now counts as scanned, not live
            self.quota.close()
