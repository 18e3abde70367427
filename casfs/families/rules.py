"""A family's rules with those of the families it includes, plus user patterns.

The one object promotion, publication, import and the view consult: which
names are scratch, which files are commit records (and what they name),
which paths are replaced and how, which files bear absolute paths.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from casfs.families.base import (
    CommitRecord,
    Family,
    PathBearing,
    ReplacedPath,
    ReplaceRule,
    too_large_to_parse,
)
from casfs.util import beneath, noatime


class CacheRules:
    """Decides, per relative cache path, what the family says about it.

    User patterns are fnmatch globs, tested against the whole relative path
    and against each component (so ``*.partial`` matches at any depth).
    """

    def __init__(self, families: list[Family], extra_patterns: Iterable[str] = ()) -> None:
        self.family = families[0].name
        self.families = tuple(families)
        self._scratch: tuple[Callable[[str], bool], ...] = tuple(
            f.scratch for f in families if f.scratch is not None)
        self.commit_records: tuple[CommitRecord, ...] = tuple(
            r for f in families for r in f.commit_records)
        self.replaced: tuple[ReplacedPath, ...] = tuple(r for f in families for r in f.replaced)
        self.path_bearing: tuple[PathBearing, ...] = tuple(
            p for f in families for p in f.path_bearing)
        self.extra_patterns = tuple(extra_patterns)
        self._extra_re: re.Pattern[str] | None = None
        if self.extra_patterns:
            self._extra_re = re.compile(
                "|".join(f"(?:{fnmatch.translate(p)})" for p in self.extra_patterns))

    # --- scratch -------------------------------------------------------------
    def is_scratch(self, relpath: str) -> bool:
        parts = relpath.split("/")
        if any(rule(part) for part in parts for rule in self._scratch):
            return True
        extra = self._extra_re
        if extra is None:
            return False
        return extra.match(relpath) is not None or any(extra.match(p) for p in parts)

    # --- commit records ------------------------------------------------------
    def commit_record(self, relpath: str) -> CommitRecord | None:
        for r in self.commit_records:
            if r.matches(relpath):
                return r
        return None

    def is_commit_record(self, relpath: str) -> bool:
        return self.commit_record(relpath) is not None

    def record_children(self, relpath: str, data: bytes) -> list[str] | None:
        """What a commit record names (relative paths), or None if it is unusable
        (a record past ``MAX_PARSED_BYTES`` is, unparsed)."""
        r = self.commit_record(relpath)
        if r is None or too_large_to_parse(len(data)):
            return None
        return r.children(relpath, data)

    # --- replaced paths ------------------------------------------------------
    def replace_rule(self, relpath: str) -> ReplaceRule | None:
        """None: first-writer-wins (the default for every path no family names)."""
        for r in self.replaced:
            if r.matches(relpath):
                return r.rule
        return None

    # --- entries ---------------------------------------------------------------
    def entry_of(self, relpath: str) -> str | None:
        """The entry ``relpath`` belongs to (its id: a relative path), or None.

        The family's own rule (``Family.entry_of``, which knows the families it
        includes), else one entry per path. Scratch names are no entry's.
        """
        rule = self.families[0].entry_of
        if rule is None:
            return None if not relpath or self.is_scratch(relpath) else relpath
        return rule(relpath)

    # --- path-bearing files --------------------------------------------------
    def path_bearer(self, relpath: str) -> PathBearing | None:
        for p in self.path_bearing:
            if p.matches(relpath):
                return p
        return None


class Relocator:
    """Presents a family's path-bearing files, stored path-free, for a serving root.

    An entry is presented when its manifest row says how many paths it holds
    (extras ``relocate``, set at publication); its presented size then follows
    from the stored size alone, so a lookup needs no object. Anything else is
    served as stored.
    """

    def __init__(self, rules: CacheRules, root: str) -> None:
        self.rules = rules
        self.root = root

    def _count(self, entry: Any) -> int | None:
        n = (entry.extras or {}).get("relocate")
        return n if type(n) is int and n > 0 else None

    def size(self, entry: Any) -> int | None:
        """The presented size, or None if ``entry`` is served as stored."""
        n = self._count(entry)
        bearer = self.rules.path_bearer(entry.path) if n else None
        if n is None or bearer is None:
            return None
        return bearer.present_size(entry.size, n, self.root)

    def content(self, entry: Any, stored: bytes) -> bytes | None:
        """The presented bytes; None if ``stored`` does not match what ``size`` promised."""
        size = self.size(entry)
        bearer = self.rules.path_bearer(entry.path)
        if size is None or bearer is None:
            return stored
        shown = bearer.present(entry.path, stored, self.root)
        return shown if shown is not None and len(shown) == size else None


def walk_files(top: str | os.PathLike[str], rules: CacheRules, base: int | None = None,
               ) -> Iterator[tuple[str, str, bool]]:
    """(relpath, full path, is_scratch) of every file under ``top``.

    Scratch directories are not descended into: each is reported once, as
    itself, with is_scratch True (so callers can count what they skip).
    ``base``: an fd of ``top`` (casfs.util.beneath.open_base), for a directory a
    tenant can write: each directory is opened beneath it, no symlink followed
    and no mount point crossed, and symlinks are listed with the files.
    """
    top = os.fspath(top)
    opendir = None if base is None else functools.partial(_open_beneath, base, top)
    for dirpath, dirnames, filenames in noatime.walk(top, opendir):
        rel_dir = os.path.relpath(dirpath, top)
        rel_dir = "" if rel_dir == "." else rel_dir
        for name in list(dirnames):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if rules.is_scratch(rel):
                dirnames.remove(name)
                yield rel, os.path.join(dirpath, name), True
        for name in filenames:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            yield rel, os.path.join(dirpath, name), rules.is_scratch(rel)


def _open_beneath(base: int, top: str, dirpath: str) -> int:
    rel = os.path.relpath(dirpath, top)
    if rel == ".":  # the base itself, opened again for reading (it is O_PATH)
        return noatime.open_noatime(f"/proc/self/fd/{base}", noatime.DIR_FLAGS)
    return beneath.open_read(base, rel, os.O_DIRECTORY)
