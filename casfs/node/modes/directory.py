"""dir mode: a plain directory, restored from the served generation and watched with inotify.

No FUSE at all (hosts without libfuse3, unprivileged containers). The
directory is the tenant's: restore and refresh write into it beneath an fd of
it, with the tenant's file-system credentials (casfs.view.dirmode,
casfs.util.beneath). A refresh restores only paths not offered before, so a
file the job deleted stays deleted until the next mount start (the whiteout
scope rule of casfs.view.whiteout); newer versions of replaced paths replace
local copies that are still a published version (``_refresh_replaced``).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from casfs.node import control, prefetch
from casfs.node.modes.base import Busy, Serving, Unchanged, ViewParts, remove_beneath
from casfs.store.entry import Entry
from casfs.util import beneath
from casfs.util.crashpoint import pausepoint
from casfs.view import dirmode, session
from casfs.view.inowatch import TreeWatch

log = logging.getLogger(__name__)


def _parts(entries: list[Entry], most: int) -> list[list[Entry]]:
    """``entries`` in order, cut into runs of at most ``most`` bytes (one at least)."""
    out: list[list[Entry]] = []
    size = most + 1
    for e in entries:
        if size + e.size > most:
            out.append([])
            size = 0
        out[-1].append(e)
        size += e.size
    return out


def _has_entries(directory: Path) -> bool:
    try:
        with os.scandir(directory) as it:
            return next(it, None) is not None
    except OSError:  # absent (made at serve): nothing in it
        return False


class DirServer:
    name = "dir"
    ops = None
    has_fuse = False  # no FUSE connection: promotion runs in this process

    def __init__(self, parts: ViewParts) -> None:
        self.parts = parts
        cfg = parts.cfg
        self.restore_stamps = dirmode.RestoreStamps(
            cfg.state_dir / f"restored-{cfg.namespace}.json", parts.lower)
        self.busy: Busy = self._open_for_writing
        self.unchanged: Unchanged = self.restore_stamps.unchanged
        # Promotion opens her files as she would: a hard link she made to a file she
        # cannot read (fs.protected_hardlinks=0) is refused, never published to her.
        self.reader: tuple[int, int] | None = parts.tenant_acting
        # Lower paths already offered to the directory.
        self._offered: set[str] = set()
        self._replaced: set[str] = set()  # newer versions of replaced paths to put in place
        self._refused: set[str] = set()  # paths through a symlink: skipped, warned once
        self._watch: TreeWatch | dirmode.Unwatched | None = None  # started by serve
        self._scan: Callable[[], int] | None = None  # see recover
        self._scanning: threading.Thread | None = None
        self._scan_failed = False
        self._not_entered = False  # the directory refused at the last restore (warned)
        # A successor takes the directory over (casfs.node.handover, ``leave``): the bind
        # of the tenant's directory stays at close.
        self.keep_dir = False

    # --- promotion hooks ---------------------------------------------------------------
    def _open_for_writing(self, rels: list[str]) -> set[str]:
        return dirmode.open_for_writing(self.parts.cfg.mountpoint, rels)

    def wire(self, on_open: Callable[[str, str], None],
             on_miss: Callable[[str, Entry], None] | None) -> None:
        pass  # opens come from inotify (serve), every object is restored, never missed

    def recover(self, scan: Callable[[], int], took_over: bool) -> None:
        # The walk for what was written while no process served the directory runs once
        # the watch has started (serve), beside the job: then the two see every write
        # between them (a predecessor's jobs write on while this process starts), and a
        # warm node's start does not wait on a walk of every file it restored before.
        # An empty directory (a fresh node) holds nothing to find.
        if took_over or _has_entries(self.parts.cfg.mountpoint):
            self._scan = scan

    def _recover(self, scan: Callable[[], int]) -> None:
        try:
            scan()
        except Exception:  # a bug here must not take the mount down: the release walks
            self._scan_failed = True
            log.exception("%s: looking for files written before this start failed",
                          self.parts.cfg.name)

    def wants_scan(self, final: bool) -> bool:
        # A release or `casfs publish`: the start's walk finished, the watch's queue
        # told now; the tree (every restored file too) walked only if the watch may
        # have missed something.
        if not final:
            return False
        if self._scanning is not None:
            self._scanning.join()
        if self._scan_failed:
            self._scan_failed = False
            return True
        return self._watch is None or not self._watch.flush()

    def discard_torn(self, held: list[str]) -> list[str]:
        """Remove a killed job's held files from the directory (the last job left), as
        the tenant and beneath the directory: never through a symlink it planted."""
        return remove_beneath(self.parts.cfg.mountpoint, held, self.parts.tenant_acting,
                              self.parts.cfg.name)

    # --- generations -------------------------------------------------------------------
    def replaced_changed(self, paths: list[str]) -> None:
        self._replaced.update(paths)  # swapped once they are served (generation_served)

    def upper_changed_elsewhere(self, paths: list[str]) -> None:
        pass  # a plain directory: nothing cached

    def lower_added(self, paths: list[str]) -> None:
        pass  # restored by generation_served

    def generation_served(self, seq: int) -> None:
        try:
            self._refresh_replaced()
            self.restore()
        except OSError as e:  # the directory refused as a whole: a FUSE mount of her own
            if e.errno not in beneath.REFUSED:  # over it (casfs.util.beneath.open_base)
                raise
            if not self._not_entered:
                log.warning("%s: not restoring into %s: %s", self.parts.cfg.name,
                            self.parts.cfg.mountpoint, e.strerror)
            self._not_entered = True
            return
        self._not_entered = False

    def release_published_replaced(self) -> int:
        return 0  # dir mode swaps them in place at serve (_refresh_replaced)

    def restore(self) -> None:
        """Put every lower path not offered before into the directory."""
        p = self.parts
        cfg = p.cfg
        fresh = [e for e in p.lower.walk() if e.path not in self._offered]
        written: list[Entry] = []
        # A quarter of the local cache at a time: its objects brought onto the node
        # first (packs read whole, many at once), then copied, each found local. (One
        # object fetched after another was a round trip a file.)
        for part in _parts(fresh, max(prefetch.WAVE_BYTES, cfg.cache_max_bytes // 4)):
            prefetch.fill_whole(p.cache, part, p.counters)
            written += dirmode.restore(cfg.mountpoint, part, p.cache, p.counters,
                                       self.restore_stamps, present=p.presenter(),
                                       owner=p.tenant_acting, refused=self._refused,
                                       shared=p.tenant_shared,
                                       unnamed=self._watch is None)
        # Offered = now in the directory; a failed fetch is tried again on the next refresh.
        # (Written ones are not looked at again: one the tenant moved away since is hers.)
        done = {e.path for e in written}
        self._offered.update(done)
        self._offered.update(dirmode.lstats(cfg.mountpoint,
                                            [e.path for e in fresh if e.path not in done]))
        # Restored files are published already: record them so promotion skips them.
        p.index.add_promoted_many(cfg.namespace, written)
        p.index.mark_published(cfg.namespace, written, p.served_seq())

    def _refresh_replaced(self) -> None:
        """Newer published versions of replaced paths replace the local copies that are
        still a published version the job has not rewritten (the promoted record:
        restored, or this node's own, published, same size and mtime, no writer),
        atomically by rename (dirmode.replace_file). A copy the job wrote and has not
        published stays, is published, and wins in its turn."""
        p = self.parts
        cfg = p.cfg
        paths, self._replaced = sorted(self._replaced), set()
        mp = cfg.mountpoint
        todo: list[tuple[Entry, os.stat_result]] = []
        local = dirmode.lstats(mp, paths)
        for path in paths:
            e = p.lower.lookup(path)
            rec = p.index.get_promoted(cfg.namespace, path)
            st = local.get(path)
            if st is None:
                continue  # absent: the restore puts the newest version in place
            if (isinstance(e, Entry) and rec is not None and rec.state == "published"
                    and stat.S_ISREG(st.st_mode) and rec.entry.digest != e.digest
                    and (rec.entry.size, rec.entry.mtime_ns) == (st.st_size, st.st_mtime_ns)
                    and not p.tracker.has_writers(path)):
                todo.append((e, st))
        busy = dirmode.open_for_writing(mp, [e.path for e, _ in todo]) if todo else set()
        done = [e for e, st in todo if e.path not in busy and dirmode.replace_file(
            mp, e, p.cache, st, self.restore_stamps, present=p.presenter(),
            owner=p.tenant_acting, refused=self._refused, shared=p.tenant_shared)]
        if done:
            p.index.add_promoted_many(cfg.namespace, done)
            p.index.mark_published(cfg.namespace, done, p.served_seq())
            p.counters.inc("replaced_dir_swapped", len(done))
            log.info("%s: %d replaced paths refreshed in place", cfg.name, len(done))

    # --- serving -----------------------------------------------------------------------
    def serve(self, how: Serving) -> None:
        p = self.parts
        cfg = p.cfg
        if p.rules.replaced:  # copies left by an earlier mount may be older versions
            self._replaced.update(
                r.entry.path for r in p.index.iter_promoted(cfg.namespace)
                if r.state == "published" and p.is_replaced(r.entry.path))
            self._refresh_replaced()
        self.restore()
        # From now on, restores name their files (dirmode.restore).
        self._watch = observer = dirmode.watch(cfg.mountpoint, p.tracker,
                                               on_open=p.access.observed_opens)
        if self._scan is not None:
            self._scanning = threading.Thread(target=self._recover, args=(self._scan,),
                                              name="casfs-start-scan", daemon=True)
            self._scanning.start()
        try:
            trio.run(self._main, how)
        finally:
            observer.stop()
            observer.join(timeout=10)

    async def _main(self, how: Serving) -> None:
        cfg = self.parts.cfg
        async with trio.open_nursery() as nursery:
            await how.background(nursery)
            # Catch SIGTERM before telling the parent we serve: a job that ends at once
            # is stopped right after READY, and the default action would skip the final
            # publication and the stats. As in the FUSE session, a second signal must
            # not cut the final publication: stop_signals swallows it.
            with session.stop_signals() as signals:
                how.ready()
                async for signum in signals:
                    log.info("%s: signal %d: shutting down", cfg.name, signum)
                    break
            # A job joining now would write after the final scan: the entry says we
            # stop, so the next job waits for our exit and spawns a fresh process
            # (casfs.node.dirshare).
            try:
                control.write_registry(cfg.run_dir, cfg.name, dict(how.entry(), stopping=True))
            except OSError as e:  # a full state dir: the final publication still runs
                log.warning("%s: marking the registry entry stopping: %s", cfg.name, e)
            pausepoint("dir-final-publication")
            await how.shutdown()
            nursery.cancel_scope.cancel()

    def stepped_aside(self) -> None:
        pass

    def writing(self) -> list[str] | None:
        return None

    def status(self) -> dict[str, Any] | None:
        return None

    def close(self) -> None:
        from casfs.node import quota

        if not self.keep_dir:
            quota.release_dir(self.parts.cfg)  # the bind of the tenant's directory ("loopfs")
