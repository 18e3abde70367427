"""overlay mode: kernel overlayfs over hard links to local objects and a read-only FUSE layer.

The FUSE layer serves the lower only (its upper stays empty); the overlay is
mounted once it serves, with a links layer (casfs.view.overlay) of every
object already on the node, fixed for the life of the mount. The kernel
writes the upper directly: writers are found by /proc (``busy``), creates
and renames by inotify, and the upper is rescanned every few seconds because
overlayfs writes with notifications off. Opens of linked files reach casfs
through fanotify (casfs.view.opens), in a child process.

Replaced under running jobs (casfs.node.handover, kind "overlay"), a successor
has its own FUSE and links layers and mounts its overlay on the stage, moved
beneath this one; stepping aside detaches the overlay and the FUSE layer, whose
connection ends when the last job lets go of the old overlay.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from casfs.errors import CasfsError
from casfs.node import control, guard
from casfs.node.modes.base import Busy, Serving, Unchanged, ViewParts, remove_beneath
from casfs.store.entry import Entry
from casfs.util.atomic import sync_filesystem
from casfs.util.crashpoint import pausepoint
from casfs.view import dirmode, overlay, session

log = logging.getLogger(__name__)

RESCAN_S = 5.0  # overlayfs writes without notifications: the upper is rescanned this often


class OverlayServer:
    name = "overlay"
    has_fuse = True

    def __init__(self, parts: ViewParts) -> None:
        from casfs.view.ops import OverlayOperations

        self.parts = parts
        cfg = parts.cfg
        self.busy: Busy = self._open_for_writing
        self.unchanged: Unchanged = None
        # The upper: a link there can only name a file of the overlay (EXDEV otherwise).
        self.reader: tuple[int, int] | None = None
        self.paths = overlay.OverlayPaths(cfg.upper, cfg.overlay_base, cfg.overlay_work)
        # The FUSE layer serves lower only; its upper stays empty (read-only).
        # Directories show nlink 1: the overlay's first listing of a merged directory
        # (the root: every kernel dir) would otherwise list each child directory
        # here while the job waits (~10 us a file of a first pass).
        self.ops = OverlayOperations(
            parts.lower, parts.cache, self.paths.fuse_upper, parts.tracker, parts.counters,
            fetch_timeout=cfg.fetch_timeout, replaced=parts.is_replaced,
            presenter=parts.relocator, dir_nlink=False, root_mode=parts.root_mode,
            lower_dir_mode=parts.lower_dir_mode, stable_names=True)
        self.ops.lower_owner = parts.tenant_owner  # as the links layer's: the tenant's
        self._mounted = False
        self._watcher: Any = None
        self._open_watch: Any = None  # casfs.view.opens.OpenWatchProcess
        self._last_scan = 0.0
        self._handing: Any = None  # casfs.node.handover.Handing, while serving
        self._aside_id: int | None = None  # our overlay's mount id, once stepped aside

    # --- promotion hooks ---------------------------------------------------------------
    def _open_for_writing(self, rels: list[str]) -> set[str]:
        held = dirmode.open_for_writing(self.parts.cfg.mountpoint, rels)
        if self._aside_id is not None and rels:  # our jobs hold the detached overlay
            held |= set(rels) & set(self.writing() or ())
        return held

    def writing(self) -> list[str] | None:
        """Paths open for writing through our overlay, attached or stepped aside."""
        h = self._handing
        mount_id = self._aside_id or (h.mount_id if h is not None else None)
        if mount_id is None:
            return []
        try:
            tops = set(os.listdir(self.paths.upper))  # what a job writes is in the upper
        except OSError:
            return []
        return sorted(dirmode.writers_on_mount(mount_id, self.parts.cfg.mountpoint, tops))

    def stepped_aside(self) -> None:
        """Our overlay left the mount point: detach our FUSE layer too (the old overlay
        keeps its own reference), so its connection ends when the last job lets go."""
        h = self._handing
        self._aside_id = h.mount_id if h is not None else None
        lower = guard.mounts_at(self.paths.fuse)
        if lower and lower[-1].fstype.startswith("fuse"):
            overlay.unmount(self.paths.fuse)

    def wire(self, on_open: Callable[[str, str], None],
             on_miss: Callable[[str, Entry], None] | None) -> None:
        self.ops.on_lower_open = on_open
        self.ops.on_lower_miss = on_miss

    def recover(self, scan: Callable[[], int], took_over: bool) -> None:
        scan()  # at once, before serving

    def wants_scan(self, final: bool) -> bool:
        if final or time.monotonic() - self._last_scan >= RESCAN_S:
            self._last_scan = time.monotonic()
            return True
        return False

    def discard_torn(self, held: list[str]) -> list[str]:
        """Remove a killed job's held files from the upper, only while the overlay is not
        mounted (overlayfs forbids changing a layer under it): at release they stay held
        and recorded, and the next start of the namespace removes them."""
        if self._mounted:
            return []
        return remove_beneath(self.paths.upper, held, None, self.parts.cfg.name)

    # --- generations -------------------------------------------------------------------
    def replaced_changed(self, paths: list[str]) -> None:
        self.ops.replaced_changed(paths)

    def upper_changed_elsewhere(self, paths: list[str]) -> None:
        pass  # overlayfs caches the shared upper itself: not ours to invalidate

    def lower_added(self, paths: list[str]) -> None:
        self.ops.lower_added(paths)

    def generation_served(self, seq: int) -> None:
        pass

    def release_published_replaced(self) -> int:
        return 0

    def _clear_dead_layers(self) -> None:
        """A killed process's dead FUSE layer, and its overlay at the mount point: nobody
        adopts a `casfs run`'s own mount process, and every later start of the namespace
        on the node failed on them (ENOTCONN: its jobs uncached for good; a review)."""
        cfg = self.parts.cfg
        base = os.path.realpath(self.paths.base)
        for m in reversed(guard.mounts_at(cfg.mountpoint)):
            links = overlay.links_of(m.options) if m.fstype == "overlay" else None
            if links is None or not os.path.realpath(links).startswith(base + os.sep):
                break  # not ours: leave it (and what lies beneath it)
            log.warning("%s: detaching the overlay a dead mount process left at %s",
                        cfg.name, cfg.mountpoint)
            self._detach(cfg.mountpoint)
        log.warning("%s: detaching the dead FUSE layer %s", cfg.name, self.paths.fuse)
        self._detach(self.paths.fuse)

    @staticmethod
    def _detach(path: Path) -> None:
        # the mount at the path itself (UMOUNT_NOFOLLOW), never where a symlink put there
        # by whoever can write its parent would lead
        try:
            guard.umount_detach(path)
        except OSError as e:
            log.warning("cannot detach %s: %s", path, e)

    # --- serving -----------------------------------------------------------------------
    def serve(self, how: Serving) -> None:
        cfg = self.parts.cfg
        from casfs.view import whiteout

        self._handing = how.handing  # kind "overlay" (casfs.node.mount)
        if how.adoption is None and not how.private_layers and session.is_dead(self.paths.fuse):
            self._clear_dead_layers()
        n = overlay.clean_stale(self.paths, alive=control.running)
        if n:
            log.info("%s: removed %d overlay layers of processes gone", cfg.name, n)
        if how.private_layers:  # a draining process's overlay may still use the plain layers
            self.paths = self.paths.own(os.getpid())
        paths = self.paths
        # Adopting a crashed process's FUSE layer (casfs.view.adopt; only one on the
        # plain layers journals its state, casfs.node.mount): its overlay is mounted and
        # in use, its layers as they were; nothing may look at the FUSE layer meanwhile.
        adopted = how.adoption is not None
        if not how.private_layers and not adopted:  # a sweep changes no overlay's view
            whiteout.sweep(paths.upper)  # whiteouts last as long as the view that made them
        # The merged root shows the upper's owner and mode: the tenant's, never wider.
        os.chmod(paths.upper, self.parts.root_mode)
        if not adopted:
            paths.fuse.mkdir(parents=True, exist_ok=True)
        paths.fuse_upper.mkdir(parents=True, exist_ok=True)

        async def background(nursery: trio.Nursery) -> None:
            # The FUSE layer serves from here on; mounting the overlay looks up its
            # root, so it must happen off this (the FUSE) thread.
            if adopted:
                self._resume()
                await how.background(nursery)
                return
            early = None
            if cfg.wait_warm > 0:
                early = await trio.to_thread.run_sync(self._link_early)
                try:
                    await trio.to_thread.run_sync(how.wait_warm, cfg.wait_warm)
                finally:
                    if early is not None:
                        if self.parts.cache.installed_hook == early.installed:
                            self.parts.cache.installed_hook = None
                        early.stop()
            if how.stopping():  # stopped while waiting: never mount, never say READY
                await trio.sleep_forever()
            if early is not None:
                await trio.to_thread.run_sync(early.join)  # all it was told, linked
            await trio.to_thread.run_sync(self._mount, early)
            await how.background(nursery)

        async def shutdown() -> None:
            await trio.to_thread.run_sync(pausepoint, "overlay-shutdown", abandon_on_cancel=True)
            await how.shutdown()
            await trio.to_thread.run_sync(self._unmount)

        lower = how.handing.lower() if how.handing is not None else None
        try:
            session.serve(self.ops, paths.fuse, fsname=f"casfs-{cfg.name}-lower",
                          allow_other=True, debug=cfg.debug, read_only=True,
                          on_ready=how.ready, background=background, on_shutdown=shutdown,
                          handing=lower, adoption=how.adoption)
        finally:
            self._unmount()

    def _resume(self) -> None:
        """Serve the overlay a crashed process mounted (adopting its FUSE layer): the
        watchers it ran, again."""
        self._mounted = True
        self._watcher = dirmode.watch(self.paths.upper, self.parts.tracker)
        self._watch_opens()
        log.info("%s: serving the overlay at %s again", self.parts.cfg.name,
                 self.parts.cfg.mountpoint)

    def _cached_path(self, e: Entry) -> str | None:
        """The local object of ``e`` if it has ``e``'s size: a damaged local copy is
        never linked (the FUSE layer refetches it)."""
        path = self.parts.cache.file_of(e.digest)
        try:
            return path if os.stat(path).st_size == e.size else None
        except OSError:
            return None

    def _link_early(self) -> overlay.EarlyLinks | None:
        """The links dir begun now: what the warm wait's prefetch installs is linked as
        it lands (casfs.view.overlay.EarlyLinks), then ``_mount`` completes it. None if
        it cannot begin (``_mount`` then builds it whole, as without it)."""
        p = self.parts
        if p.cache.installed_hook is not None:
            return None  # (one namespace per overlay process: never expected)
        try:
            early = overlay.EarlyLinks(self.paths.links, p.lower.walk(), self._cached_path,
                                       p.presenter(), dir_mode=p.lower_dir_mode,
                                       owner=p.tenant_owner)
        except (CasfsError, OSError) as e:
            log.warning("%s: links layer not begun during the warm wait: %s", p.cfg.name, e)
            return None
        p.cache.installed_hook = early.installed
        return early

    def _mount(self, early: overlay.EarlyLinks | None = None) -> None:
        p = self.parts
        paths = self.paths
        t0 = time.monotonic()
        present = p.presenter()
        local = p.cache.local_digests()  # one listing, not a stat per entry
        entries = p.lower.walk() if local else iter(())  # a fresh node: nothing to link

        def local_path(e: Entry) -> str | None:
            return self._cached_path(e) if e.digest in local else None

        rep = overlay.build_links(paths.links, entries, local_path, present,
                                  dir_mode=p.lower_dir_mode, owner=p.tenant_owner,
                                  early=early)
        if early is not None:
            p.counters.inc("overlay_linked_early", len(early.done))
        p.counters.inc("overlay_linked", rep.linked)
        p.counters.inc("overlay_generated", rep.generated)
        p.counters.inc("overlay_sealed_dirs", rep.sealed_dirs)
        h = self._handing
        at = p.cfg.mountpoint
        if h is not None and h.stage is not None:  # a successor: moved beneath later
            h.prepare_stage()
            at = h.stage
        overlay.mount(at, paths)
        if h is not None:
            h.mounted(at)
        self._mounted = True
        self._watcher = dirmode.watch(paths.upper, p.tracker)
        self._watch_opens()
        if early is not None and early.done:
            self._sync_soon()
        log.info("%s: overlay at %s: %d linked, %d generated, %d via FUSE (%.2fs)",
                 p.cfg.name, p.cfg.mountpoint, rep.linked, rep.generated, rep.absent,
                 time.monotonic() - t0)

    def _sync_soon(self) -> None:
        """Write what the warm wait installed to disk now, beside the job: overlayfs's
        unmount syncs its upper filesystem whole (the state dir's, which holds the
        local cache), so a short job's release waited for the fetched namespace's
        writeback (77 MB: 0.1-0.15 s). The same writes the kernel makes within 30 s
        anyway; a failure costs only that wait. (The cache's directory, not the
        upper: a root-owned path, and where those writes are.)"""
        def run() -> None:
            try:
                sync_filesystem(self.parts.cache.directory)
                self.parts.counters.inc("overlay_synced")
            except OSError as e:
                log.debug("%s: syncing the fetched objects: %s", self.parts.cfg.name, e)

        threading.Thread(target=run, name="casfs-overlay-sync", daemon=True).start()

    def _watch_opens(self) -> None:
        """The kernel serves linked files without casfs; fanotify tells."""
        from casfs.view.opens import FanotifyOpens, OpenWatchProcess

        p = self.parts
        access = p.access
        # The per-event work runs in a child process at low CPU priority, off the
        # job's cores and this process's GIL; only the recording runs here.
        # CASFS_OPEN_WATCH_PROCESS=0: a thread of this process instead (as before);
        # "off": no listener (benchmarks).
        w: FanotifyOpens | OpenWatchProcess
        how = os.environ.get("CASFS_OPEN_WATCH_PROCESS", "1")
        if how == "off":
            log.warning("%s: CASFS_OPEN_WATCH_PROCESS=off: opens of linked files are not "
                        "recorded", p.cfg.name)
            return
        if how == "0":
            w = FanotifyOpens(p.cfg.mountpoint, access.observed_open)
        else:
            w = OpenWatchProcess(p.cfg.mountpoint, access.observed_open,
                                 on_opens=access.observed_opens)
        try:
            w.start()
        except OSError as e:  # retention and profiles then see FUSE-served opens only
            p.counters.inc("open_watch_unavailable")
            log.warning("%s: opens of linked files are not recorded: %s", p.cfg.name, e)
            return
        self._open_watch = w
        access.uses.on_epoch.append(w.reset)

    def status(self) -> dict[str, Any] | None:
        """The open listener: its pid, paths received, restarts, failed."""
        w = self._open_watch
        if w is None:
            return None
        return {"pid": w.pid, "events": w.events, "restarts": w.restarts, "failed": w.failed}

    def _unmount(self) -> None:
        counters = self.parts.counters
        if self._open_watch is not None:
            self._open_watch.stop()
            counters.inc("open_events", self._open_watch.events)
            counters.inc("open_watch_restarts", self._open_watch.restarts)
            self._open_watch = None
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher.join(timeout=10)
            self._watcher = None
        if self._mounted:
            h = self._handing
            if h is not None and (h.stage is not None or h.stepped_aside):
                h.detach_own(self.parts.cfg.mountpoint)  # never a successor's mount
            else:
                overlay.unmount(self.parts.cfg.mountpoint)
            self._mounted = False

    def close(self) -> None:
        self.ops.close_idle()
        self.ops.close_state()
