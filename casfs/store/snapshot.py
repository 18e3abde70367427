"""Snapshots: the merged entries of one generation, and the one rule that merges them.

The snapshot of a record is the union of its base and every delta, in order
(docs/format.md, "Generation records"). Publication is first-writer-wins, so a
path appears once, except a *replaced* path (casfs.store.record.is_replace): a
later part's row overrides an earlier row of the same path. Any other
duplicate, and a path that is both a file and a directory, is damage
(HostileManifestError).

``merge_part`` is that rule, written once. casfs.store.generations merges
through it both when it builds a snapshot whole (``GenerationStore.snapshot``)
and when it advances a snapshot it holds by a newer record's new deltas
(``GenerationStore._snapshot_of``), so the two give the same entries.

Layering: above casfs.store.record and casfs.store.entry; below
casfs.store.generations.
"""

from __future__ import annotations

from collections.abc import Iterable

from casfs.errors import HostileManifestError
from casfs.store.entry import Entry
from casfs.store.record import Record, is_replace
from casfs.util.paths import ancestor_dirs, parent_dirs


class Snapshot:
    """The merged entries of one generation (path -> Entry) and its directories."""

    def __init__(self, record: Record | None, entries: dict[str, Entry]) -> None:
        self.record = record
        self.entries = entries
        self._dirs: set[str] | None = None

    @property
    def dirs(self) -> set[str]:
        if self._dirs is None:
            self._dirs = ancestor_dirs(self.entries)
        return self._dirs


def merge_part(entries: dict[str, Entry], rows: Iterable[Entry], where: str,
               dirs: set[str] | None = None) -> None:
    """Merge one manifest part's ``rows`` into ``entries`` (in place), after the parts before it.

    A new path is added; a row of a replaced path overrides the same path's
    earlier row (the newer version wins); any other duplicate is damage.
    With ``dirs`` (the directories of ``entries`` so far, kept up to date
    here) each new path is checked against the tree as it goes: advancing a
    held snapshot by a few deltas. Without, the caller checks the whole tree
    once at the end (``check_tree``): cheaper for a full build.
    ``where`` ("ns@seq") names the generation in the errors.
    """
    have = entries.get
    for e in rows:
        path = e.path
        if have(path) is not None:
            if not is_replace(e):
                raise HostileManifestError(f"generation {where}: {path!r} appears twice")
            entries[path] = e  # a newer version of a replaced path: the same path, no new dirs
            continue
        if dirs is not None:
            parents = parent_dirs(path)
            if path in dirs or any(d in entries for d in parents):
                raise HostileManifestError(
                    f"generation {where}: {path!r} is a file and a directory")
            dirs.update(parents)
        entries[path] = e


def check_tree(snap: Snapshot, where: str) -> None:
    """No path of ``snap`` is both a file and a directory (a full build's check, at its end)."""
    for d in snap.dirs:
        if d in snap.entries:
            raise HostileManifestError(f"generation {where}: {d!r} is a file and a directory")
