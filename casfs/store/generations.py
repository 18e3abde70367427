"""Generations: immutable, numbered snapshots of a namespace, published lock-free.

A generation is a record ``namespaces/<ns>/generations/<seq>`` naming the
manifest parts (a base and deltas) that make up its snapshot; the record's
format, its names and the name checks are casfs.store.record. This module
reads records (the newest readable one, skipping damage), merges their parts
into snapshots (casfs.store.snapshot: one rule, used both to build a snapshot
whole and to advance one already held), publishes, drops, pins and
enumerates them.

The snapshot is the union of ``base`` and every delta. Publication is
first-writer-wins, so a path once published never changes, except a
*replaced* path: an entry whose extras hold ``"replace": true`` (a path a
cache family declares rewritten, casfs.families) overrides the same path in
an earlier part, and a record holding one ``requires`` the ``replace``
feature. Every other duplicate is damage. Publishing 10 files on
top of 100,000 writes one 10-entry delta object and one record; every
``COMPACT_DELTAS`` deltas (or when deltas grow past a quarter of the base) the
publisher writes a new full base instead, so readers never chase long chains.

Publication (docs/format.md, "Publication protocol"): objects are uploaded
first; then the newest record N is read, the additions merged, the delta
stored, and record N+1 created with link() (atomic, EEXIST if another node
won). On EEXIST the publisher re-reads, re-merges and retries with jitter, a
bounded number of times. A record only ever names objects that already exist.

Layering: GenerationStore works on a ``RootLike`` (casfs.store.rootlike:
backend, objects, trust), not on casfs.store.root's SharedRoot, which is
above this module (``SharedRoot.generations()``). Below it: casfs.store.record,
casfs.store.snapshot, casfs.store.freshness, casfs.store.marks,
casfs.store.packs, casfs.store.manifest, casfs.store.objects. Record, Part,
parse_record, check_name, Snapshot and the format's constants are re-exported
here under their old names.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, cast

from casfs import __version__
from casfs.errors import (
    CasfsError,
    CorruptObjectError,
    HostileManifestError,
    NewerFormatError,
    NotFoundError,
    ObjectMissingError,
    PublishDeferredError,
    PublishError,
    QuotaExceededError,
    UnreadableHereError,
    UsageError,
)
from casfs.store import createonly, manifest
from casfs.store.backend import Backend, NotRegularFileError
from casfs.store.digests import digest_bytes
from casfs.store.entry import Entry
from casfs.store.freshness import JUNK_SCAN, Head, Heads, RolledBackError, record_digest
from casfs.store.marks import Condemned
from casfs.store.objects import object_key
from casfs.store.packs import pack_key, packs_of, put_pack_bytes, rewrite_forward, rewrite_pack
from casfs.store.record import (
    MAX_RECORD_BYTES,
    NAME_RE,
    NS_RE,
    REPLACE,
    SEQ_WIDTH,
    SUPPORTED_FEATURES,
    Part,
    Record,
    check_name,
    is_replace,
    parse_record,
    seq_name,
)
from casfs.store.record import RELOCATE as RELOCATE  # re-exported: its old home
from casfs.store.rootlike import RootLike
from casfs.store.snapshot import Snapshot, check_tree, merge_part
from casfs.util import jsonsafe
from casfs.util.crashpoint import crashpoint
from casfs.util.paths import parent_dirs

log = logging.getLogger(__name__)

_DAMAGE = (HostileManifestError, CorruptObjectError, ObjectMissingError, NotFoundError)
COMPACT_DELTAS = 32
# A record whose manifest is missing is skipped only once it is this old (seconds).
MISSING_GRACE = 600.0
# latest_seq probes forward at most this many seqs before listing instead (a run of
# planted records above the newest must not cost one request each, without end).
PROBE_STEPS = 64
# On an object store, a probe that found this many newer seqs lists the rest from there
# (one LIST with start-after, then a HEAD past its last) instead of a HEAD each: a node
# k records behind (a refresh, a publisher that lost a race to a fleet's others) pays
# ~4 round trips, not k + 1 (docs/fleet.md, "Publishing at once").
PROBE_BEFORE_LIST = 2
# A manifest part this store put this recently is taken as stored: a publication that
# lost a race writes the same delta part again (its entries are the same), and on an
# object store that create-only PUT, refused, was then checked (two requests a lost
# race). A part a gc condemned meanwhile is still written again (_save_condemned).
PART_STORED_FRESH = 60.0
PARTS_STORED_KEPT = 64
# Parsed manifest parts kept in memory (LRU), in entries: bounds a daemon's RSS.
PART_CACHE_ENTRIES = 400_000
# A generation's manifest parts not cached yet are read this many at once (a base and
# its deltas: each a GET; eleven in a row were a fresh node's mount-ready at 20 ms RTT).
PART_READS = 8
# Records read, kept for ``record(..., cached=True)``: a node's mount reads its served
# generation's record to serve it, then again for the access profile and for the
# compile times (three GETs of one key from every node of a fleet start, docs/fleet.md).
RECORDS_KEPT = 64
# Seconds a LIST read beside the root's marker stands for the mount's own first LIST.
LISTING_FRESH = 5.0
# A record read, or a newest seq found, this recently is taken again for a publication:
# the promotion round that just located packs in the served record does not make the
# publication built on it read it again, and a second look for the newest probes
# forward from the first's answer (one HEAD, not a LIST and a HEAD). A lost race
# re-reads anyway: creating the record is what decides.
NEWEST_FRESH = 5.0
# A publication builds on the newest seq found this recently (by this process, or by the
# mount process that sent it: note_newest) without looking again, and on that record if
# read this recently: creating the record is what decides, a newer generation makes it
# fail and the retry looks, so a stale answer costs a retry, never a lost or wrong one.
# The mount's refresh (every 30 s) keeps its answer this fresh: a release publishes
# without the LIST and the HEAD (two round trips after the job).
PUBLISH_FRESH = 45.0


def _seq_names(names: Iterable[str]) -> list[int]:
    """The seqs among a generations directory's names, sorted."""
    out = []
    for name in names:
        # seq_name pads to SEQ_WIDTH digits and grows past 10**12 - 1 (which a
        # record planted at 999999999999 brings about): every name seq_name makes,
        # else gc, verify and `generations` would not see the newest generations.
        if len(name) >= SEQ_WIDTH and name.isascii() and name.isdigit() \
                and name == seq_name(int(name)):
            out.append(int(name))
    return sorted(out)


def _beside(fn: Callable[[], Any]) -> Callable[..., Any]:
    """``fn()`` started in a thread now; the callable returned waits for its result
    (raising what it raised; given a timeout, TimeoutError after it)."""
    fut: Future[Any] = Future()

    def run() -> None:
        try:
            fut.set_result(fn())
        except BaseException as e:  # handed to whoever waits
            fut.set_exception(e)

    threading.Thread(target=run, name="casfs-beside", daemon=True).start()
    return fut.result


@dataclass
class PublishResult:
    namespace: str
    seq: int | None  # the generation now holding the additions (None: nothing published yet)
    added: int = 0
    already: int = 0  # same path, same bytes: already published
    conflicts: int = 0  # same path, other bytes: the published entry stays
    attempts: int = 0
    added_bytes: int = 0
    conflict_paths: list[str] = field(default_factory=list)
    replaced: int = 0  # replaced paths whose newer version overrides the published one
    repaired: int = 0  # published rows whose size was wrong for their digest, put right


@dataclass(frozen=True)
class Skipped:
    """A record newest_valid passed over: which, why (damaged, newer-format, ...), the error."""

    namespace: str
    seq: int
    what: str
    error: CasfsError

    def describe(self) -> str:
        """One line: the generation, the kind, the reason (no newline from the error)."""
        msg = " ".join(self.error.message.split())
        return f"{self.what} generation {self.namespace}@{self.seq} ({msg})"

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "kind": self.what, "error": " ".join(self.error.message.split())}


PACK_SAVED = "pack:"  # _save_condemned's key prefix for a pack's bytes


def packed(e: Entry) -> bool:
    """Whether ``e``'s bytes live in a pack object (its ``pack`` extras)."""
    return bool(e.extras and "pack" in e.extras)


class GenerationStore:
    """Read, publish, pin and enumerate generations in a shared root."""

    def __init__(self, root: RootLike) -> None:
        self.root = root
        self.backend = root.backend
        self.objects = root.objects
        self.trust = root.trust
        # Parsed manifest parts by digest: immutable, so safe to keep; saves
        # re-reading the base on every publish.
        self._parts: OrderedDict[str, list[Entry]] = OrderedDict()
        self._cached_entries = 0
        # Held for the cache's own updates only, never across a read: parts are read
        # several at a time (casfs.cli.misscause's namespaces, the mount's threads).
        self._parts_lock = threading.Lock()
        self._noted: set[tuple[str, int, str]] = set()
        self._latest: dict[str, Snapshot] = {}  # ns -> newest snapshot seen (_snapshot_of)
        self._condemned: Condemned | None = None
        # Signed statements of each namespace's newest generation (signature trust).
        self.heads = Heads(self.backend, self.trust, self.objects.counters)
        self._rolled: set[tuple[str, int]] = set()  # rollbacks reported (once each)
        # (ns, seq) -> (the record's digest, the record): records are never rewritten
        # (publication creates a new seq); only callers that ask take a kept one.
        self._records: OrderedDict[tuple[str, int], tuple[str, Record]] = OrderedDict()
        # ns -> (when, the names a LIST of its generations gave): ``seed_listing``.
        self._listed: dict[str, tuple[float, list[str]]] = {}
        # ns -> (newest seq found, when): NEWEST_FRESH; (ns, seq) -> when its record was read.
        self._newest: dict[str, tuple[int, float]] = {}
        self._read_at: dict[tuple[str, int], float] = {}
        # a manifest part's digest -> when this store put it: PART_STORED_FRESH
        self._parts_stored: OrderedDict[str, float] = OrderedDict()

    # --- enumeration ------------------------------------------------------
    def namespaces(self) -> list[str]:
        return [n for n in self.backend.list("namespaces") if NS_RE.match(n)]

    @staticmethod
    def list_names(backend: Backend, ns: str) -> list[str]:
        """The raw names a LIST of ``ns``'s generations gives (for ``seed_listing``)."""
        check_name(ns)
        return list(backend.list(f"namespaces/{ns}/generations"))

    def seed_listing(self, ns: str, names: list[str]) -> None:
        """``list_names`` just read for ``ns`` (beside the root's marker): the next
        ``seqs(ns)`` takes it instead of listing again, if it comes within
        LISTING_FRESH seconds."""
        self._listed[ns] = (time.monotonic(), names)

    def seeded_newest(self, ns: str) -> int | None:
        """The newest seq of the seeded listing (no request; it stays for ``seqs``), or
        None: a guess, to read its record while the HEAD past it runs."""
        seeded = self._listed.get(ns)
        if seeded is None or time.monotonic() - seeded[0] >= LISTING_FRESH:
            return None
        got = _seq_names(seeded[1])
        return got[-1] if got else None

    def read_listed_newest(self, ns: str, timeout: float) -> Callable[[], Record | None]:
        """Start reading the record the seeded listing names newest, in a thread: beside
        the HEAD past it that ``latest_seq`` sends next (a round trip of a fresh start);
        a newest_valid soon after takes it. The callable waits for it at most ``timeout``
        s; None: nothing seeded, the read failed or is still running (read again then).
        A LIST that lags wastes that one read."""
        seq = self.seeded_newest(ns)
        if seq is None:
            return lambda: None
        reading = _beside(functools.partial(self.record, ns, seq))

        def wait() -> Record | None:
            try:
                return cast(Record, reading(timeout))
            except Exception:  # (TimeoutError too) newest_valid reads it, and says why
                return None

        return wait

    def seqs(self, ns: str) -> list[int]:
        check_name(ns)
        seeded = self._listed.pop(ns, None)
        return _seq_names(seeded[1] if seeded is not None
                          and time.monotonic() - seeded[0] < LISTING_FRESH
                          else self.backend.list(f"namespaces/{ns}/generations"))

    def latest_seq(self, ns: str, hint: int | None = None) -> int | None:
        """Newest seq. With ``hint`` (a seq known to exist) probe forward instead of listing.

        Probing takes at most PROBE_STEPS requests before listing instead, a
        few times over, so a run of planted names above the newest costs a
        bounded number of requests. A ``hint`` that is gone, with nothing at or
        above it, is a rollback (reported once: ``rolled_back_generations``).
        """
        self.trust.check_namespace(ns)
        known = self._newest.get(ns) if hint is None else None
        if known is not None and time.monotonic() - known[1] < NEWEST_FRESH:
            seq, ended = self._probe(ns, known[0])
            if ended:  # (the time it was found stays: a LIST again after NEWEST_FRESH)
                return seq
        gone = None
        seq = 0
        if hint is not None:
            if self.backend.info(self._key(ns, hint)) is not None:
                seq, ended = self._probe(ns, hint)
                if ended:
                    return seq
            else:
                gone = hint
        # A LIST may lag behind creates on some object stores: never trust its
        # end, probe forward from it (one HEAD/stat when it is up to date).
        for _ in range(3):
            seqs = self.seqs(ns)
            seq, ended = self._probe(ns, max(seq, seqs[-1] if seqs else 0))
            if ended:
                break
        if gone is not None and seq < gone:
            self._rolled_back(ns, gone, f"generation {gone}, read before, is gone (the"
                              f" newest now is {seq or 'none'}); still serving what was read")
        if seq:
            self._newest[ns] = (seq, time.monotonic())
        return seq or None

    def _fresh(self, ns: str, seq: int, within: float = NEWEST_FRESH) -> bool:
        """Whether ``ns@seq``'s record was read within ``within`` s (then it is taken)."""
        at = self._read_at.get((ns, seq))
        return at is not None and time.monotonic() - at < within

    def newest_known(self, ns: str) -> tuple[int, float] | None:
        """(the newest seq of ``ns`` this store found, when: CLOCK_MONOTONIC), or None."""
        return self._newest.get(ns)

    def note_newest(self, ns: str, seq: int, at: float) -> None:
        """Another process of this node found ``ns@seq`` the newest at ``at`` (its
        CLOCK_MONOTONIC: the same clock): kept unless this store knows better."""
        known = self._newest.get(ns)
        if seq > 0 and at <= time.monotonic() and (known is None or (seq, at) > known):
            self._newest[ns] = (seq, at)

    def known_record(self, ns: str, seq: int) -> bytes | None:
        """The record ``ns@seq`` as this store read it (re-serialised), or None."""
        kept = self._records.get((ns, seq))
        return kept[1].to_json() if kept is not None else None

    def note_record(self, ns: str, seq: int, data: bytes) -> None:
        """Record ``ns@seq`` as another process of this node read and checked it (the
        mount process, for its promotion worker): parsed and kept as if read here now."""
        rec = parse_record(data, ns, seq)
        self._records[(ns, seq)] = (record_digest(data), rec)
        self._read_at[(ns, seq)] = time.monotonic()

    def _recent_newest(self, ns: str) -> int | None:
        known = self._newest.get(ns)
        if known is not None and time.monotonic() - known[1] < PUBLISH_FRESH:
            return known[0]
        return None

    def _probe(self, ns: str, seq: int) -> tuple[int, bool]:
        """(the last seq present from ``seq`` on, whether the run ended within PROBE_STEPS).

        A listing never ends the run by itself (a LIST may lag behind creates): the
        HEAD past its last does."""
        for step in range(1, PROBE_STEPS + 1):
            if self.backend.info(self._key(ns, seq + 1)) is None:
                return seq, True
            seq += 1
            if step == PROBE_BEFORE_LIST and self.backend.remote:
                listed = _seq_names(self.backend.list_after(f"namespaces/{ns}/generations",
                                                            seq_name(seq)))
                seq = max(seq, listed[-1]) if listed else seq
        return seq, False

    def _rolled_back(self, ns: str, seq: int, why: str,
                     skipped: list[Skipped] | None = None) -> None:
        """Report once per process that ``ns`` was rolled back below ``seq`` (a WARNING)."""
        if skipped is not None:
            skipped.append(Skipped(ns, seq, "rolled back", RolledBackError(
                f"namespace {ns} was rolled back: {why}")))
        if (ns, seq) in self._rolled:
            return
        self._rolled.add((ns, seq))
        self.objects.counters.inc("rolled_back_generations")
        log.warning("rolled back: namespace %s: %s", ns, why)

    def _key(self, ns: str, seq: int) -> str:
        return f"namespaces/{ns}/generations/{seq_name(seq)}"

    def exists(self, ns: str, seq: int) -> bool:
        """Whether ``ns``'s record ``seq`` is there (one HEAD or stat, no listing)."""
        check_name(ns)
        return self.backend.info(self._key(ns, seq)) is not None

    # --- reading ----------------------------------------------------------
    def record(self, ns: str, seq: int, *, digest: str | None = None,
               cached: bool = False) -> Record:
        """Record ``ns@seq``, checked; with ``digest`` its bytes must hash to it (a statement).

        ``cached``: the one this store read last for ``ns@seq``, if any (no request),
        for readers of a generation being served; others read the root each time (gc,
        retention and listings must see a record removed)."""
        check_name(ns)
        kept = self._records.get((ns, seq)) if cached else None
        if kept is not None and (digest is None or kept[0] == digest):
            return kept[1]
        try:
            with self.backend.open(self._key(ns, seq)) as f:
                data = f.read(MAX_RECORD_BYTES + 1)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFoundError(f"no generation {ns}@{seq}") from None
        except NotRegularFileError:
            raise HostileManifestError(f"generation {ns}@{seq}: not a regular file") from None
        if len(data) > MAX_RECORD_BYTES:
            raise HostileManifestError(f"generation {ns}@{seq}: record too large")
        if digest is not None and record_digest(data) != digest:
            raise HostileManifestError(f"generation {ns}@{seq}: not the record its statement"
                                       " names (another one was put in its place)")
        self.trust.check_record(ns, data)
        rec = parse_record(data, ns, seq)
        kept_now = self._records  # threads share the store: a race only drops an entry
        kept_now[(ns, seq)] = (record_digest(data), rec)
        self._read_at[(ns, seq)] = time.monotonic()
        while len(kept_now) > RECORDS_KEPT:
            with contextlib.suppress(KeyError):
                gone, _ = kept_now.popitem(last=False)
                self._read_at.pop(gone, None)
        return rec

    def latest(self, ns: str, hint: int | None = None) -> Record | None:
        seq = self.latest_seq(ns, hint)
        return None if seq is None else self.record(ns, seq, cached=self._fresh(ns, seq))

    def newest_snapshot(self, ns: str) -> Snapshot:
        """The newest generation's snapshot (empty when there is none): what registers
        where a namespace's packed objects live. One LIST, a HEAD and its reads (finding
        it with ``latest`` and then reading ``entries`` found it twice)."""
        return self.snapshot(self.latest(ns))

    def resolve(self, ns: str, seq: int | None) -> Record:
        """The record for ``ns@seq``, or the newest one when ``seq`` is None."""
        if seq is None:
            rec = self.latest(ns)
            if rec is None:
                raise NotFoundError(f"namespace {ns!r} has no generations")
            return rec
        return self.record(ns, seq)

    def newest_valid(
        self, ns: str, hint: int | None = None, max_skip: int = 64, *, for_publish: bool = False,
        skipped: list[Skipped] | None = None, newest: int | None = None,
    ) -> tuple[int | None, Record | None, Snapshot]:
        """(newest seq, newest *readable* record, its snapshot).

        A damaged record (hostile JSON, a corrupt manifest; a missing one once
        the record is older than MISSING_GRACE) is skipped, logged and counted,
        so one bad record cannot stop a namespace from being served or
        published to; the next publication supersedes it.

        Two kinds of newer record are *not* damage: one whose manifest is
        still missing while it is young (NFS negative caching may hide a fresh
        object) and one of a newer format. Readers skip them too and serve the
        newest complete generation; with ``for_publish`` they raise instead
        (PublishDeferredError, NewerFormatError), because building N+1 on an
        older snapshot would drop their entries for the whole cluster. I/O
        errors are raised: a passing NFS hiccup must not look like damage.

        ``newest``: the newest seq the caller has just found (``latest_seq``), so it is
        not probed for again (a HEAD of it and of the one after: two round trips).

        With ``skipped`` every record passed over is appended to it (newest
        first) instead of logged: the caller reports them (the read-side CLI,
        GenerationStore.readable).
        """
        mine = self._latest.get(ns)  # what this store served last (kept on a rollback)
        if newest is None and for_publish and hint is None:
            newest = self._recent_newest(ns)  # PUBLISH_FRESH: the create decides
        if newest is None:
            newest = self.latest_seq(ns, hint)
        head = self.heads.newest(ns) if self.heads.enabled(ns) else None
        if head is not None:
            return self._newest_from_head(ns, newest, head, mine, max_skip,
                                          for_publish, skipped)
        if newest is None:
            return None, None, Snapshot(None, {})
        got = self._newest_among(ns, newest, newest + 1, max_skip, for_publish, skipped)
        return (newest, *got) if got else (newest, None, Snapshot(None, {}))

    def _newest_among(self, ns: str, first: int | None, below: int, limit: int,
                      for_publish: bool, skipped: list[Skipped] | None, above: int = 0,
                      ) -> tuple[Record, Snapshot] | None:
        """The newest readable of ``first`` and then at most ``limit`` listed seqs below
        ``below`` and above ``above`` (newest first), or None; each one passed over is
        noted."""
        candidates = [first] if first is not None else []
        listed = False
        while True:
            if not candidates:
                if listed:
                    return None
                listed = True
                candidates = [x for x in reversed(self.seqs(ns))
                              if above < x < below and x != first][:limit]
                if not candidates:
                    return None
            got = self._try(ns, candidates.pop(0), for_publish, skipped)
            if got is not None:
                return got

    def _try(self, ns: str, seq: int, for_publish: bool, skipped: list[Skipped] | None,
             ) -> tuple[Record, Snapshot] | None:
        """Record ``seq`` and its snapshot, or None when passed over (noted)."""
        try:
            # A record read moments ago is taken (a reader: NEWEST_FRESH, as latest()).
            rec = self.record(ns, seq, cached=self._fresh(
                ns, seq, PUBLISH_FRESH if for_publish else NEWEST_FRESH))
            return rec, self._snapshot_of(rec)
        except UnreadableHereError as e:  # newer format, over a limit: not damage
            self._note(ns, seq, "newer_format_generations"
                       if isinstance(e, NewerFormatError) else "oversize_generations", e,
                       skipped)
            if for_publish:
                raise
        except _DAMAGE as e:
            if isinstance(e, ObjectMissingError | NotFoundError) and self._young(ns, seq):
                self._note(ns, seq, "unresolved_generations", e, skipped)
                if for_publish:
                    raise PublishDeferredError(
                        f"namespace {ns}: generation {seq} names an object not visible"
                        f" yet ({e.message}); publication waits until it resolves"
                        f" (at most {MISSING_GRACE:.0f}s)") from None
            else:
                self._note(ns, seq, "bad_generations", e, skipped)
        return None

    def _newest_from_head(
        self, ns: str, newest: int | None, head: Head, mine: Snapshot | None, max_skip: int,
        for_publish: bool, skipped: list[Skipped] | None,
    ) -> tuple[int | None, Record | None, Snapshot]:
        """newest_valid when ``ns`` has a valid statement (casfs.store.freshness).

        Its seq is a floor: records above it are examined newest first (at most
        JUNK_SCAN), then it, whose bytes must be the ones it names. Below it
        only while it is young (unresolved) or its record is of a newer format;
        otherwise a rollback: this store keeps what it served, a reader that
        served nothing of it gets nothing, a publisher builds on the newest
        valid record below and publishes above the statement.
        """
        top = max(newest or 0, head.seq)  # publishers go above a deleted head too
        if head.expired():
            key = (ns, -head.seq - 1)  # (a distinct key from rollbacks' in _rolled)
            if key not in self._rolled:
                self._rolled.add(key)
                self.objects.counters.inc("expired_heads")
                log.warning("freshness unknown: namespace %s: %s, and it expired (nothing"
                            " newer was published since); serving the newest valid record"
                            " at or above it", ns, head.describe())
        if newest is not None and newest > head.seq:
            got = self._newest_among(ns, newest, newest, JUNK_SCAN - 1, for_publish, skipped,
                                     above=head.seq)
            if got is not None:
                return top, *got
        try:
            rec = self.record(ns, head.seq, digest=head.record)
            return top, rec, self._snapshot_of(rec)
        except UnreadableHereError as e:  # a newer release's record: not a rollback
            self._note(ns, head.seq, "newer_format_generations"
                       if isinstance(e, NewerFormatError) else "oversize_generations", e,
                       skipped)
            if for_publish:
                raise
            reason = None
        except _DAMAGE as e:
            if time.time() - head.published < MISSING_GRACE and \
                    isinstance(e, ObjectMissingError | NotFoundError):
                # NFS may hide a fresh record or object a while: unresolved, not a rollback.
                self._note(ns, head.seq, "unresolved_generations", e, skipped)
                if for_publish:
                    raise PublishDeferredError(
                        f"namespace {ns}: generation {head.seq}, named by its statement, is"
                        f" not visible yet ({e.message}); publication waits until it"
                        f" resolves (at most {MISSING_GRACE:.0f}s)") from None
                reason = None
            else:
                reason = " ".join(e.message.split())
        if reason is None:  # serve the newest readable older generation, as without a head
            got = self._newest_among(ns, None, head.seq, max_skip, for_publish, skipped)
            return (top, *got) if got else (top, None, Snapshot(None, {}))
        what = f"{head.describe()}, which is unreadable: {reason}"
        if mine is not None and self._latest.get(ns) is mine and mine.record is not None \
                and mine.record.seq >= head.seq:
            self._rolled_back(ns, head.seq, f"{what}; still serving generation"
                              f" {mine.record.seq}, read before", skipped)
            return top, mine.record, mine
        if not for_publish:
            self._rolled_back(ns, head.seq, f"{what}; serving nothing older (a miss) until"
                              " a newer generation is published", skipped)
            return top, None, Snapshot(None, {})
        self._rolled_back(ns, head.seq, f"{what}; publishing above it, on the newest valid"
                          " generation below it (its entries alone are lost)", skipped)
        got = self._newest_among(ns, None, head.seq, max_skip, for_publish, skipped)
        return (top, *got) if got else (top, None, Snapshot(None, {}))

    def _note(self, ns: str, seq: int, counter: str, err: CasfsError,
              skipped: list[Skipped] | None = None) -> None:
        """Count every skipped record; log each one once per process (refresh repeats),
        or hand it to the caller (``skipped``)."""
        self.objects.counters.inc(counter)
        what = {"newer_format_generations": "newer-format",
                "oversize_generations": "over-limit",
                "unresolved_generations": "unresolved (young, object missing)",
                }.get(counter, "damaged")
        if skipped is not None:
            skipped.append(Skipped(ns, seq, what, err))
        elif (ns, seq, counter) not in self._noted:
            self._noted.add((ns, seq, counter))
            log.warning("skipping %s generation %s@%d: %s", what, ns, seq, err)

    def readable(self, ns: str, seq: int | None = None) -> tuple[Snapshot, list[Skipped]]:
        """What the read-side CLI shows: ``ns@seq`` exactly, or the newest readable generation.

        Without ``seq`` this is newest_valid, the choice mounts, `casfs run` and
        publication make: damaged, newer-format and unresolved records are passed
        over and returned (newest first) for the caller to report. An explicit
        ``seq`` naming one of them raises its error. No readable generation at
        all raises the newest record's error, naming it.
        """
        if seq is not None:
            return self.entries(ns, seq), []
        check_name(ns)
        skipped: list[Skipped] = []
        newest, rec, snap = self.newest_valid(ns, skipped=skipped)
        if newest is None:
            raise NotFoundError(f"namespace {ns!r} has no generations")
        if rec is None:
            # A rollback is the reason whatever junk sat above it; else the newest record's.
            first = next((x for x in skipped if x.what == "rolled back"),
                         skipped[0] if skipped else None)
            why = f": {first.describe()}" if first else ""
            raise (type(first.error) if first else CasfsError)(
                f"namespace {ns}: no readable generation (newest {ns}@{newest}){why}")
        return snap, skipped

    def _young(self, ns: str, seq: int) -> bool:
        info = self.backend.info(self._key(ns, seq))
        # abs: a record stamped in the future (a skewed clock, a hostile touch) would
        # otherwise stay young for ever, and publication deferred with it.
        return info is not None and abs(time.time() - info.mtime) < MISSING_GRACE

    def part_entries(self, part: Part, read: list[Entry] | None = None) -> list[Entry]:
        """``part``'s rows, checked and cached; ``read``: its rows already read and
        decoded (``_read_parts``), else they are read here."""
        with self._parts_lock:
            cached = self._parts.get(part.digest)
            if cached is not None:
                self._parts.move_to_end(part.digest)
                return cached
        cached = read if read is not None else manifest.load(
            self.objects, part.digest, part.size)[1]
        if len(cached) != part.entries:
            raise HostileManifestError(
                f"manifest {part.digest}: {len(cached)} entries, record says {part.entries}"
            )
        for e in cached:  # packed objects: where their bytes live (casfs.store.packs)
            if e.extras and "pack" in e.extras:
                self.objects.locate(e.digest, e.extras["pack"])
        with self._parts_lock:
            if part.digest not in self._parts:  # (another thread's read of it may be in)
                self._parts[part.digest] = cached
                self._cached_entries += len(cached)
            while self._cached_entries > PART_CACHE_ENTRIES and len(self._parts) > 1:
                _, old = self._parts.popitem(last=False)
                self._cached_entries -= len(old)
        return cached

    def _snapshot_of(self, record: Record) -> Snapshot:
        """The snapshot of the newest record, advanced from the last one seen when it can be.

        Publication storms re-read the namespace after every lost race; a
        record that only appends deltas to the one seen before costs only its
        new deltas (read, validated, merged), not the whole snapshot. The
        returned Snapshot belongs to this store and is advanced in place by
        later calls for the same namespace.
        """
        base = self._latest.pop(record.namespace, None)  # taken: a failure must not reuse it
        snap = None
        if base is not None:
            try:
                snap = self._advance(base, record)
            except CasfsError:
                snap = None  # the full build below decides (and names the damage)
        if snap is None:
            snap = self.snapshot(record)
        self._latest[record.namespace] = snap
        return snap

    def _advance(self, base: Snapshot, record: Record) -> Snapshot | None:
        """``base`` advanced in place to ``record`` when it holds a prefix of its parts
        (only its new deltas are read and merged); None when it does not."""
        prev = base.record
        if (prev is None or record.seq < prev.seq or record.base != prev.base
                or record.deltas[:len(prev.deltas)] != prev.deltas):
            return None
        return self._merge_parts(base, record, record.deltas[len(prev.deltas):])

    def _merge_parts(self, snap: Snapshot, record: Record, parts: Iterable[Part]) -> Snapshot:
        """Merge ``parts`` of ``record`` into ``snap`` (casfs.store.snapshot.merge_part), check
        the result against the record, and make ``snap`` its snapshot.

        The one merge of generations: a full build (``snap`` empty) and an advance
        (``snap`` the snapshot of an earlier record) both come here, so a replaced
        path's newer version overrides in both. An empty ``snap`` checks the
        tree once at the end, a held one each new path as it goes.
        """
        where = f"{record.namespace}@{record.seq}"
        dirs = snap.dirs if snap.record is not None else None
        parts = list(parts)
        read = self._read_parts(parts)
        for part in parts:
            try:
                rows = self.part_entries(part, read.get(part.digest))
            except CasfsError as err:  # say which generation the bad manifest belongs to
                raise type(err)(f"generation {where}: {err.message}") from err
            merge_part(snap.entries, rows, where, dirs)
        if len(snap.entries) != record.entries:
            raise HostileManifestError(
                f"generation {where}: {len(snap.entries)} entries, record says {record.entries}")
        if dirs is None:
            check_tree(snap, where)
        snap.record = record
        return snap

    def _read_parts(self, parts: list[Part]) -> dict[str, list[Entry]]:
        """The rows of the ``parts`` not cached, read and decoded at once (PART_READS at a
        time). One that fails is left out: ``part_entries`` reads it again, in order,
        and names its damage as before."""
        todo = {p.digest: p for p in parts if p.digest not in self._parts}
        if len(todo) < 2:
            return {}
        from concurrent.futures import ThreadPoolExecutor

        def one(p: Part) -> tuple[str, list[Entry] | None]:
            try:
                # Manifests are loose; this may run inside the objects' locator (a
                # missed packed object reads the newest generation), whose lock a
                # miss here would otherwise wait on: part_entries' own read is the
                # one that may run it.
                with self.objects.loose_only():
                    return p.digest, manifest.load(self.objects, p.digest, p.size)[1]
            except Exception:  # said by part_entries' own read, in the generation's order
                return p.digest, None

        with ThreadPoolExecutor(min(PART_READS, len(todo)),
                                thread_name_prefix="casfs-parts") as pool:
            return {d: rows for d, rows in pool.map(one, todo.values()) if rows is not None}

    def _published(self, snap: Snapshot, record: Record, new: list[Entry]) -> None:
        """Advance our own snapshot to the record just created (the next publish starts there)."""
        if self._latest.get(record.namespace) is not snap:
            return
        dirs = snap.dirs
        for e in new:
            snap.entries[e.path] = e
            dirs.update(parent_dirs(e.path))
        snap.record = record

    def snapshot(self, record: Record | None) -> Snapshot:
        """Load every part of ``record`` and merge them (validated as a whole)."""
        if record is None:
            return Snapshot(None, {})
        return self._merge_parts(Snapshot(None, {}), record, record.parts)

    def entries(self, ns: str, seq: int | None = None) -> Snapshot:
        return self.snapshot(self.resolve(ns, seq))

    # --- publishing -------------------------------------------------------
    def publish(
        self,
        ns: str,
        additions: Iterable[Entry],
        *,
        node: str,
        fingerprint: dict[str, Any] | None = None,
        max_bytes: int | None = None,
        max_attempts: int = 20,
        deadline: float = 600.0,
        compact_deltas: int = COMPACT_DELTAS,
        select: Callable[[Snapshot, list[Entry]], list[Entry]] | None = None,
        options: dict[str, Any] | Callable[[Record | None], dict[str, Any]] | None = None,
        requires: Iterable[str] = (),
    ) -> PublishResult:
        """Publish ``additions`` (whose objects must already be stored) as a new generation.

        ``select`` may drop merged additions against the snapshot they are merged
        into (re-run on every retry); dropped ones count as conflicts.

        A lost race means another publisher made progress, so retries go on
        while the namespace advances (a storm of 1,000 nodes all land); only
        ``max_attempts`` races lost *without* the newest seq moving (a backend
        that says EEXIST for a record nobody can see), or ``deadline`` seconds,
        give up. Each retry reads only what changed (_snapshot_of). ``options``
        are optional record keys (docs/format.md), or what computes them from the
        record built on (the first attempt's; in a thread while the manifest goes
        up: an access profile is a read and a write of its own), ``requires`` the
        features a reader must implement to read the new record (its parts included).
        """
        unsupported = set(requires) - SUPPORTED_FEATURES
        if unsupported:
            raise UsageError(f"cannot publish a record requiring {sorted(unsupported)}")
        check_name(ns)
        self.trust.prepare_namespace(ns)  # the tenant's own directories, before reading
        wanted = {e.path: e for e in additions}
        if any(is_replace(e) for e in wanted.values()):
            requires = {*requires, REPLACE}  # older readers must not take it for damage
        if any(e.extras and "pack" in e.extras for e in wanted.values()):
            requires = {*requires, "pack"}  # a reader ignoring it would only see misses
        result = PublishResult(ns, None)
        hint: int | None = None
        stalled = 0
        give_up = time.monotonic() + deadline
        attempt = 0
        computing: Callable[[], dict[str, Any]] | None = None
        later: int | None = None  # after a lost race: the newest seq found since
        checking: Callable[[], str | None] | None = None  # createonly.refusal, beside
        while True:
            attempt += 1
            result = PublishResult(ns, None, attempts=attempt)
            taken = hint is None and later is None and self._recent_newest(ns) is not None
            newest, current, snap = self.newest_valid(ns, hint, for_publish=True, newest=later)
            if callable(options) and computing is None:
                computing = _beside(functools.partial(options, current))
            new = self._merge(snap, wanted, result)
            if select is not None and new:
                kept = select(snap, new)
                dropped = {e.path for e in new} - {e.path for e in kept}
                result.conflicts += len(dropped)
                result.conflict_paths.extend(sorted(dropped))
                result.added -= len(dropped)
                result.added_bytes -= sum(e.size for e in new if e.path in dropped)
                new = kept
            result.seq = current.seq if current else None
            if not new and result.already and taken and newest is not None:
                # Built on a seq taken as fresh (PUBLISH_FRESH) and nothing to create, so
                # no lost race would tell of a newer generation, one that dropped these
                # paths (retention): look, one HEAD. Newer: merge into it.
                found, _ = self._probe(ns, newest)
                if found > newest:
                    hint = later = found
                    continue
            if not new:
                return result
            total_bytes = (current.logical_bytes if current else 0) + result.added_bytes
            if max_bytes is not None and total_bytes > max_bytes:
                raise QuotaExceededError(
                    f"namespace {ns}: publishing {result.added_bytes} bytes would exceed"
                    f" its bound of {max_bytes} bytes; nothing was published"
                )
            seq = (newest or 0) + 1
            if checking is None:  # beside the manifest's upload: two PUTs, the first time
                checking = _beside(functools.partial(createonly.refusal, self.backend))
            if self._condemned is None:
                self._condemned = Condemned(self.backend)
            # The gc marks (a LIST, kept a while) read while the manifest goes up:
            # _save_condemned takes them then.
            _beside(self._condemned.refresh)
            crashpoint("before-manifest")
            record = self._next_record(ns, seq, current, snap, new, node, fingerprint,
                                       compact_deltas)
            # A record keeps its parent's requirements: its parts may still need them.
            needs = set(requires) | set(current.requires if current else ())
            if result.repaired:  # its repaired rows override: older readers must know
                needs.add(REPLACE)
            opts = computing() if computing is not None else options
            assert not callable(opts)
            record = replace(record, options=dict(opts or {}), requires=tuple(sorted(needs)))
            reused = self._save_condemned({e.digest for e in new if not packed(e)}
                                          | {p.digest for p in record.parts},
                                          packs_of(new))
            crashpoint("after-manifest")
            self.backend.sync()  # every object the record names is durable before it exists
            crashpoint("after-sync")
            self.trust.check_namespace(ns)  # nobody slipped their own directory in meanwhile
            data = self.trust.seal(ns, record.to_json())
            refused = checking()
            if refused is not None:
                raise PublishError(refused)
            if self.backend.create_exclusive(self._key(ns, record.seq), data):
                result.seq = record.seq
                self._newest[ns] = (record.seq, time.monotonic())
                crashpoint("after-record")
                self.heads.publish(ns, record.seq, data, record.created, node)
                self._published(snap, record, new)
                self._check_after_publish(reused)
                log.info(
                    "published %s@%d: +%d files (%d bytes), %d conflicts, attempt %d",
                    ns, record.seq, result.added, result.added_bytes, result.conflicts, attempt,
                )
                return result
            # Another node won this seq (or says so: a create refused for a record
            # nobody can see is looked at, the stalled count below). Full jitter,
            # growing to ~1 s: a herd of publishers spreads out; then the newest from
            # there is the retry's (found once: newest_valid probing again was k+2
            # more HEADs, k newer records, at every lost race of a fleet's start).
            time.sleep(random.uniform(0, min(1.0, 0.01 * 2 ** min(attempt, 7))))
            hint = record.seq
            later = self.latest_seq(ns, hint)
            stalled = stalled + 1 if later is None or later <= (newest or 0) else 0
            if stalled >= max_attempts or time.monotonic() > give_up:
                raise PublishError(
                    f"namespace {ns}: lost the publication race {attempt} times"
                    f" ({stalled} without the namespace advancing)")

    def _save_condemned(self, digests: set[str], packs: set[str]) -> dict[str, bytes | None]:
        """Write again each object or pack the record will name that a gc mark condemns.

        gc cannot see that this publisher re-uses an object it marked as
        unreferenced; the rewrite gives the object a newer mtime than the mark,
        and the sweep spares it (casfs.store.maintenance). Returns their bytes
        (a pack's under ``PACK_SAVED + digest``) for ``_check_after_publish``.
        """
        if self._condemned is None:
            self._condemned = Condemned(self.backend)
        condemned = self._condemned.among(digests | packs)
        saved: dict[str, bytes | None] = {}
        for d in sorted(digests & condemned):
            saved[d] = self.objects.rewrite(d)
        for p in sorted(packs & condemned):
            # The pack, or (repacked) the forward its rows go through, or both.
            raw = rewrite_pack(self.objects, p)
            forward = rewrite_forward(self.objects, p)
            if raw is None and not forward:  # swept meanwhile: publish nothing naming it
                raise ObjectMissingError(f"pack {p} was removed by gc; publication retries")
            if raw is not None:
                saved[PACK_SAVED + p] = raw
        return saved

    def _check_after_publish(self, saved: dict[str, bytes | None]) -> None:
        """Once the record exists, put back a rewritten object a racing sweep removed."""
        for d, data in saved.items():
            if data is None:
                continue
            if d.startswith(PACK_SAVED):  # a pack: put back whole, under its digest
                p = d[len(PACK_SAVED):]
                if self.backend.info(pack_key(p)) is None:
                    log.warning("pack %s was removed by a concurrent gc: writing it again", p)
                    put_pack_bytes(self.objects, p, data, replace=False)
                    self.objects.counters.inc("packs_restored_after_gc")
            elif self.backend.info(object_key(d)) is None:
                log.warning("object %s was removed by a concurrent gc: writing it again", d)
                self.objects.put_bytes(data)
                self.objects.counters.inc("objects_restored_after_gc")

    def drop(self, ns: str, paths: Callable[[Snapshot], set[str]], *, node: str,
             max_attempts: int = 20) -> tuple[int | None, list[str]]:
        """Publish the newest generation minus ``paths(snapshot)`` as one full base.

        Retention by use (casfs.promote.retention): the only way an entry leaves
        a namespace. Re-reads and recomputes on a lost race. Returns (the new
        seq or None when nothing was dropped, the paths dropped).
        """
        check_name(ns)
        hint: int | None = None
        for _ in range(max_attempts):
            newest, current, snap = self.newest_valid(ns, hint, for_publish=True)
            gone = paths(snap) & set(snap.entries) if current is not None else set()
            if current is None or not gone:
                return None, []
            kept = [e for p, e in snap.entries.items() if p not in gone]
            options = {k: v for k, v in current.options.items() if k != "signature"}
            record = Record(
                namespace=ns, seq=(newest or 0) + 1, parent=current.seq,
                base=self._store_part(kept, "full"), deltas=(), entries=len(kept),
                logical_bytes=sum(e.size for e in kept), created=time.time(), node=node,
                casfs_version=__version__, fingerprint=current.fingerprint, options=options,
                requires=current.requires)
            self.backend.sync()
            refused = createonly.refusal(self.backend)
            if refused is not None:
                raise PublishError(refused)
            data = self.trust.seal(ns, record.to_json())  # tenant and signature, as publish
            if self.backend.create_exclusive(self._key(ns, record.seq), data):
                self._newest[ns] = (record.seq, time.monotonic())  # a publication next
                # builds on it (PUBLISH_FRESH), never on the snapshot that held them
                self.heads.publish(ns, record.seq, data, record.created, node)
                log.info("%s@%d: dropped %d unused files", ns, record.seq, len(gone))
                return record.seq, sorted(gone)
            hint = record.seq
            time.sleep(random.uniform(0.005, 0.05))
        raise PublishError(f"namespace {ns}: lost the race {max_attempts} times")

    def _merge(
        self, snap: Snapshot, wanted: dict[str, Entry], result: PublishResult
    ) -> list[Entry]:
        new: list[Entry] = []
        new_paths = set(wanted)
        for path, e in sorted(wanted.items()):
            have = snap.entries.get(path)
            if have is not None:
                if have.digest == e.digest and (have.size == e.size
                                                or not self._right_size(e)):
                    result.already += 1
                elif have.digest == e.digest:
                    # A digest names one size, and the store holds it at this one: the
                    # published row (a buggy or hostile writer's) is a miss on every node
                    # and would stay one. Published again as a newer version of the path.
                    log.warning("%s: published with size %d, its bytes are %d: put right",
                                path, have.size, e.size)
                    new.append(replace(e, extras={**(e.extras or {}), REPLACE: True}))
                    result.added += 1
                    result.repaired += 1
                    result.added_bytes += e.size
                elif is_replace(e):
                    new.append(e)  # the newest generation's version wins
                    result.added += 1
                    result.replaced += 1
                    result.added_bytes += e.size
                else:
                    result.conflicts += 1
                    result.conflict_paths.append(path)
                continue
            # A new file where the snapshot (or this batch) has a directory, or
            # under a path that is a file, cannot be merged: count it a conflict.
            if path in snap.dirs or any(
                d in snap.entries or d in new_paths for d in parent_dirs(path)
            ):
                result.conflicts += 1
                result.conflict_paths.append(path)
                continue
            new.append(e)
            result.added += 1
            result.added_bytes += e.size
        return new

    def _right_size(self, e: Entry) -> bool:
        """Whether the store holds ``e``'s object at ``e.size`` (read and hashed whole;
        only where a published row disagrees). Unreadable: not shown, the row stays."""
        if e.extras and "pack" in e.extras:
            self.objects.locate(e.digest, e.extras["pack"])
        try:
            return self.objects.verify(e.digest) == e.size
        except (CasfsError, OSError) as err:
            log.info("%s: could not check the size of %s: %s", e.path, e.digest, err)
            return False

    def _next_record(
        self,
        ns: str,
        seq: int,
        current: Record | None,
        snap: Snapshot,
        new: list[Entry],
        node: str,
        fingerprint: dict[str, Any] | None,
        compact_deltas: int,
    ) -> Record:
        deltas: tuple[Part, ...]
        base: Part | None
        base_entries = current.base.entries if current and current.base else 0
        delta_entries = sum(d.entries for d in current.deltas) if current else 0
        compact = (
            current is None
            or current.base is None
            or len(current.deltas) + 1 >= compact_deltas
            or delta_entries + len(new) > max(1024, base_entries // 4)
        )
        try:
            if compact:
                full = {**snap.entries, **{e.path: e for e in new}}
                base = self._store_part(list(full.values()), "full")
                deltas = ()
            else:
                assert current is not None
                base = current.base
                deltas = (*current.deltas, self._store_part(new, "delta"))
        except QuotaExceededError as e:
            raise QuotaExceededError(f"namespace {ns}: {e}") from None
        return Record(
            namespace=ns,
            seq=seq,
            parent=current.seq if current else None,
            base=base,
            deltas=deltas,
            entries=len(snap.entries) + sum(e.path not in snap.entries for e in new),
            logical_bytes=(current.logical_bytes if current else 0) + sum(
                e.size - (snap.entries[e.path].size if e.path in snap.entries else 0)
                for e in new),
            created=time.time(),
            node=node,
            casfs_version=__version__,
            fingerprint=fingerprint,
        )

    def _store_part(self, entries: list[Entry], kind: str) -> Part:
        data = manifest.encode(entries, kind)
        if len(data) > manifest.max_manifest_bytes():
            # Readers skip such a generation, the publisher's own node included, whose
            # mount then promoted its files again for ever (a review: the promotion
            # worker every tenant shares replaced in a loop): refused here instead.
            raise QuotaExceededError(
                f"a {kind} manifest of {len(entries)} entries would be {len(data)} bytes,"
                f" over the {manifest.max_manifest_bytes()} every reader takes"
                " (CASFS_MAX_MANIFEST_BYTES): not published; its new files stay on this"
                " node")
        digest = digest_bytes(data)
        at = self._parts_stored.get(digest)
        if at is not None and time.monotonic() - at < PART_STORED_FRESH:
            return Part(digest, len(data), len(entries))
        res = self.objects.put_bytes(data)
        self._parts_stored[res.digest] = time.monotonic()
        while len(self._parts_stored) > PARTS_STORED_KEPT:
            self._parts_stored.popitem(last=False)
        return Part(res.digest, res.size, len(entries))

    # --- pins -------------------------------------------------------------
    def pin(self, ns: str, seq: int, name: str) -> None:
        check_name(name, "pin")
        self.record(ns, seq)  # must exist
        self.trust.prepare_namespace(ns)
        doc = json.dumps({"seq": seq, "created": time.time()}).encode() + b"\n"
        key = f"namespaces/{ns}/pins/{name}"
        if not self.backend.create_exclusive(key, doc):
            have = self.pins(ns).get(name)
            if have != seq:
                raise UsageError(f"pin {ns}/{name} already exists (on generation {have})")

    def unpin(self, ns: str, name: str) -> None:
        check_name(name, "pin")
        if name not in self.pins(ns):
            raise NotFoundError(f"no pin {ns}/{name}")
        self.backend.delete(f"namespaces/{ns}/pins/{name}")

    def pins(self, ns: str) -> dict[str, int]:
        """name -> seq; unreadable pins are logged and reported as -1 (kept by gc: unknown)."""
        check_name(ns)
        out: dict[str, int] = {}
        for name in self.backend.list(f"namespaces/{ns}/pins"):
            if not NAME_RE.match(name):
                continue
            try:
                with self.backend.open(f"namespaces/{ns}/pins/{name}") as f:
                    seq = jsonsafe.parse(f.read(4096), "pin")["seq"]
                if type(seq) is not int or not 0 <= seq < 1 << 63:
                    raise ValueError("seq is not a generation number")
                out[name] = seq
            except (OSError, ValueError, KeyError, TypeError, HostileManifestError) as e:
                log.warning("unreadable pin %s/%s: %s", ns, name, e)
                out[name] = -1
        return out

    def records(self, ns: str) -> Iterator[Record | CasfsError]:
        """Every record of ``ns``, oldest first; a damaged one yields its error."""
        for seq in self.seqs(ns):
            try:
                yield self.record(ns, seq)
            except CasfsError as e:
                yield e
