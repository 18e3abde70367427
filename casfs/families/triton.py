"""Triton (``TRITON_CACHE_DIR``), triton 3.x.

Layout: one directory per kernel key (52 base32 characters) holding
``.source .ttir .ttgir .llir .ptx .cubin .json`` and ``__grp__<name>.json``,
the commit record, written last; launchers (``cuda_utils*.so``) at the top.

Scratch (triton/runtime/cache.py ``FileCacheManager.put``): each file is
written into ``<KEY>/tmp.pid_<pid>_<uuid4>/`` then ``os.replace``d into
``<KEY>/``; older Triton wrote ``<file>.tmp.pid_<pid>_<uuid>`` files.

Commit records and relocation: ``put_group`` writes
``{"child_paths": {name: absolute path}}`` after every child. The children
always live beside the group file, so they are mapped by basename; casfs
stores the group with paths relative to the cache root (``casfs:`` prefix)
and presents it with the serving root's absolute paths, so a cache
published at one path hits at any other.
"""

from __future__ import annotations

import functools
import json
import logging
import posixpath
import re

from casfs.families.base import Family, common_scratch, too_large_to_parse
from casfs.util.paths import is_valid_relpath

log = logging.getLogger(__name__)

GROUP_PREFIX = "__grp__"
# Stored group files name their children relative to the cache root with this
# prefix: never an absolute path, so Triton itself would miss on the raw form.
RELATIVE_PREFIX = "casfs:"


def is_scratch(name: str) -> bool:
    return name.startswith("tmp.pid_") or ".tmp.pid_" in name or common_scratch(name)


def is_group_file(relpath: str) -> bool:
    """True for a Triton commit record, ``<KEY>/__grp__<name>.json``."""
    name = relpath.rpartition("/")[2]  # posixpath.basename, without its overhead
    return name.startswith(GROUP_PREFIX) and name.endswith(".json")


# Promotion and publication parse each group file 4-6 times (group check, path-free
# form, relocation count, group consistency): parses of small ones are cached.
_CACHED_BELOW = 64 << 10


def _child_paths(data: bytes) -> dict[str, str] | None:
    paths = _parsed_child_paths(data)
    return dict(paths) if paths is not None else None  # a copy: the parse is cached


def _parsed_child_paths(data: bytes) -> dict[str, str] | None:
    if type(data) is bytes and len(data) < _CACHED_BELOW:  # hashable, bounded
        return _parse_child_paths_cached(data)
    return _parse_child_paths(data)


def _parse_child_paths(data: bytes) -> dict[str, str] | None:
    if too_large_to_parse(len(data)):
        return None  # no group file Triton writes is this large: not in the format
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):  # deep nesting: damaged too
        return None
    if not isinstance(doc, dict):
        return None
    paths = doc.get("child_paths")
    if not isinstance(paths, dict) or not all(isinstance(p, str) for p in paths.values()):
        return None
    return paths


_parse_child_paths_cached = functools.lru_cache(maxsize=1024)(_parse_child_paths)


def group_children(relpath: str, data: bytes) -> list[str] | None:
    """Relative paths of the files a group file names, or None if unusable.

    Absolute paths (as Triton writes them) and the stored ``casfs:`` form both
    map by basename into the group's own directory. Anything Triton itself
    would treat as a miss (unparsable JSON, no ``child_paths``) gives None, as
    does a child whose name could escape the directory.
    """
    if type(data) is bytes and len(data) < _CACHED_BELOW:  # hashable, bounded
        children = _group_children_cached(relpath, data)
    else:
        children = _group_children(relpath, data)
    return list(children) if children is not None else None


def _group_children(relpath: str, data: bytes) -> tuple[str, ...] | None:
    paths = _parsed_child_paths(data)
    if paths is None:
        return None
    directory = posixpath.dirname(relpath)
    children: set[str] = set()
    for path in paths.values():
        name = posixpath.basename(path)
        child = posixpath.join(directory, name) if directory else name
        if not name or not is_valid_relpath(child):
            log.warning("group file %s names an unusable child %r", relpath, path[:200])
            return None
        children.add(child)
    return tuple(sorted(children))


_group_children_cached = functools.lru_cache(maxsize=1024)(_group_children)


def group_written_root(relpath: str, data: bytes) -> str | None:
    """The absolute cache root a group file was written under, if consistent."""
    if not group_children(relpath, data):
        return None
    paths = _child_paths(data)
    assert paths is not None
    directory = posixpath.dirname(relpath)
    roots = set()
    for path in paths.values():
        suffix = "/" + posixpath.join(directory, posixpath.basename(path)).lstrip("/")
        if not path.startswith("/") or not path.endswith(suffix):
            return None
        roots.add(path[: -len(suffix)] or "/")
    return roots.pop() if len(roots) == 1 else None


class GroupFiles:
    """Triton's ``__grp__*.json``: a commit record that is also path-bearing."""

    def matches(self, relpath: str) -> bool:
        return is_group_file(relpath)

    def children(self, relpath: str, data: bytes) -> list[str] | None:
        return group_children(relpath, data)

    def written_root(self, relpath: str, data: bytes) -> str | None:
        return group_written_root(relpath, data)

    def to_pathfree(self, relpath: str, data: bytes) -> bytes | None:
        children = group_children(relpath, data)
        paths = _child_paths(data)
        if not children or paths is None:
            return None
        directory = posixpath.dirname(relpath)
        rel = {k: RELATIVE_PREFIX + (posixpath.join(directory, posixpath.basename(v))
                                     if directory else posixpath.basename(v))
               for k, v in paths.items()}
        return json.dumps({"child_paths": rel}).encode()

    def count(self, relpath: str, data: bytes) -> int | None:
        paths = _child_paths(data)
        if not paths or not all(v.startswith(RELATIVE_PREFIX) for v in paths.values()):
            return None  # written by an older casfs or by hand: served as stored
        if group_children(relpath, data) is None:
            return None
        return len(paths)

    def present_size(self, stored_size: int, count: int, root: str) -> int:
        # Each "casfs:<rel>" becomes "<root>/<rel>"; json escapes a string char by
        # char, so the difference per path is the escaped root's length + 1 - 6.
        escaped = json.dumps(root.rstrip("/"))[1:-1]
        return stored_size + count * (len(escaped) + 1 - len(RELATIVE_PREFIX))

    def present(self, relpath: str, data: bytes, root: str) -> bytes | None:
        if self.count(relpath, data) is None:
            return None
        paths = _child_paths(data)
        assert paths is not None
        base = root.rstrip("/")
        # json.dumps as FileCacheManager.put_group writes it.
        return json.dumps({"child_paths": {
            k: f"{base}/{v[len(RELATIVE_PREFIX):]}" for k, v in paths.items()}}).encode()


GROUPS = GroupFiles()

# A kernel's key directory: base32 of a sha256 without padding (triton 3.x), or hex.
_KEY_RE = re.compile(r"[A-Z2-7]{52}|[0-9a-f]{64}")


def entry_of(relpath: str) -> str | None:
    """The kernel a path belongs to: its key directory (``<KEY>``, with every file in
    it and the group file that commits them); None above it and for launchers."""
    key = relpath.partition("/")[0]
    return key if _KEY_RE.fullmatch(key) else None

FAMILY = Family(
    name="triton",
    summary="Triton kernels (TRITON_CACHE_DIR)",
    env_vars=("TRITON_CACHE_DIR",),
    scratch=is_scratch,
    commit_records=(GROUPS,),
    path_bearing=(GROUPS,),
    entry_of=entry_of,
)
