"""Misses that name their cause, per entry: held by another namespace of the family, or by none.

A job's missed entries (the mount's first ``NAMED_CAP``, by name: casfs.node.compiletime)
are looked up in the newest generation of each other namespace of its family and
tenant, nearest first (the fewest differing ingredients, as ``casfs explain``
orders them), at most ``MAX_NAMESPACES`` of them. Each namespace's entry names
come from a node-local cache of its manifests (casfs.index.entrynames), so a
namespace costs one record read when nothing was published to it since, and
only its new manifest parts otherwise. The entries are then given, greedily,
to the namespace holding most of those left: "31 of this job's 37 missed
entries exist in triton-ab12 (torch 2.12.1 here vs 2.13.0); 6 were compiled in
no other namespace of this root".

Used by ``casfs run`` (the summary's line and ``--report``: the job's misses) and
``casfs explain`` (the namespace's recent misses, from its outcome records).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from casfs import __version__, families
from casfs.cli.nearest import READS, Related, related
from casfs.errors import CasfsError
from casfs.fingerprint import Fingerprint
from casfs.index.entrynames import EntryNameIndex

MAX_NAMESPACES = 16  # namespaces of the family looked in, nearest first
BUDGET_S = 10.0  # no namespace is read past this (a cold node's first manifests)
SHOWN = 3  # namespaces named in the summary line
EXAMPLES = 5  # entry names given per namespace (and for "nowhere") in --report / --json


@dataclass
class Held:
    """Missed entries one other namespace holds (none held by a namespace listed before)."""

    where: Related
    entries: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {**self.where.as_dict(), "missed_entries": len(self.entries),
                "examples": self.entries[:EXAMPLES]}

    def describe(self) -> str:
        w = self.where
        if not w.known:
            why = "no ingredients recorded"
        else:
            why = ", ".join(f"{k} {a} here vs {b}" for k, a, b in w.differs) or "same ingredients"
        return f"{w.namespace} ({why})"


@dataclass
class MissCauses:
    family: str
    missed: int  # distinct entries looked up
    total: int  # entries the mount counted missed (more than ``missed`` past the name cap)
    held: list[Held] = field(default_factory=list)
    nowhere: list[str] = field(default_factory=list)
    checked: int = 0  # namespaces looked in
    namespaces: int = 0  # other namespaces of the family (and tenant) with a generation
    unreadable: int = 0  # of those looked in, namespaces whose generation could not be read
    parts_read: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"missed_entries": self.missed, "entries_missed": self.total,
                "elsewhere": [h.as_dict() for h in self.held],
                "nowhere": len(self.nowhere), "nowhere_examples": self.nowhere[:EXAMPLES],
                "namespaces_checked": self.checked, "namespaces": self.namespaces,
                "namespaces_unreadable": self.unreadable,
                "manifest_parts_read": self.parts_read, "seconds": round(self.seconds, 3)}

    def nowhere_where(self) -> str:
        if self.checked < self.namespaces or self.unreadable:
            return (f"in none of the {self.checked - self.unreadable} namespaces read"
                    f" (of {self.namespaces})")
        return "in no other namespace of this root"

    def line(self, whose: str = "this job's", when: str = "") -> str | None:
        """One line for the summary (None: no entry missed): "<n> of <whose> <N> missed
        entries<when> exist in ..."."""
        if not self.missed:
            return None
        noun = "entry" if self.missed == 1 and self.total <= 1 else "entries"
        of = (f"the first {self.missed} of {whose} {self.total} missed {noun}{when}"
              if self.total > self.missed  # past the name cap: the first ones named
              else f"{whose} {self.missed} missed {noun}{when}")
        if not self.held:
            return (f"{self.family}: {of} {'was' if noun == 'entry' else 'were'}"
                    f" compiled {self.nowhere_where()}")
        first, *more = self.held
        out = f"{self.family}: {len(first.entries)} of {of} exist in {first.describe()}"
        for h in more[:SHOWN - 1]:
            out += f"; {len(h.entries)} more in {h.describe()}"
        rest = sum(len(h.entries) for h in more[SHOWN - 1:])
        if rest:
            out += f"; {rest} more in {len(more) - SHOWN + 1} other namespaces"
        if self.nowhere:
            out += (f"; {len(self.nowhere)} {'was' if len(self.nowhere) == 1 else 'were'}"
                    f" compiled {self.nowhere_where()}")
        return out


def entry_index(gens: Any, family: str, state_dir: Path | None) -> EntryNameIndex:
    return EntryNameIndex(state_dir / "entrynames" if state_dir is not None else None, gens,
                          f"{family}@{__version__}", families.rules(family).entry_of)


def causes(gens: Any, fp: Fingerprint, missed: list[str], *, tenant: str | None,
           state_dir: Path | None, total: int | None = None,
           budget_s: float = BUDGET_S, index: EntryNameIndex | None = None,
           latest: dict[str, Any] | None = None, exclude: str | None = None) -> MissCauses:
    """Where each of ``missed`` (entry names) exists among the family's other namespaces,
    the nearest first; none is read once ``budget_s`` seconds have passed.

    ``casfs report`` asks for many namespaces at once: it passes one ``index`` per
    family (from the node's cache: a namespace read once), the newest records it read
    (``latest``) and the namespace whose misses these are (``exclude``: its own
    generations are not "another namespace", whatever its ingredients)."""
    t0 = time.monotonic()
    names = list(dict.fromkeys(missed))
    out = MissCauses(fp.family, len(names), max(total or 0, len(names)))
    if not names:
        return out
    _, others = related(gens, fp, tenant, limit=1 << 30, latest=latest, exclude=exclude)
    out.namespaces = len(others)
    if index is None:
        index = entry_index(gens, fp.family, state_dir)
    parts_before = index.parts_read
    holding: list[tuple[Related, set[str]]] = []
    todo = others[:MAX_NAMESPACES]

    def read(r: Related) -> set[str] | bool:
        """What ``r`` holds of ``names``; False: not read (past the budget); True:
        unreadable (damaged, collected meanwhile, another tenant's 0700)."""
        if time.monotonic() - t0 > budget_s:
            return False
        try:
            return set(index.names(r.record).holding(names))
        except (CasfsError, OSError):
            return True

    # READS at a time, nearest first (a cold node reads each one's manifest: at 20 ms RTT
    # 16 one after the other held `casfs run`'s exit ~0.3 s); past the budget none starts.
    if len(todo) < 2:
        results = [read(r) for r in todo]
    else:
        with ThreadPoolExecutor(min(READS, len(todo)), thread_name_prefix="casfs-causes") as pool:
            results = list(pool.map(read, todo))
    for r, held in zip(todo, results, strict=True):
        if held is False:
            continue
        out.checked += 1
        if held is True:
            out.unreadable += 1  # said as "of N read"
        elif held:
            holding.append((r, held))
    left = set(names)
    while holding:
        holding.sort(key=lambda rh: -len(rh[1] & left))  # stable: nearest first on ties
        r, held = holding.pop(0)
        got = [n for n in names if n in held and n in left]
        if not got:
            break
        out.held.append(Held(r, got))
        left.difference_update(got)
    out.nowhere = [n for n in names if n in left]
    out.parts_read = index.parts_read - parts_before
    out.seconds = time.monotonic() - t0
    return out
