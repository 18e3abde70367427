"""Promotion: turn stable upper files into objects, recorded as pending publication.

A file is promoted when it is stable: no open writer, no change for
``stable_after`` seconds (both from the WriteTracker the view feeds), and
its size and mtime unchanged across hashing. Scratch names are never promoted
(the family's rules, casfs.families). A commit record (a Triton group file)
is promoted only once every child it names is promoted or already in the
lower layer with the same bytes, so no generation can hold a record without
its children.

Small objects (up to casfs.store.packs.SMALL_OBJECT) go into pack objects,
one round's worth at a time (one file or PUT per ~1 MiB instead of one per
object); large ones stay loose. An object already in the root (packed, as
this node or a manifest it read knows, or loose) is not written again. The
round writes its packs completely under their digest names first, then
records the promoted entries and their pack locations in one index
transaction: a crash in between leaves an unnamed pack (gc's), never an
entry naming a pack that is not there.

Runs in a worker thread; a slow or failing shared root only delays promotion
(the path stays dirty and is retried), it never reaches the job.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from casfs.families import CacheRules, walk_files
from casfs.index.node_index import NodeIndex
from casfs.index.tree import LowerTree
from casfs.promote.tracker import WriteTracker
from casfs.store.entry import Entry
from casfs.store.objects import (
    ObjectStore,
    PutResult,
    digest_bytes,
    max_object_bytes,
    open_regular,
)
from casfs.store.packs import SMALL_OBJECT, Location, PackWriter
from casfs.util.counters import Counters
from casfs.util.crashpoint import crashpoint
from casfs.util.paths import is_valid_relpath

log = logging.getLogger(__name__)


PARALLEL_MIN = 8  # below this many files a round is hashed serially
_T = TypeVar("_T")


@dataclass(frozen=True)
class _Candidate:
    rel: str
    full: Path
    st: os.stat_result
    seen_at: float


@dataclass
class RoundResult:
    promoted: int = 0
    bytes: int = 0
    deferred: int = 0
    errors: int = 0
    last_error: str = ""  # the last error's message, for `casfs publish` and status


class Promoter:
    def __init__(
        self,
        *,
        upper: Path,
        objects: ObjectStore,
        index: NodeIndex,
        key: str,
        rules: CacheRules,
        tracker: WriteTracker,
        counters: Counters,
        lower: LowerTree,
        stable_after: float,
        busy: Callable[[list[str]], set[str]] | None = None,
        unchanged: Callable[[str, os.stat_result], bool] | None = None,
        threads: int = 4,
        packs: bool = True,
        root_id: str = "",
        probe_loose: bool = True,
    ) -> None:
        self.upper = upper
        self.objects = objects
        self.index = index
        self.key = key  # promotion state is kept per namespace (one upper per namespace)
        self.rules = rules
        self.tracker = tracker
        self.counters = counters
        self.lower = lower
        self.stable_after = stable_after
        self.threads = threads
        self.busy = busy  # paths some process still writes (dir mode: no FUSE to tell us)
        # Files casfs itself put in place (dir mode's restore): published already.
        self.unchanged = unchanged
        self._batch: dict[str, tuple[Entry, float]] = {}  # promoted this round, not yet indexed
        self._read_sizes: dict[str, int] = {}  # path-bearing files: bytes read, before rewriting
        self.packs = packs  # small objects into packs (casfs.store.packs)
        self.root_id = root_id  # pack locations are per shared root
        # Look for a loose copy of each new small object (older writers)? An lstat on a
        # POSIX root; on an object store a request per object, what packs save: there
        # only packed copies this node knows of are found (docs/format.md).
        self.probe_loose = probe_loose
        self._packer: PackWriter | None = None  # this round's
        self._reused: dict[str, Location] = {}  # digest -> where it is packed already

    def scan_all(self) -> int:
        """Mark every upper file not yet promoted as dirty (start-up, crash recovery)."""
        n = 0
        for rel, full, scratch in walk_files(self.upper, self.rules):
            if scratch:
                continue
            try:
                st = os.lstat(full)
            except FileNotFoundError:
                continue
            if self._settled(rel, st):
                continue
            self.tracker.modified(rel)
            n += 1
        return n

    def run_once(self, *, final: bool = False) -> RoundResult:
        """Promote every quiet dirty path; ``final`` ignores the quiet period (shutdown)."""
        res = RoundResult()
        self._batch = {}
        self._packer = PackWriter(self.objects) if self.packs else None
        self._reused = {}
        paths = self.tracker.quiet(0.0 if final else self.stable_after)
        if self.busy is not None:
            held = self.busy(paths)
            res.deferred += len(held)
            paths = [p for p in paths if p not in held]
        # Commit records last, so a group and its children can go in one round.
        for wave in ([p for p in paths if not self.rules.is_commit_record(p)],
                     [p for p in paths if self.rules.is_commit_record(p)]):
            todo = [c for c in (self._guarded(self._check, rel, res) for rel in wave) if c]
            if len(todo) >= PARALLEL_MIN:
                # Hashing, compression and file I/O release the GIL: overlap them.
                with ThreadPoolExecutor(self.threads) as pool:
                    puts = list(pool.map(lambda c: self._guarded(self._put, c, res), todo))
            else:
                puts = [self._guarded(self._put, c, res) for c in todo]
            for cand, put in zip(todo, puts, strict=True):
                if put is not None:
                    self._guarded(self._finish, (cand, put), res)
        located = self._flush_packs(res)
        if self._batch:
            crashpoint("after-objects")
        # One index transaction per round, not one disk sync per file.
        self.index.add_promoted_many(self.key, [e for e, _ in self._batch.values()], located,
                                     self.root_id)
        for rel, (_, seen_at) in self._batch.items():
            self.tracker.forget(rel, seen_at)
        if res.promoted:
            self.counters.inc("promoted_files", res.promoted)
            self.counters.inc("promoted_bytes", res.bytes)
        return res

    def _guarded(self, fn: Callable[[Any, RoundResult], _T], arg: Any,
                 res: RoundResult) -> _T | None:
        """Run one step for one path; an OSError defers that path (it stays dirty)."""
        try:
            return fn(arg, res)
        except OSError as e:
            res.errors += 1
            res.last_error = str(e)
            self.counters.inc("promote_errors")
            log.warning("promotion step failed (will retry): %s", e)
            return None

    def _check(self, rel: str, res: RoundResult) -> _Candidate | None:
        """Whether ``rel`` needs hashing now; settles the paths that do not."""
        seen_at = time.monotonic()
        full = self.upper / rel
        try:
            st = os.lstat(full)
        except (FileNotFoundError, NotADirectoryError):
            self.tracker.forget(rel, seen_at)
            return None
        if stat.S_ISDIR(st.st_mode):
            # A directory renamed into place (Inductor's TritonBundler): promote its files.
            self.tracker.forget(rel, seen_at)
            if not self.rules.is_scratch(rel):
                for dirpath, _, files in os.walk(full):
                    for f in files:
                        self.tracker.modified(os.path.relpath(os.path.join(dirpath, f), self.upper))
            return None
        if (not stat.S_ISREG(st.st_mode) or self.rules.is_scratch(rel)
                or not is_valid_relpath(rel)):
            self.tracker.forget(rel, seen_at)
            return None
        if st.st_size > max_object_bytes():
            # Every reader would refuse it (objects.max_object_bytes): keep it local.
            self.tracker.forget(rel, seen_at)
            self.counters.inc("promote_skipped_too_large")
            log.warning("not promoting %s: %d bytes is over the object size limit", rel,
                        st.st_size)
            return None
        if self._settled(rel, st):
            self.tracker.forget(rel, seen_at)
            return None
        if self.rules.is_commit_record(rel) and not self._group_ready(rel, full):
            res.deferred += 1
            return None
        return _Candidate(rel, full, st, seen_at)

    def _settled(self, rel: str, st: os.stat_result) -> bool:
        """Whether ``rel`` as ``st`` is already promoted or was put there by casfs."""
        if self.unchanged is not None and self.unchanged(rel, st):
            return True
        rec = self.index.get_promoted(self.key, rel)
        if rec is None or rec.entry.mtime_ns != st.st_mtime_ns:
            return False
        # A path-bearing file is stored path-free (another size): its mtime tells.
        return rec.entry.size == st.st_size or self.rules.path_bearer(rel) is not None

    def _flush_packs(self, res: RoundResult) -> dict[str, Location]:
        """Write the round's last pack; the pack location of every promoted packed object.

        An entry whose object was meant for a pack that could not be written
        leaves the batch (its path stays dirty: retried next round).
        """
        packer, self._packer = self._packer, None
        if packer is None:
            return {}
        try:
            written = packer.flush()
        except OSError as e:
            written = dict(packer.locations)
            res.last_error = str(e)
            self.counters.inc("promote_errors")
            log.warning("writing a pack failed (will retry): %s", e)
        located: dict[str, Location] = {}
        for rel, (entry, _) in list(self._batch.items()):
            loc = written.get(entry.digest) or self._reused.get(entry.digest)
            if loc is not None:
                located[entry.digest] = loc
            elif entry.digest in packer.added:
                del self._batch[rel]  # its pack was not written
                res.promoted -= 1
                res.bytes -= entry.size
                res.errors += 1
        for digest, loc in located.items():
            self.objects.locate(digest, list(loc))  # publication reads some of them back
        if packer.packs_written:
            self.counters.inc("packs_promoted", packer.packs_written)
        return located

    def _put(self, c: _Candidate, res: RoundResult) -> PutResult:
        bearer = self.rules.path_bearer(c.rel)
        if bearer is not None:
            # Stored path-free, so the cache works at any path (casfs.families).
            data = c.full.read_bytes()
            stored = bearer.to_pathfree(c.rel, data) if len(data) == c.st.st_size else None
            if stored is not None:
                self._read_sizes[c.rel] = len(data)
                put = self._store(stored)
                self.objects.remember(put.digest, stored)  # publication reads it back
                return put
        if self._packer is not None and c.st.st_size <= SMALL_OBJECT:
            with open_regular(c.full) as f:  # never a FIFO or a link a job left there
                data = f.read(SMALL_OBJECT + 1)
            put = self._store(data)
            if self.rules.is_commit_record(c.rel):
                self.objects.remember(put.digest, data)  # the group check reads it back
            return put
        return self.objects.put_file(c.full)

    def _store(self, data: bytes) -> PutResult:
        """Store ``data``: into this round's pack when small, unless the root has it."""
        if self._packer is None or len(data) > SMALL_OBJECT:
            return self.objects.put_bytes(data)
        digest = digest_bytes(data)
        loc = (self.index.pack_location(self.root_id, digest)
               or self.objects.locations.get(digest))
        if loc is not None:  # packed already (by this node, or named by a manifest read)
            self._reused[digest] = loc
            return PutResult(digest, len(data), False)
        if self.probe_loose and self.objects.has_sound(digest, len(data)):  # older writers
            return PutResult(digest, len(data), False)
        self._packer.add(data, digest)
        return PutResult(digest, len(data), True)

    def _finish(self, item: tuple[_Candidate, PutResult], res: RoundResult) -> None:
        c, put = item
        st = c.st
        after = os.lstat(c.full)
        read_size = self._read_sizes.pop(c.rel, put.size)
        if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns) or (
            read_size != st.st_size or self.tracker.has_writers(c.rel)
        ):
            res.deferred += 1  # changed while hashing: not stable yet
            return
        entry = Entry(c.rel, put.digest, put.size, st.st_mode & 0o7777, st.st_mtime_ns)
        self._batch[c.rel] = (entry, c.seen_at)
        res.promoted += 1
        res.bytes += put.size

    def _group_ready(self, rel: str, full: Path) -> bool:
        try:
            children = self.rules.record_children(rel, full.read_bytes())
        except OSError:
            return False
        if children is None:
            return False
        for child in children:
            if child in self._batch or self.index.get_promoted(self.key, child) is not None:
                continue
            if not (self.upper / child).exists() and isinstance(self.lower.lookup(child), Entry):
                continue  # the child is served from lower, unchanged
            return False
        return True
