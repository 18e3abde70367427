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
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from casfs.families import CacheRules, walk_files
from casfs.index.node_index import NodeIndex
from casfs.index.promoted import PromotedRecord
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


@dataclass(frozen=True, slots=True)
class _Candidate:
    rel: str
    full: str
    st: os.stat_result
    seen_at: float


@dataclass(slots=True)
class _Blob:
    """A small object read and hashed, to store once the wave's dedup has run."""
    digest: str
    data: bytes
    remember: bool = False  # keep its bytes (publication reads it back)
    put: PutResult | None = None  # set once stored or found in the root


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
        self._upper = str(upper)
        self._known: dict[str, PromotedRecord] = {}  # this wave's promoted records
        self._records = False  # this wave is the commit records' (family rules, once a path)
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
        # A round keeps its batch and its pack writer on the instance: two rounds at
        # once (the periodic one and a publication's) would swap packers mid-round and
        # record objects in a pack that is never written. One round at a time.
        self._round = threading.Lock()
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
        with self._round:
            return self._run_once(final)

    def _run_once(self, final: bool) -> RoundResult:
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
        is_record = self.rules.is_commit_record
        waves = ([p for p in paths if not is_record(p)], [p for p in paths if is_record(p)])
        with ThreadPoolExecutor(self.threads) as pool:
            for records, wave in enumerate(waves):
                if wave:
                    self._records = bool(records)
                    self._promote_wave(wave, res, pool)
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

    def _promote_wave(self, wave: list[str], res: RoundResult, pool: ThreadPoolExecutor) -> None:
        """Check, read and hash, dedup, then store one wave's paths.

        The index is read once per wave (every path's promoted record, then every
        new small object's pack location), not once per file; reading, hashing and
        compressing run in ``pool`` (zstd and file I/O release the GIL; blake3 is cheap).
        """
        self._known = self.index.get_promoted_many(self.key, wave)
        todo = [c for c in (self._guarded(self._check, rel, res) for rel in wave) if c]
        got = self._map(pool, self._read, todo, res)
        small = [g for g in got if isinstance(g, _Blob)]
        if small:
            self._dedup(small)
            new = [b for b in small if b.put is None]
            for b, put in zip(new, self._map(pool, self._pack, new, res), strict=True):
                b.put = put
        for cand, g in zip(todo, got, strict=True):
            put = g.put if isinstance(g, _Blob) else g
            if put is not None:
                self._guarded(self._finish, (cand, put), res)

    def _map(self, pool: ThreadPoolExecutor, fn: Callable[[Any, RoundResult], _T],
             items: list[Any], res: RoundResult) -> list[_T | None]:
        if len(items) < PARALLEL_MIN:
            return [self._guarded(fn, x, res) for x in items]
        return list(pool.map(lambda x: self._guarded(fn, x, res), items))

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
        full = os.path.join(self._upper, rel)
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
                        self.tracker.modified(os.path.relpath(os.path.join(dirpath, f),
                                                              self._upper))
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
        if self._settled(rel, st, prefetched=True):
            self.tracker.forget(rel, seen_at)
            return None
        if self._records and not self._group_ready(rel, full):
            res.deferred += 1
            return None
        return _Candidate(rel, full, st, seen_at)

    def _settled(self, rel: str, st: os.stat_result, *, prefetched: bool = False) -> bool:
        """Whether ``rel`` as ``st`` is already promoted or was put there by casfs
        (``prefetched``: its promoted record, if any, is in this wave's ``_known``)."""
        if self.unchanged is not None and self.unchanged(rel, st):
            return True
        rec = self._known.get(rel) if prefetched else self.index.get_promoted(self.key, rel)
        if rec is None or rec.entry.mtime_ns != st.st_mtime_ns:
            return False
        # A path-bearing file is stored path-free (another size): its mtime tells.
        return rec.entry.size == st.st_size or self.rules.path_bearer(rel) is not None

    def _flush_packs(self, res: RoundResult) -> dict[str, Location]:
        """Write the round's last pack; the pack location of every promoted packed object.

        A pack that could not be written went out as loose objects (PackWriter's
        fallback); an entry whose object could be written neither way leaves the
        batch (its path stays dirty: retried next round).
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
            elif entry.digest in packer.added and entry.digest not in packer.loose:
                del self._batch[rel]  # its pack was not written
                res.promoted -= 1
                res.bytes -= entry.size
                res.errors += 1
        for digest, loc in located.items():
            self.objects.locate(digest, list(loc))  # publication reads some of them back
        if packer.packs_written:
            self.counters.inc("packs_promoted", packer.packs_written)
        if packer.loose:  # its pack could not be written (logged once by PackWriter)
            self.counters.inc("promoted_loose_fallback", len(packer.loose))
        return located

    def _read(self, c: _Candidate, res: RoundResult) -> _Blob | PutResult:
        """Read and hash ``c``: a small object's bytes (stored later, after the wave's
        dedup), or a large one stored loose at once."""
        bearer = self.rules.path_bearer(c.rel)
        if bearer is not None:
            # Stored path-free, so the cache works at any path (casfs.families).
            with open_regular(c.full) as f:
                data = f.read()
            stored = bearer.to_pathfree(c.rel, data) if len(data) == c.st.st_size else None
            if stored is not None:
                self._read_sizes[c.rel] = len(data)
                if self._packer is not None and len(stored) <= SMALL_OBJECT:
                    return _Blob(digest_bytes(stored), stored, remember=True)
                put = self.objects.put_bytes(stored)
                self.objects.remember(put.digest, stored)  # publication reads it back
                return put
        if self._packer is not None and c.st.st_size <= SMALL_OBJECT:
            with open_regular(c.full) as f:  # never a FIFO or a link a job left there
                data = f.read(SMALL_OBJECT + 1)
            if len(data) > SMALL_OBJECT:
                return self.objects.put_bytes(data)  # grew since the lstat: _finish defers it
            # The group check reads a commit record back.
            return _Blob(digest_bytes(data), data, remember=self._records)
        return self.objects.put_file(c.full)

    def _dedup(self, blobs: list[_Blob]) -> None:
        """Settle the small objects the root has packed already (one index read)."""
        known = self.index.pack_locations(self.root_id, {b.digest for b in blobs})
        for b in blobs:
            if b.remember:
                self.objects.remember(b.digest, b.data)
            loc = known.get(b.digest) or self.objects.locations.get(b.digest)
            if loc is not None:  # packed already (by this node, or named by a manifest read)
                self._reused[b.digest] = loc
                b.put = PutResult(b.digest, len(b.data), False)

    def _pack(self, b: _Blob, res: RoundResult) -> PutResult:
        """Store a new small object into this round's pack, in a pool thread: the loose
        probe is a round trip on a network filesystem, compression runs outside the GIL."""
        assert self._packer is not None
        if self.probe_loose and self.objects.has_sound(b.digest, len(b.data)):
            return PutResult(b.digest, len(b.data), False)  # older writers' loose copy
        self._packer.add(b.data, b.digest)
        return PutResult(b.digest, len(b.data), True)

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

    def _group_ready(self, rel: str, full: str) -> bool:
        try:
            with open(full, "rb") as f:
                children = self.rules.record_children(rel, f.read())
        except OSError:
            return False
        if children is None:
            return False
        for child in children:
            if child in self._batch or self.index.get_promoted(self.key, child) is not None:
                continue
            if (not os.path.exists(os.path.join(self._upper, child))
                    and isinstance(self.lower.lookup(child), Entry)):
                continue  # the child is served from lower, unchanged
            return False
        return True
