"""Which cache paths are scratch by construction, and Triton's commit records.

Scratch names are never promoted nor published: they are temp files of an
atomic write, lock files, build directories or overlay whiteouts. Each rule
below cites where the client makes the name (triton 3.7.1, torch 2.13.0):

- ``tmp.pid_<pid>_<uuid4>/``: triton/runtime/cache.py ``FileCacheManager.put``
  writes each file into ``<KEY>/tmp.pid_{pid}_{uuid}/`` then ``os.replace``s
  it into ``<KEY>/`` and ``os.removedirs`` the temp dir. Older Triton wrote
  ``<file>.tmp.pid_<pid>_<uuid>`` files (comment in compiler/compiler.py).
- ``tmp.<uuid4>/``: torch/_inductor/triton_bundler.py writes bundled kernels
  to ``triton/<dev>/tmp.{uuid4}/`` and renames it onto ``<KEY>``; on failure
  ("Directory ... is not empty - skipping!") the temp dir stays behind.
- ``.<pid>.<tid>.tmp``: torch/_inductor/codecache.py ``write_atomic`` names
  its temp file ``f".{os.getpid()}.{threading.get_ident()}.tmp"`` beside the
  target, then renames it.
- ``locks/`` and ``*.lock``: codecache.py ``get_lock_dir()`` is
  ``<cache>/locks``; filelock files are ``<key>.lock`` there, and also under
  ``precompiled_headers/locks/`` and beside directories (``<dir>.lock``).
- ``*_CxxBuild/``: torch/_inductor/cpp_builder.py runs g++ with its working
  directory in ``f"{name}_{_BUILD_TEMP_DIR}"`` (``"CxxBuild"``), removed after.
- ``.wh.*``: OCI/overlayfs whiteout markers; they describe a layer, not a file.

Commit records: Triton's ``__grp__<name>.json`` is written last
(``put_group`` after every ``put`` in compiler/compiler.py) and is what makes
a kernel a hit, so it may be promoted only once every child it names is.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import posixpath
import re
from collections.abc import Iterable, Iterator

from casfs.fingerprint import check_family
from casfs.util.paths import is_valid_relpath

log = logging.getLogger(__name__)

GROUP_PREFIX = "__grp__"
_UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_BUNDLER_TMP_RE = re.compile(rf"tmp\.{_UUID4}")


def _is_scratch_component(name: str) -> bool:
    """Built-in rules for one path component (a directory rule covers its subtree)."""
    return (
        name.startswith("tmp.pid_")
        or ".tmp.pid_" in name
        or (name.startswith(".") and name.endswith(".tmp"))
        or name == "locks"
        or name.endswith(".lock")
        or name.endswith("_CxxBuild")
        or name.startswith(".wh.")
        or (name.startswith("tmp.") and _BUNDLER_TMP_RE.fullmatch(name) is not None)
    )


class ScratchRules:
    """Decides, per file, whether a relative cache path is scratch.

    The built-in rules apply to every family: an Inductor cache holds a
    Triton cache under ``triton/``, and the names are temp names in any tool.
    User patterns are fnmatch globs, tested against the whole relative path
    and against each component (so ``*.partial`` matches at any depth).
    """

    def __init__(self, family: str, extra_patterns: Iterable[str] = ()) -> None:
        self.family = check_family(family)
        self.extra_patterns = tuple(extra_patterns)
        self._extra_re: re.Pattern[str] | None = None
        if self.extra_patterns:
            self._extra_re = re.compile(
                "|".join(f"(?:{fnmatch.translate(p)})" for p in self.extra_patterns)
            )

    def is_scratch(self, relpath: str) -> bool:
        parts = relpath.split("/")
        if any(_is_scratch_component(part) for part in parts):
            return True
        extra = self._extra_re
        if extra is None:
            return False
        return extra.match(relpath) is not None or any(extra.match(p) for p in parts)


def is_group_file(relpath: str) -> bool:
    """True for a Triton commit record, ``<KEY>/__grp__<name>.json``."""
    name = posixpath.basename(relpath)
    return name.startswith(GROUP_PREFIX) and name.endswith(".json")


def group_children(relpath: str, data: bytes) -> list[str] | None:
    """Relative paths of the files a Triton group file names, or None if unusable.

    Triton 3.x stores absolute paths (``{"child_paths": {name: abs_path}}``),
    which differ between nodes mounting at different paths; the child always
    lives beside the group file in the same ``<KEY>`` directory, so it is
    mapped by basename. Anything Triton itself would treat as a miss
    (unparsable JSON, no ``child_paths``) gives None, as does a child whose
    name could escape the directory.
    """
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    child_paths = doc.get("child_paths")
    if not isinstance(child_paths, dict):
        return None
    directory = posixpath.dirname(relpath)
    children: set[str] = set()
    for path in child_paths.values():
        if not isinstance(path, str):
            return None
        name = posixpath.basename(path)
        child = posixpath.join(directory, name) if directory else name
        if not name or not is_valid_relpath(child):
            log.warning("group file %s names an unusable child %r", relpath, path[:200])
            return None
        children.add(child)
    return sorted(children)


def group_written_root(relpath: str, data: bytes) -> str | None:
    """The absolute cache root a Triton group file was written under, if consistent.

    Triton 3.x resolves the children by these absolute paths, so a group
    written under one root only hits when served at that same root: a caller
    compares the result with its mount point and warns when they differ.
    """
    children = group_children(relpath, data)
    if not children:
        return None
    child_paths = json.loads(data)["child_paths"]
    directory = posixpath.dirname(relpath)
    roots = set()
    for path in child_paths.values():
        suffix = "/" + posixpath.join(directory, posixpath.basename(path)).lstrip("/")
        if not path.startswith("/") or not path.endswith(suffix):
            return None
        roots.add(path[: -len(suffix)] or "/")
    return roots.pop() if len(roots) == 1 else None


def walk_files(top: str | os.PathLike[str], rules: ScratchRules) -> Iterator[tuple[str, str, bool]]:
    """(relpath, full path, is_scratch) of every file under ``top``.

    Scratch directories are not descended into: each is reported once, as
    itself, with is_scratch True (so callers can count what they skip).
    """
    top = os.fspath(top)
    for dirpath, dirnames, filenames in os.walk(top):
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
