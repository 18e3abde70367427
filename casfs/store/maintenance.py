"""Whole-store maintenance: garbage collection, verification and usage accounting.

GC is mark-and-sweep in two phases, and never relies on refreshing mtimes
(object stores cannot "touch" an object), so it is the same on every backend:

1. Every run first reads every kept generation (the newest ``keep`` of each
   namespace plus every pinned one) of *every tenant* and collects the
   objects they name: objects are shared across tenants, so one tenant's gc
   must see the others' references or delete nothing. If anything needed
   for that cannot be read, gc deletes nothing.
2. Mark: every object unreferenced now is listed in a new mark.
3. Sweep: each gc *mark* (``gc/marks/<created>-<id>``, casfs.store.marks)
   at least ``grace`` old names objects that were unreferenced when it was
   written. Each is deleted only if it is still unreferenced now and was not
   written again since the mark (its mtime is not newer than the mark).
   Then the mark goes. With ``grace`` > 0 the new mark waits for a later
   run; ``--grace 0`` (no protection for concurrent publishers) sweeps it at once.

Publishers keep this safe without touching anything: before creating a
record, a publisher reads the marks (casfs.store.marks.Condemned) and writes
again any object it re-uses that a mark names (a rewrite with the same
verified bytes gives it a new mtime, which the sweep respects), then checks
after creating the record that its objects are still there. An object a
publisher uploads itself is newer than every existing mark. Unkept records
older than ``grace`` are removed directly (records are never re-used), and
so are node-local staging files older than ``grace``.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from casfs.errors import CasfsError, HostileManifestError, UsageError
from casfs.store import freshness, marks, outcomes, packs
from casfs.store.generations import GenerationStore, Skipped
from casfs.store.objects import object_key
from casfs.store.record import MAX_RECORD_BYTES, Record, seq_name
from casfs.store.root import SharedRoot
from casfs.util import jsonsafe

log = logging.getLogger(__name__)

Progress = Callable[[int], None]  # advance by n


@dataclass
class GcReport:
    dry_run: bool
    kept_generations: int = 0
    removed_generations: list[str] = field(default_factory=list)
    live_objects: int = 0
    removed_objects: int = 0
    removed_bytes: int = 0
    young_unreferenced: int = 0  # unreferenced, marked now: deleted by a run >= grace later
    rewritten_since_mark: int = 0  # re-used by a publisher after being marked: kept
    marks_swept: int = 0
    removed_packs: int = 0
    repacked_packs: int = 0  # live packs mostly unused: live members copied to a new pack
    repacked_bytes: int = 0  # their size (freed once the old packs are swept)
    marked: int = 0
    removed_tmp: int = 0
    # Why this run marked nothing new (a full shared root), else None.
    mark_error: str | None = None
    outcome_records_merged: int = 0  # daily outcome records merged per month (outcomes)
    outcome_rows_dropped: int = 0  # their rows older than --keep-outcomes days


PROBE_PAST_LISTING = 64  # records gc looks for past a namespace's listing, one HEAD each


def _kept(gens: GenerationStore, ns: str, keep: int) -> tuple[list[int], list[int]]:
    seqs = gens.seqs(ns)
    # A LIST may lag behind creates (a publication meanwhile), or a broken gateway
    # leave records out: the listing of a namespace's records is never taken as
    # complete, as readers never take it (GenerationStore.latest_seq). The records
    # past its end are probed for, one HEAD each; a pinned record it left out is kept.
    # Else the live generations' objects would be swept as no one's.
    past: list[int] = []
    while gens.exists(ns, (past[-1] if past else seqs[-1] if seqs else 0) + 1):
        past.append((past[-1] if past else seqs[-1] if seqs else 0) + 1)
        if len(past) > PROBE_PAST_LISTING:
            raise CasfsError(f"the listing of {ns}'s generations ends more than"
                             f" {PROBE_PAST_LISTING} records before its newest: a lagging or"
                             " broken listing of the shared root (run gc again later)")
    seqs = seqs + past
    pins = gens.pins(ns)
    bad = sorted(name for name, s in pins.items() if s < 0)
    if bad:  # an unreadable pin might protect anything: delete nothing
        raise CasfsError(f"unreadable pin {ns}/{bad[0]}: fix or remove it (casfs unpin)")
    pinned = set(pins.values())
    unlisted = {s for s in pinned - set(seqs) if gens.exists(ns, s)}
    if not seqs and not unlisted and (pins or _head_names(gens, ns)):
        raise CasfsError(f"{ns} has pins or statements but its listing shows no generation:"
                         " a lagging or broken listing of the shared root (run gc again"
                         " later)")
    kept = sorted(set(seqs[-keep:] if keep > 0 else []) | (pinned & set(seqs)) | unlisted
                  | {s for s in seqs if s >= _head_floor(gens, ns)})
    return kept, [s for s in seqs if s not in kept]


def _head_names(gens: GenerationStore, ns: str) -> list[tuple[int, str]]:
    """(seq, name) of ``ns``'s statements (casfs.store.freshness), newest first."""
    out = []
    for name in gens.backend.list(freshness.heads_prefix(ns)):
        parsed = freshness.parse_head_name(name)
        if parsed is not None:
            out.append((parsed, name))
    return [(seq, name) for (seq, _), name in sorted(out, reverse=True)]


def _head_floor(gens: GenerationStore, ns: str) -> float:
    """Records at or above the seq of ``ns``'s newest statement are all kept.

    Junk records planted above the head must not push the real head out of
    ``--keep``. gc checks no signature (it runs without keys), so the newest
    statement is the newest of the HEAD_SCAN newest names whose record exists
    and hashes to the digest it names; a forged pair can only move the floor
    where junk records alone already could (above the head), never lower.
    """
    for seq, name in _head_names(gens, ns)[:freshness.HEAD_SCAN]:
        try:
            with gens.backend.open(f"{freshness.heads_prefix(ns)}/{name}") as f:
                doc = jsonsafe.parse(f.read(freshness.MAX_HEAD_BYTES), name)
            with gens.backend.open(f"namespaces/{ns}/generations/{seq_name(seq)}") as f:
                data = f.read(MAX_RECORD_BYTES + 1)
        except (OSError, HostileManifestError):
            continue
        if isinstance(doc, dict) and doc.get("record") == freshness.record_digest(data):
            return seq
    return float("inf")


def _old_heads(gens: GenerationStore, ns: str, kept: list[int]) -> list[str]:
    """Statements of generations below every kept one (never the newest statement)."""
    if not kept:
        return []
    return [name for seq, name in _head_names(gens, ns)[1:] if seq < kept[0]]


def mark(gens: GenerationStore, keep: int) -> tuple[set[str], dict[str, list[int]]]:
    """Digests reachable from kept generations; raises if any kept generation is unreadable."""
    live, drop, _ = reachable(gens, keep)
    return live, drop


def reachable(gens: GenerationStore, keep: int,
              ) -> tuple[set[str], dict[str, list[int]], dict[str, set[str]]]:
    """(digests and packs kept generations name, unkept seqs per namespace, pack -> the
    digests kept rows name in it); raises if any kept generation is unreadable."""
    live: set[str] = set()
    drop: dict[str, list[int]] = {}
    named: dict[str, set[str]] = {}
    for ns in gens.namespaces():
        kept, drop[ns] = _kept(gens, ns, keep)
        for seq in kept:
            rec = gens.record(ns, seq)
            live.update(p.digest for p in rec.parts)
            ents = gens.snapshot(rec).entries.values()
            for e in ents:
                live.add(e.digest)
                loc = packs.parse_location(e.extras.get("pack")) if e.extras else None
                if loc is not None:
                    named.setdefault(loc[0], set()).add(e.digest)
            prof = rec.options.get("profile")  # the access profile object, if named
            if isinstance(prof, str) and len(prof) == 64:
                live.add(prof)
    live.update(named)  # a pack lives while a kept row needs it (see live_packs)
    return live, drop, named


def live_packs(root: SharedRoot, named: dict[str, set[str]], forwarded: set[str],
               ) -> tuple[dict[str, set[str]], set[str]]:
    """(pack -> its members kept rows need, the forward records they go through).

    A row naming a repacked pack whose forward moved its digest needs the forward
    and the new pack, not the old one (casfs.store.packs, "repacking").
    """
    need: dict[str, set[str]] = {}
    via: set[str] = set()
    todo = list(named.items())
    seen: set[tuple[str, str]] = set()
    while todo:
        pack, digests = todo.pop()
        rest = set(digests)
        if pack in forwarded:
            moved: dict[str, set[str]] = {}
            for d in digests:
                loc = packs.forwarded(root.objects, pack, d)
                if loc is not None and (pack, d) not in seen:  # a cycle is damage: stop
                    seen.add((pack, d))
                    moved.setdefault(loc[0], set()).add(d)
                    rest.discard(d)
            if moved:
                via.add(pack)
                todo.extend(moved.items())
        if rest:
            need.setdefault(pack, set()).update(rest)
    return need, via


def _repack(root: SharedRoot, need: dict[str, set[str]], via: set[str],
            forwarded: set[str], report: GcReport, dry_run: bool) -> None:
    """Repack each live pack that kept rows use less than REPACK_BELOW of (in place in
    ``need``/``via``: the old pack is then unreferenced, its forward and new pack live)."""
    for pack, digests in list(need.items()):
        if pack in forwarded:
            continue  # repacked before: some row needs a member the forward lacks
        try:
            info = packs.read_index(root.objects, pack)
        except (CasfsError, OSError) as e:
            log.warning("gc: not repacking pack %s: %s", pack, e)
            continue
        total = sum(length for _, length in info.members.values())
        keep = digests & set(info.members)
        used = sum(info.members[d][1] for d in keep)
        if not total or used >= total * packs.REPACK_BELOW:
            continue
        report.repacked_packs += 1
        report.repacked_bytes += info.size
        if dry_run:
            continue
        moved = packs.repack(root.objects, pack, keep)
        forwarded.add(pack)
        via.add(pack)
        rest = digests - set(moved)
        if rest:
            need[pack] = rest  # rows naming what the pack never held: leave it alone
        else:
            del need[pack]
        for d, loc in moved.items():
            need.setdefault(loc[0], set()).add(d)


def gc(
    root: SharedRoot,
    *,
    keep: int = 16,
    grace: float = 24 * 3600,
    dry_run: bool = False,
    progress: Progress | None = None,
    now: float | None = None,
    keep_outcomes: float = outcomes.KEEP_DAYS,
) -> GcReport:
    """One gc run: sweep marks at least ``grace`` old, then mark what is unreferenced now.

    Outcome records (casfs.store.outcomes) are merged per month and their rows
    older than ``keep_outcomes`` days dropped (never younger ones).

    ``now`` (tests) stands for the current time when judging ages.
    """
    if keep < 1:
        raise UsageError("gc --keep must be at least 1: the newest generation is always kept")
    gens = root.generations()
    report = GcReport(dry_run)
    now = time.time() if now is None else now
    try:
        live, drop, named = reachable(gens, keep)
        forwarded = set(packs.iter_forwards(root.objects))
        need, via = live_packs(root, named, forwarded)
    except CasfsError as e:
        raise CasfsError(f"gc aborted, nothing deleted: cannot read a kept generation: {e}") from e
    except OSError as e:
        # Typically another tenant's 0700 namespace: its generations cannot be
        # marked, so nothing may be swept (their objects would look unreferenced).
        raise CasfsError(f"gc aborted, nothing deleted: {e.filename or 'the root'}:"
                         f" {e.strerror}; run gc as a user who can read every namespace"
                         " (root, or casfsd's user)") from e
    report.live_objects = len(live)
    for ns, seqs in drop.items():
        for seq in seqs:
            key = f"namespaces/{ns}/generations/{seq_name(seq)}"
            info = root.backend.info(key)
            if info and now - info.mtime >= grace:
                report.removed_generations.append(f"{ns}@{seq}")
                if not dry_run:
                    root.backend.delete(key)
        kept = sorted(set(gens.seqs(ns)) - set(seqs)) if not dry_run else []
        for name in _old_heads(gens, ns, kept):
            key = f"{freshness.heads_prefix(ns)}/{name}"
            info = root.backend.info(key)
            if info and now - info.mtime >= grace and not dry_run:
                root.backend.delete(key)
    report.kept_generations = sum(len(gens.seqs(ns)) for ns in gens.namespaces())
    for ns in gens.namespaces():
        try:
            res = outcomes.compact(root.backend, ns, now=now, keep_days=keep_outcomes,
                                   dry_run=dry_run)
        except OSError as e:  # statistics only: never a reason to stop collecting
            log.warning("gc: outcome records of %s left as they are: %s", ns, e)
            continue
        report.outcome_records_merged += res.merged
        report.outcome_rows_dropped += res.dropped_rows
    candidates = []
    for digest in root.objects.iter_digests():
        if progress:
            progress(1)
        if digest not in live:
            candidates.append(digest)
    _repack(root, need, via, forwarded, report, dry_run)
    # Packs no kept row needs (repacked ones included) and forwards none goes through.
    dead_packs = sorted({p for p in packs.iter_packs(root.objects) if p not in need}
                        | {p for p in forwarded if p not in via})
    report.marked = len(candidates) + len(dead_packs)
    fresh: list[marks.Mark] = []
    if candidates or dead_packs:
        if dry_run:  # what a real run would mark, kept in memory
            fresh.append(marks.Mark("(dry run)", time.time(), frozenset(candidates),
                                    frozenset(dead_packs)))
        else:
            try:
                marks.write(root.backend, candidates, time.time(), dead_packs)
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                # A full root: the sweep of older marks and of staging below is what
                # frees space; what is unreferenced now is marked by a later run.
                report.mark_error = f"cannot write a gc mark: {e.strerror}"
                log.warning("gc: %s; nothing new marked, sweeping older marks only",
                            report.mark_error)
    removed: set[str] = set()
    for m in [*marks.load_all(root.backend), *fresh]:
        if grace > 0 and now - m.created < grace:
            continue
        report.marks_swept += 1
        for digest in m.digests:
            if digest in live or digest in removed:
                continue
            info = root.backend.info(object_key(digest))
            if info is None:
                continue
            if m.spares(info.mtime):
                report.rewritten_since_mark += 1  # written (again) after the mark: kept
                continue
            if not dry_run:
                root.objects.delete(digest)
            removed.add(digest)
            report.removed_objects += 1
            report.removed_bytes += info.size
        for pack in m.packs:  # a pack, a repacked pack's forward, or both
            for key, used in ((packs.pack_key(pack), pack in need),
                              (packs.forward_key(pack), pack in via)):
                if used or key in removed:
                    continue
                info = root.backend.info(key)
                if info is None:
                    continue
                if m.spares(info.mtime):  # a publisher re-used it since the mark
                    report.rewritten_since_mark += 1
                    continue
                if not dry_run:
                    root.backend.delete(key)
                removed.add(key)
                report.removed_packs += key.startswith("packs/")
                report.removed_bytes += info.size
        if not dry_run and m not in fresh:
            marks.remove(root.backend, m)
    report.young_unreferenced = len(set(candidates) - removed) + len(
        [p for p in dead_packs if packs.pack_key(p) not in removed
         and packs.forward_key(p) not in removed])
    for name, age in root.backend.staging_entries():
        if age >= grace:
            report.removed_tmp += 1
            if not dry_run:
                root.backend.delete(f"tmp/{name}")
    log.info("gc%s: %s", " (dry run)" if dry_run else "", report)
    return report


@dataclass
class VerifyReport:
    objects: int = 0
    packs: int = 0
    generations: int = 0
    problems: list[str] = field(default_factory=list)
    # Damaged packs every row naming them reads past (a verified loose copy of each
    # member they use: what `casfs import` of the same files writes): not problems.
    repaired: list[str] = field(default_factory=list)


def verify(root: SharedRoot, *, progress: Progress | None = None) -> VerifyReport:
    """Re-hash every object; parse every record and manifest; check every reference."""
    report = VerifyReport()
    present: dict[str, bool] = {}  # digest -> verified ok
    damaged: dict[str, str] = {}  # pack -> what is wrong with it
    uses: dict[str, set[str]] = {}  # pack -> digests rows read from it
    for digest in root.objects.iter_digests():
        report.objects += 1
        try:
            root.objects.verify(digest)
            present[digest] = True
        except CasfsError as e:
            present[digest] = False
            report.problems.append(f"object {digest}: {e}")
        if progress:
            progress(1)
    for pack in packs.iter_packs(root.objects):
        report.packs += 1
        try:
            raw, info = packs.read_pack(root.objects, pack)
        except (CasfsError, OSError) as e:
            damaged[pack] = f"pack {pack}: {e}"
            continue
        for digest, (off, length) in info.members.items():
            try:
                root.objects.verify_stored(digest, raw[off:off + length])
                present.setdefault(digest, True)
                root.objects.locations.setdefault(digest, (pack, off, length))
            except CasfsError as e:
                present.setdefault(digest, False)
                report.problems.append(f"pack {pack}: member {digest}: {e}")
    gens = root.generations()
    for ns in gens.namespaces():
        for item in gens.records(ns):
            if isinstance(item, CasfsError):
                report.problems.append(str(item))
                continue
            report.generations += 1
            _verify_record(gens, item, present, report, uses)
    for pack, why in damaged.items():
        used = uses.get(pack)
        if used and all(present.get(d) for d in used):
            report.repaired.append(f"{why} (every row naming it reads a verified loose copy)")
        else:
            report.problems.append(why)
    return report


def _verify_record(
    gens: GenerationStore, rec: Record, present: dict[str, bool], report: VerifyReport,
    uses: dict[str, set[str]],
) -> None:
    where = f"{rec.namespace}@{rec.seq}"
    bad = "generation {}: {}: object {} is {}"
    try:
        snap = gens.snapshot(rec)
    except CasfsError as e:
        report.problems.append(str(e))  # snapshot errors already name the generation
        return
    for ent in snap.entries.values():
        named = ent.extras.get("pack") if ent.extras else None
        loc = packs.parse_location(named) if named is not None else None
        if loc is not None:
            uses.setdefault(loc[0], set()).add(ent.digest)
        elif named is not None:  # readers take it for a loose object (a miss if none)
            report.problems.append(f"generation {where}: {ent.path}: malformed pack location")
        ok = present.get(ent.digest)
        if ok is None:
            report.problems.append(bad.format(where, ent.path, ent.digest, "missing"))
        elif not ok:
            report.problems.append(bad.format(where, ent.path, ent.digest, "corrupt"))
        elif gens.objects.header(ent.digest).size != ent.size:
            report.problems.append(f"generation {where}: {ent.path}: size differs from manifest")


@dataclass
class Usage:
    namespaces: int = 0
    files: int = 0
    logical_bytes: int = 0  # bytes of every file of the newest generation(s)
    unique_bytes: int = 0  # uncompressed bytes of the distinct objects those files use
    file_stored_bytes: int = 0  # on-disk bytes of those distinct objects
    stored_bytes: int = 0  # on-disk bytes of every object counted (manifests, packs too)
    objects: int = 0
    packs: int = 0  # pack objects (whole root only)

    def to_json(self) -> dict[str, float | int]:
        return {
            "namespaces": self.namespaces,
            "files": self.files,
            "objects": self.objects,
            "packs": self.packs,
            "logical_bytes": self.logical_bytes,
            "unique_bytes": self.unique_bytes,
            "stored_bytes": self.stored_bytes,
            "dedup_ratio": round(self.logical_bytes / self.unique_bytes, 4)
            if self.unique_bytes else 1.0,
            "compression_ratio": round(self.unique_bytes / self.file_stored_bytes, 4)
            if self.file_stored_bytes else 1.0,
        }


def usage(root: SharedRoot, namespace: str | None = None,
          skipped: list[Skipped] | None = None) -> Usage:
    """Usage of one namespace's newest readable generation, or of the whole root (every object).

    Records passed over (damaged, newer format; GenerationStore.readable) are
    appended to ``skipped``.
    """
    gens = root.generations()
    u = Usage()
    files: dict[str, int] = {}
    manifests: set[str] = set()
    for ns in [namespace] if namespace else gens.namespaces():
        passed: list[Skipped] = []
        newest, rec, snap = gens.newest_valid(ns, skipped=passed)
        if newest is None:
            continue  # no generations (yet)
        if rec is None and namespace:  # raises: no readable generation, naming the newest
            snap, passed = gens.readable(ns)  # (unless one was published meanwhile)
            rec = snap.record
        if skipped is not None:
            skipped.extend(passed)
        if rec is None:  # the whole root: one unreadable namespace counts as empty
            continue
        u.namespaces += 1
        for e in snap.entries.values():
            u.files += 1
            u.logical_bytes += e.size
            files[e.digest] = e.size
        manifests.update(p.digest for p in rec.parts)
    u.unique_bytes = sum(files.values())
    u.file_stored_bytes = sum(root.objects.stored_size(d) for d in files)
    if namespace:
        u.objects = len(files) + len(manifests)
        u.stored_bytes = u.file_stored_bytes + sum(root.objects.stored_size(d) for d in manifests)
    else:
        for d in root.objects.iter_digests():
            u.objects += 1
            u.stored_bytes += root.objects.stored_size(d)
        for p in packs.iter_packs(root.objects):
            info = root.backend.info(packs.pack_key(p))
            u.packs += 1
            u.stored_bytes += info.size if info else 0
    return u
