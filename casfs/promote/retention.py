"""Retention by use: files no node opened for N days leave their namespace.

``casfs gc --unused-for DAYS`` (and casfsd's ``unused_for_days``): for each
namespace, a file is *used* when a node recorded opening it since the
cut-off (read records, casfs.store.reads) or it was published since then
(it is not in the newest generation created before the cut-off, or has
other bytes there). Everything else is dropped by publishing the newest
generation without it (casfs.store.generations.GenerationStore.drop); a
commit record (a Triton group) whose children are dropped goes too, so no
generation names a missing child. A namespace with no generation older
than the cut-off is left alone (nothing in it can have gone unused that long).
Objects no kept generation references are then gc's ordinary business.
"""

from __future__ import annotations

import functools
import logging
import posixpath
from dataclasses import dataclass, field

from casfs import families
from casfs.errors import UntrustedError
from casfs.store import reads
from casfs.store.generations import GenerationStore, Snapshot

log = logging.getLogger(__name__)


@dataclass
class RetentionReport:
    dropped: dict[str, list[str]] = field(default_factory=dict)  # namespace -> paths
    seqs: dict[str, int] = field(default_factory=dict)  # namespace -> new generation


def family_rules(ns: str) -> families.CacheRules:
    """The family rules of an auto namespace (``[<tenant>~]<family>-<hash>``), else generic."""
    bare = ns.rsplit("~", 1)[-1]
    name = bare.rsplit("-", 1)[0]
    return families.rules(name if name in families.names() else families.FALLBACK)


def _published_before(gens: GenerationStore, ns: str, cutoff: float) -> Snapshot | None:
    for seq in sorted(gens.seqs(ns), reverse=True):
        rec = gens.record(ns, seq)
        if rec.created < cutoff:
            return gens.snapshot(rec)
    return None


def unused(gens: GenerationStore, ns: str, snap: Snapshot, cutoff: float) -> set[str]:
    """The paths of ``snap`` nobody opened or published since ``cutoff``."""
    old = _published_before(gens, ns, cutoff)
    if old is None:
        return set()
    used = reads.read_since(gens.backend, ns, cutoff)
    for p, e in snap.entries.items():
        before = old.entries.get(p)
        if before is None or before.digest != e.digest:
            used.add(p)  # published since the cut-off
    gone = {p for p in snap.entries if p not in used}
    rules = family_rules(ns)
    for p, e in snap.entries.items():  # a kept commit record keeps its children whole
        if p in gone or not rules.is_commit_record(p):
            continue
        if families.too_large_to_parse(e.size):
            # Not parsed (published by a release before the bound, or by hand): kept,
            # and everything beside it, which may be what it names.
            here = posixpath.dirname(p)
            gone -= {c for c in gone if posixpath.dirname(c) == here}
            continue
        try:
            children = rules.record_children(p, gens.objects.get_bytes(e.digest, e.size))
        except Exception as err:  # unreadable: it names what it names, drop it with them
            log.warning("%s: cannot read commit record %s: %s", ns, p, err)
            children = None
        if children is None or any(c in gone or c not in snap.entries for c in children):
            gone.add(p)
    return gone


def _unused_in(gens: GenerationStore, ns: str, cutoff: float, snap: Snapshot) -> set[str]:
    return unused(gens, ns, snap, cutoff)


def drop_unused(gens: GenerationStore, *, unused_for_s: float, now: float, node: str,
                dry_run: bool = False) -> RetentionReport:
    rep = RetentionReport()
    cutoff = now - unused_for_s
    for ns in gens.namespaces():
        if dry_run:
            latest = gens.latest(ns)
            if latest is not None:
                gone = unused(gens, ns, gens.snapshot(latest), cutoff)
                if gone:
                    rep.dropped[ns] = sorted(gone)
            continue
        try:
            seq, gone_list = gens.drop(ns, functools.partial(_unused_in, gens, ns, cutoff),
                                       node=node)
        except UntrustedError as e:  # not this node's to rewrite; the others still are
            log.warning("retention: skipping %s: %s", ns, e)
            continue
        if seq is not None:
            rep.dropped[ns], rep.seqs[ns] = gone_list, seq
        reads.compact(gens.backend, ns, node, cutoff, now)
    return rep
