"""Promotion and publication of one namespace, behind one transport.

Promotion turns stable upper files into objects; publication writes a new
generation naming them (casfs.promote). Both touch the shared root, so where a
FUSE connection is to be protected they run in the promotion worker process
(casfs.node.promoteproc): the transport is chosen once, at start
(``WorkerTransport`` or ``InProcessTransport``), and nothing else asks which.
The write tracker stays in this process either way: the worker reports which
paths it promoted or found changed.

A job killed mid-write leaves files that may be half-written: ``torn_writes``
holds what changed in its window, so it is never promoted, and the view
discards it at release.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from casfs.errors import CasfsError, WorkerBugError
from casfs.families import CacheRules
from casfs.index.memtree import StagedLowerTree
from casfs.index.node_index import NodeIndex
from casfs.node import promoteproc, usage
from casfs.node.compiletime import MissClock, Savings
from casfs.node.config import MountConfig
from casfs.node.rootlink import RootLink
from casfs.promote.promoter import Promoter, RoundResult
from casfs.promote.publisher import Publisher, PublishOutcome
from casfs.promote.tracker import WriteTracker
from casfs.store import outcomes, profile, reads
from casfs.store.generations import PublishResult
from casfs.util import atomic, beneath
from casfs.util.counters import Counters

log = logging.getLogger(__name__)

Busy = Callable[[list[str]], set[str]] | None


class ViewHooks(Protocol):
    """What promotion needs from the view mode (casfs.node.modes)."""

    # Paths some process holds open for writing, where the tracker cannot know (overlay,
    # dir: the kernel writes); None where it does (fuse: the view sees every writer).
    busy: Callable[[list[str]], set[str]] | None
    # dir mode: whether a file is still as restored (not the job's), else None.
    unchanged: Callable[[str, os.stat_result], bool] | None
    # (uid, gid) whose fs credentials open the files promotion reads, or None (root's).
    reader: tuple[int, int] | None

    def wants_scan(self, final: bool) -> bool:
        """Rescan the whole upper before this round (events may be missing)."""

    def discard_torn(self, held: list[str]) -> list[str]:
        """Remove a killed job's held files at release; those removed."""


class Context:
    """The parts of a mount that promotion and publication read."""

    def __init__(self, cfg: MountConfig, rules: CacheRules, index: NodeIndex,
                 tracker: WriteTracker, counters: Counters, link: RootLink,
                 lower: StagedLowerTree, recorder: profile.Recorder) -> None:
        self.cfg, self.rules, self.index, self.tracker = cfg, rules, index, tracker
        self.counters, self.link, self.lower, self.recorder = counters, link, lower, recorder


class InProcessTransport:
    """Promotion and publication in this process (dir mode, or the worker turned off)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.ctimes: dict[str, int] = {}  # Promoter.ctimes, kept from round to round

    def prepare(self) -> None:
        """Nothing to get ready: this process has the root open already."""

    def promote(self, promoter: Promoter, final: bool, busy: Busy) -> RoundResult:
        return promoter.run_once(final=final)

    def publish(self, pub: Publisher) -> PublishOutcome:
        return pub.publish()

    def record_reads(self, batch: usage.Batch) -> None:
        ctx = self.ctx
        root = ctx.link.root
        assert root is not None
        reads.record(root.backend, ctx.cfg.namespace, ctx.index.node_id, batch.paths,
                     time.time(), until=batch.until)

    def record_outcomes(self, doc: dict[str, Any]) -> None:
        root = self.ctx.link.root
        assert root is not None
        outcomes.record(root.backend, self.ctx.cfg.namespace, **doc)


class WorkerTransport:
    """Promotion and publication in the promotion worker process: nothing that waits on
    the shared root, hashes or compresses runs in the FUSE process."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.ctimes: dict[str, int] = {}  # Promoter.ctimes, as the worker's replies say
        self._lock = threading.Lock()  # one round per namespace at a time
        self._record_sent = -1  # the served generation whose record the worker was sent
        promoteproc.shared(ctx.cfg.state_dir)  # started now: a first round does not wait

    def _call(self, msg: dict[str, Any]) -> dict[str, Any]:
        ctx = self.ctx
        return promoteproc.shared(ctx.cfg.state_dir).call(msg, lambda: None, ctx.counters)

    def prepare(self) -> None:
        """Have the worker open an object store root now, in the background (a thread:
        the mount is serving and waits for nothing here): its marker read and its
        first connection, a round trip or two a short job's release waited for after
        the job. A failure is only logged: the next request opens it again."""
        ctx = self.ctx
        if ctx.link.root is None or ctx.link.root.is_local:
            return  # a local root opens in microseconds
        msg = {"op": "prepare", "root": ctx.link.spec, "ns": ctx.cfg.namespace}

        def run() -> None:
            try:
                self._call(msg)
            except (CasfsError, OSError) as e:
                log.debug("%s: preparing the promotion worker: %s", ctx.cfg.name, e)

        threading.Thread(target=run, name=f"casfs-prepare-{ctx.cfg.namespace}",
                         daemon=True).start()

    def promote(self, promoter: Promoter, final: bool, busy: Busy) -> RoundResult:
        """One promotion round in the worker; the tracker stays here."""
        with self._lock:
            ctx = self.ctx
            res = RoundResult()
            paths = ctx.tracker.quiet(0.0 if final else ctx.cfg.stable_after,
                                      with_writers=final and busy is not None)
            # Scratch is never promoted (the promoter drops it): dropped here, not sent.
            # Inductor's lock files alone were a worker round, and that round's reads
            # of the root, at the release of every job.
            kept = []
            for p in paths:
                if ctx.rules.is_scratch(p):
                    ctx.tracker.forget(p)
                else:
                    kept.append(p)
            paths = kept
            if paths and busy is not None:
                held = busy(paths)
                res.deferred += len(held)
                paths = [p for p in paths if p not in held]
            # Bounded requests, commit records last: a group's children go in an earlier
            # request (their rows are written when the group is checked) or in its own.
            is_record = ctx.rules.is_commit_record
            paths = [p for p in paths if not is_record(p)] + [p for p in paths if is_record(p)]
            for i in range(0, len(paths), promoteproc.CHUNK):
                if not self._promote_paths(paths[i:i + promoteproc.CHUNK], res):
                    break
            return res

    def _promote_paths(self, paths: list[str], res: RoundResult) -> bool:
        """Promote ``paths`` in one worker request, into ``res``; False if the round
        must stop (the worker lost, or the root or disk failing: the paths stay dirty).

        A request that fails on its input (WorkerBugError: an exception that is not
        the environment's) is split in halves, down to the one file it fails on:
        that file stays on this node, unpublished, until it changes, and every
        other file is promoted (one such file, an empty one or a name that is not
        UTF-8, once failed every round of its namespace: nothing was published).
        """
        ctx = self.ctx
        cfg = ctx.cfg
        msg = {"op": "promote", "root": ctx.link.spec, "ns": cfg.namespace,
               "upper": str(cfg.writable_dir), "family": cfg.family,
               "scratch": list(cfg.scratch_patterns), "packs": cfg.packs,
               "max_seq": ctx.lower.max_seq, "paths": paths, "newest": self._newest(),
               "record": self._served_record(ctx.lower.max_seq)}
        try:
            reply = self._call(msg)
        except WorkerBugError as e:
            if len(paths) > 1:
                mid = len(paths) // 2  # order kept: commit records stay after children
                return (self._promote_paths(paths[:mid], res)
                        and self._promote_paths(paths[mid:], res))
            ctx.tracker.forget(paths[0])  # until it changes again
            ctx.counters.inc("promote_unpromotable")
            log.warning("%s: cannot promote %s (%s): it stays on this node, unpublished, "
                        "and is tried again when it changes", cfg.name, paths[0], e.message)
            return True
        except CasfsError as e:  # the worker died twice or hung: the paths stay dirty
            ctx.counters.inc("promote_worker_lost")
            res.errors += 1
            res.last_error = e.message
            log.warning("%s: promotion round failed (will retry): %s", cfg.name, e.message)
            return False
        for ev in reply.get("events") or []:
            if ev[0] == "f":
                ctx.tracker.forget(ev[1], ev[2])
            else:
                ctx.tracker.modified(ev[1])
        res.promoted += int(reply.get("promoted", 0))
        res.bytes += int(reply.get("bytes", 0))
        res.deferred += int(reply.get("deferred", 0))
        res.linked += int(reply.get("linked", 0))
        ctimes = reply.get("ctimes")
        if isinstance(ctimes, dict):  # hashed as they are: the next rounds' walks skip them
            self.ctimes.update({k: v for k, v in ctimes.items()
                                if isinstance(k, str) and isinstance(v, int)})
        res.errors += int(reply.get("errors", 0))
        res.last_error = str(reply.get("last_error", "")) or res.last_error
        return True

    def _newest(self) -> list[float] | None:
        """[seq, when] of the newest generation this mount found (its refresh, every
        refresh_interval): the worker's publication builds on it without a LIST and a HEAD
        (casfs.store.generations.PUBLISH_FRESH)."""
        link = self.ctx.link
        known = link.gens().newest_known(self.ctx.cfg.namespace) if link.root else None
        return [known[0], known[1]] if known else None

    def _served_record(self, seq: int) -> str | None:
        """The served generation's record as this mount read it, once per generation:
        the worker's first round learns the packs from its parts without reading it
        (a round trip after the job)."""
        link = self.ctx.link
        if seq <= self._record_sent or seq <= 0 or link.root is None:
            return None
        data = link.gens().known_record(self.ctx.cfg.namespace, seq)
        if data is None:
            return None
        self._record_sent = seq
        return data.decode()

    def publish(self, pub: Publisher) -> PublishOutcome:
        """Publication in the worker: the outcome as Publisher.publish's."""
        ctx = self.ctx
        cfg = ctx.cfg
        opened = ctx.recorder.paths()
        msg = {"op": "publish", "root": ctx.link.spec, "ns": cfg.namespace,
               "family": cfg.family, "scratch": list(cfg.scratch_patterns),
               "fingerprint": pub.fingerprint, "max_bytes": pub.max_bytes, "opened": opened,
               "first_miss": pub.first_miss, "newest": self._newest()}
        try:
            reply = self._call(msg)
        except CasfsError as e:  # the worker died twice or hung: retried next interval
            ctx.counters.inc("publish_errors")
            log.warning("%s: publication failed (will retry): %s", cfg.name, e.message)
            out = PublishOutcome(False, f"failed: {e.message}")
            pub.last = out
            return out
        for path in reply.get("lost") or []:
            ctx.tracker.modified(path)
        if reply.get("profiled"):
            ctx.recorder.mark_published(len(opened))
        raw = reply.get("result")
        out = PublishOutcome(bool(reply.get("published")), str(reply.get("message", "")),
                             PublishResult(**raw) if isinstance(raw, dict) else None,
                             tuple(str(e) for e in reply.get("timed") or ()))
        pub.last = out
        return out

    def record_reads(self, batch: usage.Batch) -> None:
        ctx = self.ctx
        self._call({"op": "reads", "root": ctx.link.spec, "ns": ctx.cfg.namespace,
                    "node": ctx.index.node_id, "paths": list(batch.paths),
                    "time": time.time(), "until": batch.until})

    def record_outcomes(self, doc: dict[str, Any]) -> None:
        ctx = self.ctx
        self._call({"op": "outcomes", "root": ctx.link.spec, "ns": ctx.cfg.namespace,
                    "outcome": doc})


Transport = InProcessTransport | WorkerTransport


class TornRecord:
    """``<state>/run/torn-<namespace>.json``: the files a killed job may have left
    half-written, with their size and mtime when held, until they are removed."""

    def __init__(self, path: Path, base: Path) -> None:
        self.path = path
        self.base = base  # the writable directory they lie in

    def load(self) -> dict[str, list[int]]:
        try:
            doc = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("ignoring unreadable %s: %s", self.path, e)
            return {}
        files = doc.get("files") if isinstance(doc, dict) else None
        if not isinstance(files, dict):
            return {}
        return {k: v for k, v in files.items() if isinstance(k, str) and isinstance(v, list)
                and len(v) == 2 and all(type(x) is int for x in v)}

    def _stat(self, rels: list[str]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        try:
            base = beneath.open_base(self.base)
        except OSError:
            return out
        try:
            for rel in rels:
                with contextlib.suppress(OSError):  # gone, or through a symlink: skipped
                    st = beneath.lstat(base, rel)
                    if stat.S_ISREG(st.st_mode):
                        out[rel] = [st.st_size, st.st_mtime_ns]
        finally:
            os.close(base)
        return out

    def add(self, rels: list[str]) -> None:
        files = {**self.load(), **self._stat(rels)}
        if not files:
            return
        try:
            atomic.write_atomic(self.path, json.dumps({"files": files}).encode(), mode=0o600)
        except OSError as e:  # a full state dir: the hold in memory still stands
            log.warning("cannot record held files in %s: %s", self.path, e)

    def unchanged(self, recorded: dict[str, list[int]]) -> list[str]:
        """The recorded files still as they were held (a later write made them good)."""
        now = self._stat(list(recorded))
        return sorted(rel for rel, v in now.items() if recorded.get(rel) == v)

    def clear(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class Publication:
    """Promotion rounds, publications and read records of one namespace."""

    def __init__(self, ctx: Context, view: ViewHooks, uses: usage.UseLog, *,
                 in_worker: bool, refresh: Any, profile_options: Any) -> None:
        self.ctx = ctx
        self.view = view
        self.uses = uses
        self.refresh = refresh  # the lower feed's: serve what was just published
        self.profile_options = profile_options  # in-process publication's profile
        self.transport: Transport = WorkerTransport(ctx) if in_worker else InProcessTransport(
            ctx)
        self.publisher: Publisher | None = None
        self.last_promotion_error = ""
        self._prepared = False
        self._walk_for_links = False  # a round promoted a file with other names
        self.last_publish: dict[str, Any] | None = None
        # The latest paths published with other bytes than this node's (first writer kept).
        self.conflict_paths: list[str] = []
        self._ingredients: dict[str, Any] | None = None
        self.torn = TornRecord(ctx.cfg.run_dir / f"torn-{ctx.cfg.namespace}.json",
                               ctx.cfg.writable_dir)
        # Compile time (casfs.node.compiletime): the mount's first misses per entry, its
        # hits' savings; what the last outcome record counted (casfs.store.outcomes).
        self.clock: MissClock | None = None
        self.savings: Savings | None = None
        self._outcome_base: dict[str, int] = {}
        self._outcome_day = outcomes.day_of(time.time())

    # --- promotion ------------------------------------------------------------------
    def promoter(self) -> Promoter | None:
        ctx = self.ctx
        root = ctx.link.root
        if root is None:
            return None
        return Promoter(
            upper=ctx.cfg.writable_dir, objects=root.objects, index=ctx.index,
            key=ctx.cfg.namespace, rules=ctx.rules, tracker=ctx.tracker,
            counters=ctx.counters, lower=ctx.lower, stable_after=ctx.cfg.stable_after,
            busy=self.view.busy, unchanged=self.view.unchanged, reader=self.view.reader,
            packs=ctx.cfg.packs, root_id=root.root_id, probe_loose=root.is_local,
            ctimes=self.transport.ctimes,
        )

    def prepare(self) -> None:
        """Once, when the namespace is served: what a release's records need that a
        short job's run would otherwise wait for after it ends (the worker's root)."""
        if not self._prepared and self.ctx.link.root is not None:
            self._prepared = True
            self.transport.prepare()

    def promote_once(self, final: bool = False) -> int:
        self.ctx.link.ensure()
        p = self.promoter()
        if p is None:
            return 0
        if self.view.wants_scan(final) or self._walk_for_links:
            # events may be missing (overlayfs writes, inotify overflow), or name only one
            # of a file's names: dir mode's inotify, a file with hard links written
            p.scan_all()
            self._walk_for_links = False
            self.ctx.counters.inc("promotion_walks")
        res = self.transport.promote(p, final, self.view.busy)
        if res.linked and final:  # no round after this one: its other names now
            p.scan_all()
            more = self.transport.promote(p, final, self.view.busy)
            res.promoted += more.promoted
            res.errors += more.errors
            res.last_error = more.last_error or res.last_error
        elif res.linked:
            self._walk_for_links = True  # its other names: the next round's walk
        if res.errors:
            self.last_promotion_error = res.last_error
        elif res.promoted:
            self.last_promotion_error = ""
        return res.promoted

    def promotion_state(self) -> tuple[int, str]:
        """(files still awaiting promotion, the last promotion error or '')."""
        waiting = self.ctx.tracker.pending()
        return waiting, self.last_promotion_error if waiting else ""

    # --- publication ----------------------------------------------------------------
    def set_ingredients(self, ingredients: object) -> None:
        """The job's ingredients of this namespace, computed on the job's side.

        Kept only if they hash to the namespace served (an explicit namespace
        has none): generation records carry them so ``casfs explain`` can say
        which ingredients differ between namespaces.
        """
        from casfs.fingerprint import Fingerprint
        from casfs.tenants import split_store_namespace

        if self._ingredients is not None or not isinstance(ingredients, dict):
            return
        cfg = self.ctx.cfg
        bare = split_store_namespace(cfg.namespace)[1]  # "<tenant>~<ns>" on the root
        if all(isinstance(k, str) and (v is None or isinstance(v, str))
               for k, v in ingredients.items()) and (
                Fingerprint(cfg.family, ingredients).namespace == bare):
            self._ingredients = dict(ingredients)

    def _publisher(self) -> Publisher | None:
        ctx = self.ctx
        root = ctx.link.root
        if root is None:
            return None
        if self.publisher is None or self.publisher.gens.root is not root:
            self.publisher = Publisher(
                generations=ctx.link.gens(), index=ctx.index, key=ctx.cfg.namespace,
                namespace=ctx.cfg.namespace, counters=ctx.counters, rules=ctx.rules,
                fingerprint=None, max_bytes=ctx.cfg.namespace_max_bytes,
                on_lost=ctx.tracker.modified,
            )
            self.publisher.options_for = self.profile_options
        # Only what a job said (set_ingredients): probing an interpreter here would put
        # a subprocess on the publication path, and this process is not the job's.
        # No mount path: path-bearing files are stored path-free (relocated on read).
        self.publisher.fingerprint = dict(self._ingredients or {})
        return self.publisher

    def pending_publication(self) -> int:
        return self.ctx.index.count_pending(self.ctx.cfg.namespace)

    def publish_once(self, final: bool = False) -> dict[str, Any]:
        """Publish what is promoted; ``final``: the namespace is being released."""
        ctx = self.ctx
        self.record_reads(force=True, final=final)
        waiting, error = self.promotion_state()
        pub = self._publisher()
        if pub is None:
            ctx.link.connect()
            return {"ok": False, "message": f"shared root unavailable: {ctx.link.error}",
                    "pending_promotion": waiting, "promotion_error": error}
        # Compile seconds need v2 rows: not where packs are off (a fleet mixing 0.1 nodes).
        clock = self.clock
        pub.first_miss = clock.first_misses() if clock is not None and ctx.cfg.packs else None
        t0 = time.monotonic()
        # Nothing promoted waits (what Publisher.publish would find first): no round trip
        # to the promotion worker, which a short job's release would otherwise wait
        # for while it still starts (~50 ms of a trivial `casfs run`).
        out = (PublishOutcome(True, "nothing to publish")
               if not self.pending_publication() or not self._drop_vanished(pub)
               else self.transport.publish(pub))
        if clock is not None and out.timed:
            clock.settle(out.timed)
            ctx.counters.inc("entries_timed", len(out.timed))
        res = out.result
        if (res is not None and res.added) or not out.ok:  # wrote a generation, or failed
            ctx.counters.observe("publish_seconds", time.monotonic() - t0)
        if res is not None and res.added and not final:
            # Serve (and report) the generation we just made. Not at a release: nothing
            # is served after it, and its reads (the probe, the record, the new part:
            # ~5 round trips on the job's way out) are the next mount's, if one comes.
            self.refresh()
        message, ok = out.message, out.ok
        if waiting:
            # Never "nothing to publish" while files wait: say what is stuck and why.
            what = f"{waiting} files await promotion"
            message = (f"{what}, failing: {error}" if error else what) + (
                "" if message == "nothing to publish" else f"; {message}")
            ok = ok and not error
        if res is not None and res.conflict_paths:
            log.info("%s: %d paths published by another writer with other bytes (kept): %s",
                     ctx.cfg.name, res.conflicts, ", ".join(res.conflict_paths[:5]))
            self.conflict_paths = (self.conflict_paths + res.conflict_paths)[-20:]
        self.last_publish = {
            "ok": ok, "message": message, "time": time.time(),
            "seq": res.seq if res else None, "added": res.added if res else 0,
            "conflicts": res.conflicts if res else 0,
            "pending_promotion": waiting, "promotion_error": error,
        }
        return self.last_publish

    def _drop_vanished(self, pub: Publisher) -> int:
        """Forget pending entries whose upper file is gone or changed since promotion
        (a changed one is promoted again); how many are left to publish.

        Another process may change the upper between this one's promotion and its
        record: the successor of a handover (a review: files a job removed or renamed
        through the new mount came back for every node, published by the draining
        process's final round), or a kernel write not reported yet. One lstat an entry;
        what changes after it is still the next round's."""
        ctx = self.ctx
        left = 0
        try:
            base = beneath.open_base(ctx.cfg.writable_dir)
        except OSError:
            return 1  # no upper to look at: the publisher decides, as before
        try:
            for e in list(pub.pending()):
                try:
                    st = beneath.lstat(base, e.path)
                except OSError as err:
                    # gone: ENOENT, or a directory on the way replaced (ENOTDIR, ELOOP: by
                    # a file or a symlink); anything else (EACCES, EXDEV, EIO) is no
                    # evidence of a change
                    if err.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                        left += 1
                        continue
                    st = None
                if st is not None and stat.S_ISREG(st.st_mode) and (
                        st.st_mtime_ns == e.mtime_ns):
                    left += 1
                    continue
                ctx.index.forget_promoted(ctx.cfg.namespace, e.path)
                ctx.counters.inc("pending_vanished")
                if st is not None:
                    ctx.tracker.modified(e.path)
                log.info("%s: not publishing %s: %s since it was promoted", ctx.cfg.name,
                         e.path, "changed" if st is not None else "gone")
        finally:
            os.close(base)
        return left

    def publish_if_pending(self) -> None:
        if self.pending_publication():
            self.publish_once()

    def record_reads(self, force: bool = False, final: bool = False) -> None:
        """Write what this mount's jobs opened as a read record (casfs.store.reads) when
        casfs.node.usage says it is due; ``force`` at publication, ``final`` at release."""
        beside = None
        if self._outcome_due(final, outcomes.day_of(time.time())):
            # The outcome record goes beside the read record: a release's two small
            # writes at once, not one round trip after the other.
            beside = threading.Thread(target=self.record_outcomes, args=(final,),
                                      name="casfs-outcomes", daemon=True)
            beside.start()
        try:
            self._record_reads(force, final)
        finally:
            if beside is not None:
                beside.join()

    def _record_reads(self, force: bool, final: bool) -> None:
        ctx = self.ctx
        if not (force or final or self.uses.due()):
            return
        batch = self.uses.take(force=force, final=final)
        if batch is None:
            return
        if ctx.link.root is None:
            self.uses.put_back(batch)
            return
        try:
            self.transport.record_reads(batch)
            ctx.counters.inc("read_records")
            ctx.counters.inc("read_record_paths", len(batch.paths))
        except (CasfsError, OSError) as e:
            self.uses.put_back(batch)
            log.warning("%s: no read record this time: %s", ctx.cfg.name, e)

    OUTCOME_KEYS = ("entries_hit", "entries_missed", "compile_ms_saved", "entries_hit_untimed")

    def _outcome_due(self, final: bool, today: str) -> bool:
        """An outcome record is written now: at release, or on a new UTC day."""
        return self.clock is not None and (final or today != self._outcome_day)

    def record_outcomes(self, final: bool = False) -> None:
        """This mount's outcome record (casfs.store.outcomes): at release (``final``),
        and on the first call of a new UTC day (the rows then go to the day before).
        One small write per namespace and release, or per day; nothing when all is 0."""
        ctx, clock = self.ctx, self.clock
        now = time.time()
        today = outcomes.day_of(now)
        if clock is None or not self._outcome_due(final, today):
            return
        cur = {k: ctx.counters.get(k) for k in self.OUTCOME_KEYS}
        d = {k: cur[k] - self._outcome_base.get(k, 0) for k in self.OUTCOME_KEYS}
        if not (d["entries_hit"] or d["entries_missed"] or d["compile_ms_saved"]):
            self._outcome_day = today
            return
        if ctx.link.root is None:
            return  # counted in the next one
        missed = clock.take_missed()
        doc = {"family": ctx.cfg.family, "node": ctx.index.node_id, "now": now,
               "day": today if final else self._outcome_day,
               "hits": d["entries_hit"], "misses": d["entries_missed"],
               "saved_ms": d["compile_ms_saved"], "untimed": d["entries_hit_untimed"],
               "missed": missed.most_common(outcomes.MISSED_MAX)}
        try:
            self.transport.record_outcomes(doc)
        except (CasfsError, OSError) as e:
            clock.missed_counts.update(missed)
            log.warning("%s: no outcome record this time: %s", ctx.cfg.name, e)
            return
        self._outcome_base, self._outcome_day = cur, today
        ctx.counters.inc("outcome_records")

    # --- killed jobs and release ---------------------------------------------------------
    def torn_writes(self, since: float, until: float) -> int:
        """A job of this namespace was killed: what changed from ``since`` to ``until``
        (monotonic) may be half-written (a linker's output, a cache file written in
        place). It is never promoted, and removed at release (a miss next time, never a
        torn file on other nodes). Returns how many files.

        The held files are also written down (``TornRecord``), so a restart before the
        release (a crash, an upgrade) removes them instead of promoting them."""
        ctx = self.ctx
        n = ctx.tracker.hold(since, until)
        if n:
            ctx.counters.inc("torn_held", n)
            log.warning("%s: a job was killed: %d files it may have been writing are not "
                        "published", ctx.cfg.name, n)
            self.torn.add(ctx.tracker.held())
        return n

    def drained_torn(self, pid: int, rels: set[str]) -> None:
        """A replaced process (pid) died draining, with ``rels`` open for writing through
        its FUSE mount: what its jobs had in flight never reached the upper. Held as they
        are (a later write lifts it), recorded, removed at release like a killed job's."""
        ctx = self.ctx
        n = ctx.tracker.hold_paths(rels)
        ctx.counters.inc("torn_held", n)
        log.warning("%s: replaced mount process pid %d died with %d files open for writing"
                    " through it: not published, removed at release unless written again",
                    ctx.cfg.name, pid, n)
        self.torn.add(ctx.tracker.held())

    def discard_recorded_torn(self) -> None:
        """At start: remove what a killed job left that a previous process held but did
        not remove (it stopped first); each file only if unchanged since it was held."""
        ctx = self.ctx
        recorded = self.torn.load()
        if not recorded:
            return
        removed = self.view.discard_torn(self.torn.unchanged(recorded))
        ctx.counters.inc("torn_discarded", len(removed))
        if removed:
            log.info("%s: removed %d files a killed job left before the last stop",
                     ctx.cfg.name, len(removed))
        self.torn.clear()

    def final_publication(self) -> None:
        """Promote and publish everything stable: the namespace is being released.

        A publication that finds a promoted object gone puts its path back to
        promotion, for the next round; at release no next round comes, so it
        gets one more here.
        """
        ctx = self.ctx
        if ctx.link.root is None:
            ctx.link.connect(last_chance=True)  # the last time anything here would publish
        held = list(ctx.tracker.held())
        if held:
            self.torn.add(held)  # RELEASEs that came after the decision
            removed = self.view.discard_torn(held)
            for rel in removed:
                ctx.tracker.removed(rel)
                ctx.counters.inc("torn_discarded")
            if len(removed) == len(held):
                self.torn.clear()  # else the next start removes the rest
        for _ in range(2):
            lost = ctx.counters.get("promoted_objects_lost")
            self.promote_once(True)
            self.publish_once(True)
            if ctx.counters.get("promoted_objects_lost") == lost:
                return

