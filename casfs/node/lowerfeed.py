"""The lower feed: which generation a mount serves, and how new ones reach its view.

Owns the lower tree, the served seq and the indexer thread. At start it reads
the newest valid generation (``newest_valid`` checks all of it before any of it
is served); a namespace with no rows on this node is served from its parsed
manifest at once while a thread writes the rows (casfs.index.memtree). A
refresh indexes what a newer generation added and tells the view through
``FeedListener``: paths added (negative dentries to drop) and replaced paths
with newer bytes, only once the new seq is the one served.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from casfs.errors import CasfsError
from casfs.families import CacheRules
from casfs.index.memtree import MemLowerTree, StagedLowerTree
from casfs.index.node_index import NodeIndex
from casfs.node import preopen
from casfs.node.config import MountConfig
from casfs.node.rootlink import RootLink
from casfs.store.entry import Entry
from casfs.store.generations import Record, Snapshot
from casfs.util.counters import Counters

log = logging.getLogger(__name__)


class FeedListener(Protocol):
    def replaced_changed(self, paths: list[str]) -> None:
        """Newer versions of these replaced paths are about to be served."""

    def lower_added(self, paths: list[str]) -> None:
        """These paths were added by the generation about to be served."""

    def generation_served(self, seq: int) -> None:
        """``seq`` is served now (dir mode restores what it added)."""


class LowerFeed:
    INDEX_CHUNK = 8192  # rows per write transaction while serving: stop is checked between
    INDEX_HOLD = 10.0  # seconds a held start waits for index_now at most (see start)

    def __init__(self, cfg: MountConfig, rules: CacheRules, index: NodeIndex, link: RootLink,
                 counters: Counters) -> None:
        self.cfg = cfg
        self.rules = rules
        self.index = index
        self.link = link
        self.counters = counters
        self.listener: FeedListener | None = None  # the view, once it exists
        # Lazy ingest (casfs.index.memtree): a namespace with no rows on this node is
        # served from its parsed manifest while a thread writes the rows.
        self._may_stage = True
        self._staged: tuple[Record, list[list[Entry]], MemLowerTree] | None = None
        self._stop_indexing = threading.Event()
        self._index_now = threading.Event()  # see start(held=...)
        self._replaced_pending: set[str] = set()
        # Paths an ingest added while serving: the view drops the kernel's negative
        # dentries for them once they are served (casfs.view.op_base.lower_added).
        self._added_pending: list[str] = []
        self._refresh_lock = threading.Lock()
        self.served_seq = self._initial_seq()
        self._may_stage = False
        self.restored_entries = (self._staged[0].entries if self._staged is not None else
                                 int((index.ns_state(cfg.namespace) or {}).get("entries", 0)))
        self.lower = StagedLowerTree(index.lower_tree(cfg.namespace, self.served_seq),
                                     self._staged[2] if self._staged is not None else None)
        self._indexer: threading.Thread | None = None
        if self._staged is not None:
            self._indexer = threading.Thread(target=self._write_staged_rows,
                                             name=f"casfs-index-{cfg.namespace}", daemon=True)

    def start(self, held: bool = False) -> None:
        """Start writing the staged generation's rows (if any) in the background.

        ``held``: not before ``index_now`` (at most INDEX_HOLD seconds): a fresh node's
        whole-namespace prefetch plans by walking the staged generation in memory (a
        walk of LMDB's rows is several times slower), and the rows' CPU is not taken
        from its installs on a small node. Lookups are answered from memory meanwhile;
        whoever needs the rows (a refresh, ``wait_indexed``) asks for them at once."""
        if not held:
            self._index_now.set()
        if self._indexer is not None:
            self._indexer.start()

    def index_now(self) -> None:
        """Write the rows now (a held start's wait ends)."""
        self._index_now.set()

    # --- reading generations -----------------------------------------------------
    def _initial_seq(self) -> int:
        cfg, index = self.cfg, self.index
        state = index.ns_state(cfg.namespace) or {}
        known = int(state.get("seq", 0))
        root = self.link.root
        if root is None:
            return known
        if state and state.get("root") != root.root_id:
            # This state dir last served the namespace from another shared root:
            # its lower entries name objects this root may not have, and what it
            # promoted was published there, not here. Start over for this root;
            # the upper files are kept and promoted again.
            log.warning("%s: %s was indexed from another shared root; re-indexing from %s",
                        cfg.name, cfg.namespace, root.path)
            index.drop_namespace(cfg.namespace)
            index.forget_all_promoted(cfg.namespace)
            known = 0
        try:
            return self.ingest_latest(known) or known
        except Exception as e:
            # Anything else too (a hostile document a check missed, a bug): the mount
            # serves what this node knows, a miss for the rest, as for an unreadable
            # root; a refused start left its jobs with no cache at all. Its traceback
            # once, to find the cause by.
            self._staged = None  # never served: the generation it came from failed
            self.counters.inc("refresh_errors")
            log.error("%s: cannot read generations of %s: %s", cfg.name, cfg.namespace,
                      e if isinstance(e, (CasfsError, OSError)) else f"{type(e).__name__}: {e}",
                      exc_info=not isinstance(e, (CasfsError, OSError)))
            return known

    def ingest_latest(self, known: int) -> int | None:
        """Index the newest generation's manifest parts not seen yet; its seq, or None."""
        assert self.link.root is not None
        gens = self.link.gens()
        ahead = self.link.take_newest()  # found while the host started (casfs.node.preopen)
        if ahead is not None and (not known or (ahead[0] or 0) >= known):
            newest, got = ahead
        else:  # (below what this node served: probed from it, so a rollback is reported)
            # A first attach (casfsd's leases): the listed newest's record beside the
            # HEAD past it, then its profile beside its parts, as a pre-open does.
            guess = None if known else gens.read_listed_newest(self.cfg.namespace,
                                                               self.cfg.fetch_timeout)
            newest, got = gens.latest_seq(self.cfg.namespace, hint=known or None), None
            if guess is not None and newest is not None:
                listed = guess()  # (waited for: newest_valid takes it, not a second GET)
                if self.cfg.prefetch:  # the profile is the prefetch's
                    preopen.read_profile_ahead(self.link.root, gens, self.cfg.namespace,
                                               newest, listed)
        if newest is None or newest <= known:
            return None  # nothing new: no manifest is read
        # newest_valid validates the whole generation before any of it is served.
        rec, snap = got if got is not None else \
            gens.newest_valid(self.cfg.namespace, newest=newest)[1:]
        if rec is None or rec.seq <= known:
            return None
        self._ingest(rec, snap)
        return rec.seq

    def _ingest(self, rec: Record, snap: Snapshot) -> None:
        gens = self.link.gens()
        ns, name = self.cfg.namespace, self.cfg.name
        state = self.index.ns_state(ns) or {}
        have = set(state.get("parts", []))
        new_parts = [gens.part_entries(p) for p in rec.parts if p.digest not in have]
        replaced: list[str] = []
        if self._may_stage and not state and snap.record is rec:
            # Start-up with no rows here: serve the validated generation from memory
            # (casfs.index.memtree), write the rows after.
            self._staged = (rec, new_parts, MemLowerTree(snap.entries, snap.dirs))
            log.info("%s: serving %s@%d (%d files) while indexing it", name, ns, rec.seq,
                     rec.entries)
        else:
            for entries in new_parts:
                replaced += self.index.add_entries(ns, rec.seq, entries).replaced
                if self.listener is not None:
                    self._added_pending += [e.path for e in entries]
            self._set_ingested(rec)
            log.info("%s: indexed %s@%d (%d files)", name, ns, rec.seq, rec.entries)
        self._check_mount_path(rec)
        if replaced and self._may_stage:
            # Start-up: counted only (the view releases superseded upper copies itself).
            self.counters.inc("replaced_refreshed", len(set(replaced)))
        elif replaced:
            # Told to the view by refresh once the new seq is served: invalidated
            # before that, the kernel could look the old version up again (and keep it).
            self._replaced_pending.update(replaced)

    def _set_ingested(self, rec: Record) -> None:
        self.index.set_ns_state(self.cfg.namespace, {
            "seq": rec.seq, "parts": [p.digest for p in rec.parts], "entries": rec.entries,
            "root": self.link.gens().root.root_id})

    def _check_mount_path(self, rec: Record) -> None:
        """Records of older casfs releases name their mount path: their path-bearing
        files hold absolute paths, which only hit at that path (newer ones are
        stored path-free and need no check)."""
        published_at = (rec.fingerprint or {}).get("mountpoint")
        if (self.rules.path_bearing and isinstance(published_at, str)
                and published_at != str(self.cfg.mountpoint)):
            self.counters.inc("mount_path_mismatch")
            log.warning(
                "%s: %s@%d was published from a mount at %s but is served here at %s:"
                " its Triton group files (from an older casfs) hold absolute paths,"
                " so those kernels will miss here",
                self.cfg.name, rec.namespace, rec.seq, published_at, self.cfg.mountpoint)

    def _write_staged_rows(self) -> None:
        """The indexer thread: the staged generation's rows into LMDB, then its state."""
        assert self._staged is not None
        rec, parts, _ = self._staged
        self._index_now.wait(self.INDEX_HOLD)
        ns, t0 = self.cfg.namespace, time.monotonic()
        try:
            self._staged[2].index_dirs()  # before the job's first listing needs it
            # Rows without a recorded state are an interrupted ingest's: start clean.
            self.index.drop_namespace(ns)
            chunk = self.INDEX_CHUNK
            for entries in parts:
                for i in range(0, len(entries), chunk):
                    if self._stop_indexing.is_set():
                        return  # no state recorded: the next start indexes again
                    self.index.add_entries(ns, rec.seq, entries[i:i + chunk])
            self._set_ingested(rec)
            self.lower.finish()
            self._staged = None
            log.info("%s: indexed %s@%d (%d files) in %.2fs", self.cfg.name, ns, rec.seq,
                     rec.entries, time.monotonic() - t0)
        except (CasfsError, OSError) as e:
            self.counters.inc("index_errors")
            log.error("%s: cannot index %s@%d (served from memory until the next start): %s",
                      self.cfg.name, ns, rec.seq, e)
        finally:
            self.lower.indexed.set()  # refresh may go on (it waits for this)

    def wait_indexed(self, timeout: float | None = None) -> bool:
        """Whether the served generation's rows are in LMDB (waits up to ``timeout``)."""
        self.index_now()
        return self.lower.indexed.wait(timeout) and not self.lower.staged

    # --- refresh -------------------------------------------------------------------
    def refresh(self) -> dict[str, Any]:
        """Serve the newest generation if it is newer; {"ok", "served_seq"} or the error."""
        # A newer generation is added to the rows: the staged one's must be written first.
        self.index_now()
        self.lower.indexed.wait()
        # One refresh at a time (the periodic one, publish's, the control command's):
        # a second one could report the new seq before the first told the view which
        # replaced paths changed, and its caller would still see the old version.
        with self._refresh_lock:
            return self._refresh_locked()

    def _refresh_locked(self) -> dict[str, Any]:
        if self.link.ensure() is None:
            return {"ok": False, "message": f"shared root unavailable: {self.link.error}"}
        try:
            seq = self.ingest_latest(self.served_seq)
        except (CasfsError, OSError) as e:
            self.counters.inc("refresh_errors")
            log.warning("%s: refresh failed: %s", self.cfg.name, e)
            return {"ok": False, "message": str(e)}
        if seq is not None and seq > self.served_seq:
            # Entries only ever get added, and each path's bytes never change, so
            # raising max_seq never changes an entry a reader has seen.
            self.lower.max_seq = seq
            if self.lower.staged:  # the indexer failed; this ingest wrote every row
                self.lower.finish()
            listener = self.listener
            if self._replaced_pending:
                changed, self._replaced_pending = sorted(self._replaced_pending), set()
                self.counters.inc("replaced_refreshed", len(changed))
                if listener is not None:
                    listener.replaced_changed(changed)
            added, self._added_pending = self._added_pending, []
            if added and listener is not None:
                listener.lower_added(added)
            self.served_seq = seq
            self.counters.inc("refreshes")
            if listener is not None:
                listener.generation_served(seq)
        return {"ok": True, "served_seq": self.served_seq}

    def close(self) -> None:
        """Stop the indexer (at most one chunk more: then the index may be closed)."""
        self._stop_indexing.set()
        self.index_now()
        if self._indexer is not None and self._indexer.is_alive():
            self._indexer.join()
