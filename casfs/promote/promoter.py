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
this node or a manifest it read knows, or loose where the published file at
its path has the same bytes) is not written again. The
round writes its packs completely under their digest names first, then
records the promoted entries and their pack locations in one index
transaction: a crash in between leaves an unnamed pack (gc's), never an
entry naming a pack that is not there.

Runs in a worker thread; a slow or failing shared root only delays promotion
(the path stays dirty and is retried), it never reaches the job.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from casfs.families import MAX_PARSED_BYTES, CacheRules, too_large_to_parse, walk_files
from casfs.index.node_index import NodeIndex
from casfs.index.promoted import PromotedRecord
from casfs.index.tree import DIR, LowerTree
from casfs.promote.tracker import WriteTracker
from casfs.store.entry import Entry, mtime_storable
from casfs.store.objects import (
    ObjectStore,
    PutResult,
    digest_bytes,
    max_object_bytes,
    read_regular_stat,
)
from casfs.store.packs import SMALL_OBJECT, Location, PackWriter
from casfs.util import beneath
from casfs.util.counters import Counters
from casfs.util.crashpoint import crashpoint, fault
from casfs.util.paths import is_valid_relpath

log = logging.getLogger(__name__)


PARALLEL_MIN = 8  # below this many tasks a step runs in the calling thread
PART_BYTES = 2 << 20  # small files read and hashed, then packed, as one part (a short
# head and tail: packing starts after one part and the last one is packed alone)
PARTS_IN_FLIGHT = 2  # parts being packed while the next one is read
PACKING_THREADS = 2  # parts packed at once: one part's pack writes overlap the next one's zstd
ZSTD_THREADS = 2  # zstd's native threads per part being packed
PROBE_CHUNK = 32  # loose probes per pool task
_T = TypeVar("_T")
# lstat errors that settle a path: gone, a symlink or a file on its way, a name that is
# not a plain relative path (EINVAL; forgotten like the invalid names below)
_GONE = (errno.ENOENT, errno.EINVAL, *beneath.REFUSED)


@dataclass(slots=True)  # not frozen: a frozen __init__ costs ~1 us more per file
class _Candidate:
    rel: str
    st: os.stat_result
    seen_at: float
    after: os.stat_result | None = None  # its fstat once read (else _finish lstats it)


@dataclass(slots=True)
class _Blob:
    """A small object read and hashed, to store once the wave's dedup has run."""
    digest: str
    data: bytes
    rel: str
    remember: bool = False  # keep its bytes (publication reads it back)
    put: PutResult | None = None  # set once stored or found in the root
    probe: bool = False  # the lower names these bytes at this path: look for a loose copy


@dataclass
class RoundResult:
    promoted: int = 0
    bytes: int = 0
    deferred: int = 0
    errors: int = 0
    last_error: str = ""  # the last error's message, for `casfs publish` and status
    linked: int = 0  # promoted files with other names (hard links): worth a walk after



_said_unusable: set[str] = set()


def _say_once(rel: str, why: str, level: int = logging.WARNING) -> None:
    """One line per path and process: a commit record no client could use stays local."""
    if rel in _said_unusable:
        return
    if len(_said_unusable) > 4096:
        _said_unusable.clear()
    _said_unusable.add(rel)
    log.log(level, "not publishing %s: %s", rel, why)


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
        reader: tuple[int, int] | None = None,
        threads: int = 4,
        packs: bool = True,
        root_id: str = "",
        probe_loose: bool = True,
        progress: Callable[[], None] | None = None,
        ctimes: dict[str, int] | None = None,
    ) -> None:
        self.upper = upper
        # Files are opened with these fs credentials (dir mode: the tenant's), so the
        # kernel refuses what she could not read herself; None: as this process.
        self.reader = reader
        # The upper is the tenant's to write (through the view, or directly in dir and
        # overlay modes): every path in it is resolved beneath this fd of it, with no
        # symlink followed (casfs.util.beneath), open for the round or the scan.
        self._base = -1
        self._known: dict[str, PromotedRecord] = {}  # this wave's promoted records
        # ctime of each path hashed whose ctime is not its mtime (see _settled): the
        # caller's, kept from round to round (a round's Promoter is made anew)
        self.ctimes: dict[str, int] = ctimes if ctimes is not None else {}
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
        self._batch_ctimes: dict[str, int] = {}  # their ctimes, for ctimes once indexed
        self._proc_decides = False  # this round: writers come from busy(), not the tracker
        self._read_sizes: dict[str, int] = {}  # path-bearing files: bytes read, before rewriting
        self.packs = packs  # small objects into packs (casfs.store.packs)
        self.root_id = root_id  # pack locations are per shared root
        # Look for a loose copy (older writers) of a new small object whose bytes the
        # published file at its path has (a job rewrote it)? An lstat on a POSIX root; on
        # an object store a request, what packs save: there only packed copies this node
        # knows of are found (docs/format.md). Other new small objects are not probed.
        self.probe_loose = probe_loose
        # A round keeps its batch and its pack writer on the instance: two rounds at
        # once (the periodic one and a publication's) would swap packers mid-round and
        # record objects in a pack that is never written. One round at a time.
        self._round = threading.Lock()
        self._packer: PackWriter | None = None  # this round's
        self._reused: dict[str, Location] = {}  # digest -> where it is packed already
        self._unstored: set[str] = set()  # this round's objects whose loose probe failed
        self._lower_dirs: dict[str, bool] = {}  # this round's: directory -> in the lower
        self._max_object = max_object_bytes()  # read once per wave (the environment's)
        self._packing: ThreadPoolExecutor | None = None  # this round's packing thread
        self._inflight: deque[Future[None]] = deque()  # parts being packed
        self._group_data: dict[str, bytes] = {}  # commit records read by the group check
        # Called after each step of each path (the promotion worker's sign of life).
        self.progress = progress

    def scan_all(self) -> int:
        """Mark every upper file not yet promoted as dirty (start-up, crash recovery)."""
        n = 0
        try:
            base = beneath.open_base(self.upper)  # its own: a round may run meanwhile
        except FileNotFoundError:
            return 0
        except OSError as e:  # e.g. a FUSE mount of the tenant's own over the directory
            if e.errno not in beneath.REFUSED:
                raise
            log.warning("not looking for files to promote in %s: %s", self.upper, e.strerror)
            return 0
        try:
            for rel, _, scratch in walk_files(self.upper, self.rules, base):
                if scratch:
                    continue
                try:
                    st = beneath.lstat(base, rel)
                except OSError:  # gone, or a symlink on its way: nothing to promote
                    continue
                if self._settled(rel, st):
                    continue
                self.tracker.modified(rel)
                n += 1
        finally:
            os.close(base)
        return n

    @contextlib.contextmanager
    def _upper_fd(self, res: RoundResult) -> Iterator[bool]:
        """The upper's fd, for a round; False if it cannot be opened (no upper yet: every
        path stays dirty)."""
        try:
            self._base = beneath.open_base(self.upper)
        except OSError as e:
            self._failed(e, res)
            yield False
            return
        try:
            yield True
        finally:
            os.close(self._base)
            self._base = -1

    def run_once(self, *, final: bool = False) -> RoundResult:
        """Promote every quiet dirty path; ``final`` ignores the quiet period (shutdown)."""
        res = RoundResult()
        with self._round, self._upper_fd(res) as opened:
            return self._run_once(final) if opened else res

    def _run_once(self, final: bool) -> RoundResult:
        res = RoundResult()
        self._batch = {}
        self._batch_ctimes = {}
        self._packer = PackWriter(self.objects) if self.packs else None
        self._reused = {}
        self._unstored = set()
        self._lower_dirs = {}
        self._inflight = deque()
        self._group_data = {}
        # At shutdown /proc (busy) decides who still writes, not inotify's lagging closes.
        self._proc_decides = final and self.busy is not None
        paths = self.tracker.quiet(0.0 if final else self.stable_after,
                                   with_writers=self._proc_decides)
        if self.busy is not None:
            held = self.busy(paths)
            res.deferred += len(held)
            paths = [p for p in paths if p not in held]
        # Commit records last, so a group and its children can go in one round.
        is_record = self.rules.is_commit_record
        waves = ([p for p in paths if not is_record(p)], [p for p in paths if is_record(p)])
        # Packing (zstd in native threads, pack writes) runs beside this thread, which
        # reads and hashes the next part meanwhile.
        with (ThreadPoolExecutor(self.threads) as pool,
              ThreadPoolExecutor(PACKING_THREADS) as packing):
            self._packing = packing
            for records, wave in enumerate(waves):
                if wave:
                    self._records = bool(records)
                    self._promote_wave(wave, res, pool)
            self._drain(0, res)
        located = self._flush_packs(res)
        if self._batch:
            crashpoint("after-objects")
        # One index transaction per round, not one disk sync per file.
        self.index.add_promoted_many(self.key, [e for e, _ in self._batch.values()], located,
                                     self.root_id)
        for rel, (_, seen_at) in self._batch.items():
            self.tracker.forget(rel, seen_at)
        self.ctimes.update(self._batch_ctimes)
        self._batch_ctimes = {}
        if res.promoted:
            self.counters.inc("promoted_files", res.promoted)
            self.counters.inc("promoted_bytes", res.bytes)
        return res

    def _promote_wave(self, wave: list[str], res: RoundResult, pool: ThreadPoolExecutor) -> None:
        """Check, read and hash, dedup, then store one wave's paths.

        The index is read once per wave (every path's promoted record), then once
        per part (every new small object's pack location), not once per file. Large
        files are stored loose in ``pool`` (their zstd runs outside the GIL) while
        this thread reads and hashes the small ones (local upper files: a pool task
        per few-KB file cost more than it saved); the small ones are compressed in
        one native multi-threaded call per part (PackWriter.add_many).
        """
        self._known = self.index.get_promoted_many(self.key, wave)
        self._max_object = max_object_bytes()
        part: list[_Candidate] = []
        nbytes = 0
        # Checked as read, part by part: packing starts after one part, not the whole wave.
        for rel in wave:
            c = self._guarded(self._check, rel, res)
            if c is None:
                continue
            part.append(c)
            nbytes += c.st.st_size
            if nbytes >= PART_BYTES:
                self._promote_part(part, res, pool)
                part, nbytes = [], 0
        if part:
            self._promote_part(part, res, pool)

    def _promote_part(self, todo: list[_Candidate], res: RoundResult,
                      pool: ThreadPoolExecutor) -> None:
        """Store ``todo`` (at most ~PART_BYTES of small files in memory at once)."""
        packing = self._packer is not None
        large = {i: pool.submit(self._guarded, self._read, c, res) for i, c in enumerate(todo)
                 if not packing or c.st.st_size > SMALL_OBJECT}
        got: list[_Blob | PutResult | None] = [
            None if i in large else self._guarded(self._read, c, res)
            for i, c in enumerate(todo)]
        for i, fut in large.items():
            got[i] = fut.result()
        small = [g for g in got if isinstance(g, _Blob)]
        if small:
            self._dedup(small)
            self._pack_new([b for b in small if b.put is None], res, pool)
        for cand, g in zip(todo, got, strict=True):
            put = g.put if isinstance(g, _Blob) else g
            if put is not None:
                self._guarded(self._finish, (cand, put), res)

    def _pack_new(self, new: list[_Blob], res: RoundResult, pool: ThreadPoolExecutor) -> None:
        """Store new small objects into this round's packs, in the packing thread (sets
        each blob's ``put`` now: an object that cannot be stored leaves the batch in
        _flush_packs, its path stays dirty)."""
        assert self._packer is not None and self._packing is not None
        for b in new:
            b.put = PutResult(b.digest, len(b.data), True)
        if not new:
            return
        items = [(b.digest, b.data) for b in new if not b.probe]
        probe = [(b.digest, b.data) for b in new if b.probe]
        # Loose copies: a round trip each on a network filesystem, so in the pool, a
        # chunk per task; the packing thread waits for them, not this one (it reads and
        # hashes the next part meanwhile).
        probes = [pool.submit(self._probe, probe[i:i + PROBE_CHUNK], res)
                  for i in range(0, len(probe), PROBE_CHUNK)]
        self._drain(PARTS_IN_FLIGHT - 1, res)  # bounds the bytes held for packing
        self._inflight.append(self._packing.submit(self._pack_part, self._packer, items, probes))

    def _pack_part(self, packer: PackWriter, items: list[tuple[str, bytes]],
                   probes: list[Future[list[tuple[str, bytes]]]]) -> None:
        """Packing thread: pack ``items`` and what the loose probes left of theirs."""
        packer.add_many(items + [item for f in probes for item in f.result()], ZSTD_THREADS)

    def _drain(self, keep: int, res: RoundResult) -> None:
        """Wait until at most ``keep`` parts are being packed. A part whose pack could be
        written neither way is settled by _flush_packs (its paths stay dirty)."""
        while len(self._inflight) > keep:
            try:
                self._inflight.popleft().result()
            except OSError as e:
                self._failed(e, res)

    def _probe(self, items: list[tuple[str, bytes]], res: RoundResult,
               ) -> list[tuple[str, bytes]]:
        """``items`` but for those an intact loose object holds; a failed probe's object
        goes to ``_unstored`` (its paths stay dirty: retried next round)."""
        has_sound = self.objects.has_sound
        out = []
        for item in items:
            try:
                if has_sound(item[0], len(item[1])):
                    continue
            except OSError as e:
                self._unstored.add(item[0])
                self._failed(e, res)
                continue
            out.append(item)
        return out

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
            if (e.errno == errno.EACCES and self.reader is not None
                    and isinstance(arg, _Candidate)):
                # Not hers to read (a link to a file of someone else's, or one she made
                # unreadable): settled, never published, until it changes again.
                log.info("not promoting %s: the tenant cannot read it", arg.rel)
                self.counters.inc("promote_unreadable")
                self.tracker.forget(arg.rel, arg.seen_at)
                return None
            self._failed(e, res)
            return None
        finally:
            if self.progress is not None:
                self.progress()

    def _failed(self, e: OSError, res: RoundResult) -> None:
        if e.errno == errno.ENOENT:
            # Removed by the job between two steps (a quota refusal's cleanup, a compiler
            # replacing its output): no failure; the next round's check forgets it.
            log.info("promotion step: %s vanished meanwhile", e.filename or e)
            return
        res.errors += 1
        res.last_error = str(e)
        self.counters.inc("promote_errors")
        log.warning("promotion step failed (will retry): %s", e)

    def _check(self, rel: str, res: RoundResult) -> _Candidate | None:
        """Whether ``rel`` needs hashing now; settles the paths that do not."""
        fault("promote-file", rel)
        seen_at = time.monotonic()
        try:
            st = beneath.lstat(self._base, rel)
        except OSError as e:
            if e.errno not in _GONE:
                raise
            if e.errno in beneath.REFUSED and e.errno != errno.ENOTDIR:
                log.info("not promoting %s: a symlink on its way (never followed)", rel)
            self.tracker.forget(rel, seen_at)
            return None
        if stat.S_ISDIR(st.st_mode):
            # A directory renamed into place (Inductor's TritonBundler): promote its files.
            self.tracker.forget(rel, seen_at)
            if not self.rules.is_scratch(rel):
                for f in beneath.walk(self._base, rel):
                    self.tracker.modified(f)
            return None
        if (not stat.S_ISREG(st.st_mode) or self.rules.is_scratch(rel)
                or not is_valid_relpath(rel)):
            self.tracker.forget(rel, seen_at)
            return None
        if not mtime_storable(st.st_mtime_ns):
            # Dated past 2262: no manifest holds it (and the index would fail the
            # whole round). It stays local, like a name no manifest holds.
            self.tracker.forget(rel, seen_at)
            log.warning("not promoting %s: its mtime (%d ns) is out of range", rel,
                        st.st_mtime_ns)
            return None
        if st.st_size > self._max_object:
            # Every reader would refuse it (objects.max_object_bytes): keep it local.
            self.tracker.forget(rel, seen_at)
            self.counters.inc("promote_skipped_too_large")
            log.warning("not promoting %s: %d bytes is over the object size limit", rel,
                        st.st_size)
            return None
        if self._settled(rel, st, prefetched=True):
            self.tracker.forget(rel, seen_at)
            return None
        if self._records and not self._group_ready(rel, st.st_size):
            res.deferred += 1
            return None
        return _Candidate(rel, st, seen_at)

    def _settled(self, rel: str, st: os.stat_result, *, prefetched: bool = False) -> bool:
        """Whether ``rel`` as ``st`` is already promoted or was put there by casfs
        (``prefetched``: its promoted record, if any, is in this wave's ``_known``)."""
        if self.unchanged is not None and self.unchanged(rel, st):
            return True
        rec = self._known.get(rel) if prefetched else self.index.get_promoted(self.key, rel)
        if rec is None or rec.entry.mtime_ns != st.st_mtime_ns:
            return False
        # A write sets mtime and ctime alike; a ctime past the mtime is a change since
        # (a rewrite of the same size with its mtime put back, as cp -p does, was taken
        # for the promoted file: a review, 2026-12-06), unless this process hashed the
        # file as it is (its mtime set by whoever made it: copied, restored).
        if st.st_ctime_ns != st.st_mtime_ns and self.ctimes.get(rel) != st.st_ctime_ns:
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
            elif entry.digest in self._unstored or (
                    entry.digest in packer.added and entry.digest not in packer.loose):
                del self._batch[rel]  # its loose probe failed (counted), or its pack was
                res.promoted -= 1  # not written
                res.bytes -= entry.size
                res.errors += entry.digest not in self._unstored
        # Publication reads some of them back (our own locations: no parsing needed).
        self.objects.locations.update(located)
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
            data = self._group_data.pop(c.rel, None)  # read by the group check already
            if data is None:
                data = self._read_upper(c.rel, c.st.st_size + 1, c.st.st_size)[0]
            stored = bearer.to_pathfree(c.rel, data) if len(data) == c.st.st_size else None
            if stored is not None:
                self._read_sizes[c.rel] = len(data)
                if self._packer is not None and len(stored) <= SMALL_OBJECT:
                    return _Blob(digest_bytes(stored), stored, c.rel, remember=True)
                put = self.objects.put_bytes(stored)
                self.objects.remember(put.digest, stored)  # publication reads it back
                return put
        if self._packer is not None and c.st.st_size <= SMALL_OBJECT:
            # No FIFO, no link; its stat once read: _finish needs no second lookup.
            data, c.after = self._read_upper(c.rel, SMALL_OBJECT + 1, c.st.st_size)
            if len(data) > SMALL_OBJECT:
                return self.objects.put_bytes(data)  # grew since the lstat: _finish defers it
            # The group check reads a commit record back.
            return _Blob(digest_bytes(data), data, c.rel, remember=self._records)
        fd = self._open(c.rel)
        try:
            return self.objects.put_file(fd)
        finally:
            os.close(fd)

    def _read_upper(self, rel: str, limit: int, size: int) -> tuple[bytes, os.stat_result]:
        """read_regular_stat of ``rel`` opened beneath the upper (no symlink followed)."""
        fd = self._open(rel)
        try:
            return read_regular_stat(fd, limit, size)
        finally:
            os.close(fd)

    def _open(self, rel: str) -> int:
        """``rel`` opened for reading beneath the upper, as ``reader`` where set."""
        if self.reader is None:
            return beneath.open_read(self._base, rel)
        with beneath.as_tenant(*self.reader):
            return beneath.open_read(self._base, rel)

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
            elif self.probe_loose and self._lower_dir(b.rel.rpartition("/")[0]):
                # The same bytes as the published file at this path (a job rewrote it):
                # maybe a loose object (older writers); only these are probed, not every
                # new object (a stat each, and threads taking the GIL from this one).
                low = self.lower.lookup(b.rel)
                b.probe = isinstance(low, Entry) and low.digest == b.digest

    def _lower_dir(self, d: str) -> bool:
        """Whether the lower has directory ``d`` (once per directory and round: a new
        kernel's files sit in a new directory, so their paths are not looked up)."""
        known = self._lower_dirs.get(d)
        if known is None:
            known = self._lower_dirs[d] = self.lower.lookup(d) is DIR
        return known

    def _finish(self, item: tuple[_Candidate, PutResult], res: RoundResult) -> None:
        c, put = item
        st = c.st
        after = c.after or beneath.lstat(self._base, c.rel)
        read_size = self._read_sizes.pop(c.rel, put.size)
        # The inode too: one renamed over the path between the check and the read.
        if (after.st_size, after.st_mtime_ns, after.st_ino) != (
                st.st_size, st.st_mtime_ns, st.st_ino) or (
            read_size != st.st_size
            or (self.tracker.has_writers(c.rel) and not self._proc_decides)
        ):
            res.deferred += 1  # changed while hashing: not stable yet
            return
        entry = Entry(c.rel, put.digest, put.size, st.st_mode & 0o7777, st.st_mtime_ns)
        self._batch[c.rel] = (entry, c.seen_at)
        if st.st_ctime_ns != st.st_mtime_ns:
            self._batch_ctimes[c.rel] = st.st_ctime_ns
        if st.st_nlink > 1:
            res.linked += 1
        res.promoted += 1
        res.bytes += put.size

    def _group_ready(self, rel: str, size: int) -> bool:
        if too_large_to_parse(size):  # not in the format: never read, never a group
            _say_once(rel, f"a commit record of {size} bytes, past the {MAX_PARSED_BYTES}"
                           " casfs parses (not in its family's format)")
            return False
        try:
            data = self._read_upper(rel, size + 1, size)[0]
        except OSError:
            return False
        children = self.rules.record_children(rel, data)
        if children is None:
            _say_once(rel, "a commit record not in its family's format (unparsable, or past"
                           " the items casfs parses)", logging.INFO)
            return False
        for child in children:
            if child in self._batch or self.index.get_promoted(self.key, child) is not None:
                continue
            if (not self._in_upper(child)
                    and isinstance(self.lower.lookup(child), Entry)):
                continue  # the child is served from lower, unchanged
            return False
        self._group_data[rel] = data  # _read stores these bytes (no second read)
        return True

    def _in_upper(self, rel: str) -> bool:
        """Whether anything is at ``rel`` in the upper (a path through a symlink counts:
        its group waits rather than trust the lower)."""
        try:
            return beneath.lexists(self._base, rel)
        except OSError:
            return True
