"""Copy-up and whiteouts: giving lower entries an upper copy, fetching lower objects.

A copy-up is staged off-thread and linked into place on the trio thread after
re-checking the path, so a racing create/unlink is never clobbered. A lower
object that fails to fetch or verify becomes a miss (casfs.view.op_base.Miss).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time

import trio

from casfs.errors import CasfsError, CorruptObjectError, ObjectMissingError
from casfs.store.entry import Entry
from casfs.view.layers import Node, join, split
from casfs.view.op_base import Miss, OpsBase, err
from casfs.view.quota import round_up

log = logging.getLogger(__name__)

# A fetch that received no bytes for this long is stalled, not slow (seconds).
STALL = 5.0


class CopyUpOps(OpsBase):
    def _lower_failed(self, path: str, exc: BaseException) -> Miss:
        if path not in self.layers.failed:
            # Only a corrupt object is a miss for the life of the mount; a missing
            # object, a timeout or an unreachable root is retried later.
            self.layers.failed.add(path, permanent=isinstance(exc, CorruptObjectError))
            self.counters.inc("fetch_errors")
            log.warning("lower object for %r unavailable, serving a miss: %s", path, exc)
        if not self.stable_names:
            self.inodes.detach(path)  # a file re-created here gets a fresh inode
        return Miss(path)


    async def _fetch(self, path: str, entry: Entry) -> str:
        """The entry's local file (pinned), or a miss; never waits past fetch_timeout.

        The fetch runs in a thread the handler can abandon: a shared root that
        stops answering (a hard NFS mount) must cost the job a miss, not a
        process stuck in D state. An abandoned fetch goes on in the background:
        if bytes were still arriving (a large object on slow storage) the path
        is not hidden, and the next open joins the fill instead of missing
        again; if nothing arrived for STALL seconds the path is hidden for a while.
        A root that answered none of the last few full waits is waited for
        briefly (casfs.view.breaker) until it answers one.
        """
        if self.stable_names and path in self.layers.failed:
            raise Miss(path)  # failed a moment ago (shown still, see stable_names): no wait
        if self.on_lower_miss is not None:
            self.on_lower_miss(path, entry)
        lock = threading.Lock()
        state = {"done": False, "abandoned": False}

        def run() -> str:
            try:
                local = self.fetcher.fetch(entry)
            except (CorruptObjectError, ObjectMissingError):
                self.breaker.answered()  # a definite answer: the root is there
                raise
            self.breaker.answered()
            with lock:
                if state["abandoned"]:
                    self.fetcher.unpin(entry.digest)  # nobody is waiting for it any more
                else:
                    state["done"] = True
            return local

        t0 = time.monotonic()
        wait = self.breaker.wait(self.fetch_timeout)
        try:
            with trio.move_on_after(wait):
                return await trio.to_thread.run_sync(
                    run, abandon_on_cancel=True, limiter=self._fetch_limiter
                )
        except Exception as e:  # any fetch failure is a miss, never an error to the job
            if not isinstance(e, CasfsError | OSError):
                log.exception("unexpected fetch failure for %r", path)
            raise self._lower_failed(path, e) from None
        finally:  # how long the open waited for the object, whatever came of it (metrics)
            self.counters.observe("fetch_seconds", time.monotonic() - t0)
        with lock:
            state["abandoned"] = True
            if state["done"]:  # finished just as we gave up: its pin is ours to drop
                self.fetcher.unpin(entry.digest)
        progress = getattr(self.fetcher, "fill_progress", None)
        idle = progress(entry.digest) if progress is not None else None
        alive = idle is not None and idle < STALL
        if alive:
            self.breaker.answered()  # bytes arrive: a slow root (a large object), not a silent one
        if wait < self.fetch_timeout:
            # The breaker is open: a miss for this open only, its fetch goes on (the
            # probe whose answer closes the breaker; the next open joins it).
            self.counters.inc("fetch_breaker_misses")
            if not self.stable_names:
                self.inodes.detach(path)
            raise Miss(path)
        if alive:
            # Slow but alive: a miss for this open only; the fill finishes for the next.
            self.counters.inc("fetch_slow")
            log.info("fetch of %r still running after %.0fs: a miss for now, finishing in"
                     " the background", path, self.fetch_timeout)
            if not self.stable_names:
                self.inodes.detach(path)
            raise Miss(path)
        self.breaker.unanswered(self.fetch_timeout)
        self.counters.inc("fetch_timeouts")
        raise self._lower_failed(
            path, TimeoutError(f"no answer from the shared root in {self.fetch_timeout:.0f}s")
        )

    async def _copy_up(self, node: Node, *, empty: bool = False) -> None:
        """Give a lower-only file an upper copy (``empty``: content not needed, no fetch)."""
        entry = node.lower_file
        if entry is None:
            return
        # The copy is the tenant's (it lands in its upper): charged before it is made,
        # given back if it is not installed. EDQUOT/ENOSPC: the lower file stays.
        charge = 0 if empty else round_up(entry.size)
        if self.quota is not None:
            self.quota.take(charge, 1)
        try:
            installed = await self._copy_up_charged(node, entry, empty)
        except BaseException:
            if self.quota is not None:
                self.quota.give(charge, 1)
            raise
        if self.quota is None:
            return
        if not installed:
            self.quota.give(charge, 1)
            return
        with contextlib.suppress(OSError):  # a presented file's size is not the stored one
            self.quota.adjust(round_up(self.layers.lstat(node.path).st_size) - charge)

    async def _copy_up_charged(self, node: Node, entry: Entry, empty: bool) -> bool:
        src = None if empty else await self._fetch(node.path, entry)
        content = None
        if src is not None and self.presenter is not None and (
                self.presenter.size(entry) is not None):
            with open(src, "rb") as f:  # small (a group file): presented, as readers see it
                content = self.presenter.content(entry, f.read())
            if content is None:
                self.fetcher.unpin(entry.digest)
                raise self._lower_failed(node.path, ValueError("not a path-free stored form"))
        try:
            tmp = await trio.to_thread.run_sync(self.layers.stage_copy, src, entry, content)
        finally:
            if src is not None:
                self.fetcher.unpin(entry.digest)
        # From here on no await: nothing can change the path under us. Before, the job
        # may have moved a directory of it away and put a symlink in its place: then
        # the path names nothing of the job's (and root never acts through the link).
        moved = self.layers.moved_above(node.path)
        current = None if moved else self.layers.resolve(node.path)
        if current is None or current.upper is not None:
            os.unlink(tmp)
            if current is None:
                raise err(errno.ENOENT)
            return False
        try:
            self.layers.ensure_upper_dir(split(node.path)[0], self.dir_mode)
        except BaseException:
            os.unlink(tmp)
            raise
        if not self.layers.install_staged(tmp, node.path):
            return False
        owner = self.lower_owner
        if self._is_root and owner is not None and owner != self._owner:
            # as the lower entry appeared; relative to the upper's fd, never followed
            os.chown(self.layers.rel(node.path), *owner, dir_fd=self.layers.fd,
                     follow_symlinks=False)
        self.counters.inc("copy_up")
        return True

    async def _copy_up_tree(self, node: Node) -> None:
        """Copy a merged directory and everything visible below it into upper."""
        self._not_moved(join(node.path, "x"))  # (after a sibling's copy-up awaited)
        self.layers.ensure_upper_dir(node.path, self.dir_mode)
        for name, _ in self.layers.children(node):
            child = self.layers.resolve(join(node.path, name))
            if child is None:
                continue
            if child.is_dir:
                if child.has_lower_dir:
                    await self._copy_up_tree(child)
            elif child.lower_file is not None:
                try:
                    await self._copy_up(child)
                except Miss as miss:  # failed object: dropped, like any miss
                    self._invalidate_entry(miss.path)
                    continue
                self.tracker.modified(child.path)  # now a new file at its new path


    def _needs_whiteout(self, path: str) -> bool:
        """Would lower ``path`` show once the upper entry at ``path`` is gone?"""
        return self.layers.lower_lookup(path) is not None and self.layers.lower_visible(path)
