"""Publication: push the pending promoted entries of one namespace as a new generation.

Runs in a worker thread, every ``publish_interval`` when something is
pending and once more at shutdown. Failures are logged, counted and retried
next round; they never reach the mount.

Replaced paths (declared by the family, casfs.families): published with
extras ``{"replace": true}``, so the newest generation's version wins; a
``merge`` rule first combines the published version with ours (vLLM's index:
union of keys, ours per key). Every other path is first-writer-wins.

Group consistency: a commit record (a Triton group file) is published only if
every child it names ends up in the generation with *our* bytes (published by us now or
earlier). If another node already published different bytes for a child,
our group is dropped as a conflict, so a published group never mixes the
files of two writers.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from casfs.errors import (
    CasfsError,
    PublishDeferredError,
    QuotaExceededError,
    UnreadableHereError,
    UntrustedError,
)
from casfs.families import CacheRules, too_large_to_parse
from casfs.index.node_index import NodeIndex
from casfs.index.promoted import PromotedRecord
from casfs.promote.timing import with_compile_times
from casfs.store import profile
from casfs.store.entry import Entry
from casfs.store.generations import (
    RELOCATE,
    REPLACE,
    GenerationStore,
    PublishResult,
    Snapshot,
)
from casfs.store.objects import object_key
from casfs.store.packs import pack_key, parse_location
from casfs.store.record import Record
from casfs.util.counters import Counters

log = logging.getLogger(__name__)


@dataclass
class PublishOutcome:
    ok: bool
    message: str
    result: PublishResult | None = None
    timed: tuple[str, ...] = ()  # entries published with their compile seconds (cs)


class Publisher:
    def __init__(
        self,
        *,
        generations: GenerationStore,
        index: NodeIndex,
        key: str,
        namespace: str,
        counters: Counters,
        rules: CacheRules,
        fingerprint: dict[str, Any] | None,
        max_bytes: int | None,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.gens = generations
        self.index = index
        self.key = key
        self.namespace = namespace
        self.counters = counters
        self.rules = rules
        self.fingerprint = fingerprint
        self.max_bytes = max_bytes
        self.on_lost = on_lost  # called with a path whose promoted object disappeared
        self.last: PublishOutcome | None = None
        # Optional record keys for a publication of these entries (the access profile).
        # Called with the entries and the record they are published on.
        self.options_for: Callable[[list[Entry], Record | None], dict[str, Any]] | None = None
        # Entry -> first miss (ns since the epoch) of entries a job of this mount made:
        # their rows get compile seconds (casfs.promote.timing); None: no figures.
        self.first_miss: dict[str, int] | None = None

    def pending(self) -> list[Entry]:
        return list(self.index.pending(self.key, self.gens.root.root_id))

    def publish(self) -> PublishOutcome:
        pending = self._present(self.pending())
        if not pending:
            return PublishOutcome(True, "nothing to publish")
        timed: list[str] = []
        if self.first_miss:
            pending, timed = with_compile_times(self.rules, pending, self.first_miss)
        try:
            res = self.gens.publish(
                self.namespace,
                [self._mark(e) for e in pending],
                node=self.index.node_id,
                fingerprint=self.fingerprint,
                max_bytes=self.max_bytes,
                select=self._select,
                options=(functools.partial(self.options_for, pending)
                         if self.options_for is not None else None),
            )
        except QuotaExceededError as e:
            self.counters.inc("publish_refused_quota")
            log.error("%s", e)
            out = PublishOutcome(False, str(e))
        except UnreadableHereError as e:
            # Not damage: a newer casfs published here. Publishing on the older
            # snapshot this node can read would drop its entries for everyone.
            self.counters.inc("publish_refused_newer_format")
            log.error("not publishing to %s: %s", self.namespace, e)
            out = PublishOutcome(False, f"refused: {e}")
        except UntrustedError as e:
            # Squatted: another user made the tenant's namespace directory on a root
            # without casfsd to move it aside. Said once per process (as an error: the
            # job's writes stay local), then counted; the summary line and doctor say it.
            if not self.counters.get("publish_refused_untrusted"):
                log.error("not publishing to %s: %s", self.namespace, e)
            self.counters.inc("publish_refused_untrusted")
            out = PublishOutcome(False, f"refused: {e}")
        except PublishDeferredError as e:
            self.counters.inc("publish_deferred")
            log.warning("%s", e)
            out = PublishOutcome(False, f"deferred: {e}")
        except (CasfsError, OSError) as e:
            self.counters.inc("publish_errors")
            log.warning("publication of %s failed (will retry): %s", self.namespace, e)
            out = PublishOutcome(False, f"failed: {e}")
        else:
            if res.seq is not None:
                # Conflicting paths are settled too: the published entry stays.
                # Entries, not bare paths: a file re-promoted meanwhile stays pending.
                self.index.mark_published(self.key, pending, res.seq, self.gens.root.root_id)
            if res.added:
                self.counters.inc("generations_published")
                self.counters.inc("files_published", res.added)
                self.counters.inc("replaced_published", res.replaced)
            self.counters.inc("publish_conflicts", res.conflicts)
            if res.attempts > 1:  # another node made each seq first: how contended it is
                self.counters.inc("publish_races_lost", res.attempts - 1)
            out = PublishOutcome(
                True,
                f"{self.namespace}@{res.seq}: +{res.added} files, {res.already} already"
                f" published, {res.conflicts} conflicts",
                res, tuple(timed),
            )
        self.last = out
        return out

    def _present(self, pending: list[Entry]) -> list[Entry]:
        """Pending entries whose objects still exist, each touched to outlive a concurrent gc.

        A node that was offline past the gc grace period may find its promoted
        objects collected: those entries go back to promotion (re-hashed from
        the upper file) instead of being named by a record that points at nothing.
        """
        backend, objects = self.gens.backend, self.gens.objects

        def there(key: str) -> bool:  # stored here moments ago (a promotion): no HEAD
            if objects.recently_stored(key):
                return True
            if backend.info(key) is None:
                return False
            backend.touch(key)
            return True

        present = []
        packs: dict[str, bool] = {}  # pack digest -> exists (one HEAD per pack, not per entry)
        for e in pending:
            loc = parse_location(e.extras.get("pack")) if e.extras else None
            if loc is None:
                ok = there(object_key(e.digest))
            else:
                if loc[0] not in packs:
                    packs[loc[0]] = there(pack_key(loc[0]))
                    if not packs[loc[0]]:
                        objects.forget_pack(loc[0])
                ok = packs[loc[0]]
            if not ok:
                if loc is not None:  # re-promotion must not find the gone pack again
                    self.index.forget_pack_locations(self.gens.root.root_id, [e.digest])
                self.index.forget_promoted(self.key, e.path)
                self.counters.inc("promoted_objects_lost")
                if self.on_lost is not None:
                    self.on_lost(e.path)
                continue
            present.append(e)
        return present

    def _mark(self, e: Entry) -> Entry:
        """The extras a reader needs: replaced path, path count of a path-free file."""
        replaced = self.rules.replace_rule(e.path) is not None
        bearer = self.rules.path_bearer(e.path)
        if not replaced and bearer is None and (e.extras is None or e.extras):
            return e  # the common case: nothing to add (no copy per entry)
        extras = dict(e.extras or {})
        if replaced:
            extras[REPLACE] = True
        if bearer is not None:
            try:
                n = bearer.count(e.path, self.gens.objects.get_bytes(e.digest, e.size))
            except CasfsError:
                n = None
            if n:
                extras[RELOCATE] = n
        return replace(e, extras=extras or None)

    def _select(self, snap: Snapshot, new: list[Entry]) -> list[Entry]:
        return self._consistent_groups(snap, [self._merged(e, snap) for e in new])

    def _merged(self, e: Entry, snap: Snapshot) -> Entry:
        """A merge-rule path: the published version combined with ours (ours wins per key)."""
        rule = self.rules.replace_rule(e.path)
        have = snap.entries.get(e.path)
        if rule is None or rule.merge is None or have is None or have.digest == e.digest:
            return e
        if too_large_to_parse(have.size) or too_large_to_parse(e.size):
            return e  # not in the format: newest wins, nothing read or parsed
        try:
            older = self.gens.objects.get_bytes(have.digest, have.size)
            newer = self.gens.objects.get_bytes(e.digest, e.size)
        except CasfsError as err:
            log.warning("cannot merge %s, publishing ours: %s", e.path, err)
            return e
        merged = rule.merge(older, newer)
        if merged is None or merged == newer:
            return e  # not in the format (newest wins) or nothing to add
        put = self.gens.objects.put_bytes(merged)
        self.counters.inc("replaced_merged")
        # Other bytes, stored loose: the promoted object's pack location is not theirs.
        extras = {k: v for k, v in (e.extras or {}).items() if k != "pack"} or None
        return replace(e, digest=put.digest, size=put.size, extras=extras)

    def _consistent_groups(self, snap: Snapshot, new: list[Entry]) -> list[Entry]:
        """Drop group files whose children would not all be this writer's bytes."""
        adding = {e.path: e.digest for e in new}
        groups = {e.path: self._children(e) for e in new if self.rules.is_commit_record(e.path)}
        # One index read for every group's children, not one per group.
        recs = self.index.get_promoted_many(
            self.key, {c for children in groups.values() for c in children or ()})
        keep: list[Entry] = []
        for e in new:
            if e.path in groups and not self._group_ok(groups[e.path], snap, adding, recs):
                self.counters.inc("groups_dropped")
                log.info("not publishing group %s: its children are not all ours", e.path)
                continue
            keep.append(e)
        return keep

    def _children(self, group: Entry) -> list[str] | None:
        if too_large_to_parse(group.size):
            return None  # not in the format: never read
        try:
            data = self.gens.objects.get_bytes(group.digest, group.size)
        except CasfsError:
            return None
        return self.rules.record_children(group.path, data)

    def _group_ok(self, children: list[str] | None, snap: Snapshot, adding: dict[str, str],
                  recs: dict[str, PromotedRecord]) -> bool:
        if children is None:
            return False
        for c in children:
            final = adding.get(c) or (snap.entries[c].digest if c in snap.entries else None)
            rec = recs.get(c)
            mine = rec.entry.digest if rec else None  # None: unchanged from the lower layer
            if final is None or (mine is not None and final != mine):
                return False
        return True


def profile_options(gens: GenerationStore, namespace: str, opened: list[str],
                    published: list[Entry], counters: Counters, base: Record | None
                    ) -> dict[str, Any]:
    """The record's ``profile``: that of the record published on (``base``), merged
    with what the jobs opened (``opened``) and the files published now (a cold run's
    hot set is what it wrote). Any failure only drops the profile ({}), except a
    namespace this node must not publish to (squatted, or written by a newer casfs):
    raised, for the publication to refuse and say so once, not a "without a profile"
    warning before it."""
    try:
        old = base.options.get("profile") if base is not None else None
        older: list[tuple[str, int]] = []
        runs = 0
        if isinstance(old, str):
            try:
                older, runs = profile.decode(gens.objects.get_bytes(old))
            except (CasfsError, OSError, ValueError) as e:
                log.warning("%s: ignoring the profile %s: %s", namespace, old, e)
        merged, runs = profile.merge(older, runs, [*opened, *(e.path for e in published)])
        put = gens.objects.put_bytes(profile.encode(merged, runs))
        counters.inc("profiles_published")
        return {"profile": put.digest}
    except (UntrustedError, UnreadableHereError):
        raise  # publication refuses these too (Publisher.publish): said there, once
    except (CasfsError, OSError, ValueError) as e:  # ValueError: one json.dumps cannot write
        log.warning("%s: publishing without a profile: %s", namespace, e)
        return {}
