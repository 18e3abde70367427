"""Validation of the relative paths stored in manifests.

Every path that comes out of the shared root is hostile until checked: a
manifest is written by other nodes, other versions, or damaged storage. A
valid path is relative, already normalised (no '.', '..' or empty parts, no
leading or trailing '/', no '//'), free of NUL and control characters, and
within the usual Linux name and path length limits.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from casfs.errors import HostileManifestError

NAME_MAX = 255
PATH_MAX = 4095


# The common case, decided by one regex (manifests hold 100,000s of paths):
# ASCII components of ordinary characters, none starting with '.', each at
# most NAME_MAX bytes. Anything else takes the full checks below.
_PLAIN = re.compile(
    r"[A-Za-z0-9_+=,@%-][A-Za-z0-9._+=,@%-]{0,254}(?:/[A-Za-z0-9_+=,@%-][A-Za-z0-9._+=,@%-]{0,254})*"
)
# Many plain paths joined by newlines (which _PLAIN never matches): one C-level match
# for a whole manifest; a miss means "check each path" (check_relpath says which).
_PLAIN_LINES = re.compile(rf"(?:{_PLAIN.pattern}\n)*{_PLAIN.pattern}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_relpath(path: object) -> str:
    """Return ``path`` if it is a safe, normalised relative path; raise otherwise."""
    if isinstance(path, str) and len(path) <= PATH_MAX and _PLAIN.fullmatch(path):
        return path
    if not isinstance(path, str):
        raise HostileManifestError(f"path is not a string: {path!r:.80}")
    if not path:
        raise HostileManifestError("empty path")
    try:
        encoded = path.encode("utf-8", "surrogateescape")  # escapes: a name's raw bytes
    except UnicodeEncodeError:  # JSON "\ud800": no file system name is that
        raise HostileManifestError(f"path holds a lone surrogate: {path!r:.80}") from None
    if len(encoded) > PATH_MAX:
        raise HostileManifestError(f"path too long: {path[:80]!r}...")
    if "\0" in path:
        raise HostileManifestError(f"path contains NUL: {path!r:.80}")
    if _CONTROL.search(path):
        raise HostileManifestError(f"path contains a control character: {path!r:.80}")
    if path.startswith("/"):
        raise HostileManifestError(f"absolute path: {path!r:.80}")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise HostileManifestError(f"path is not normalised or escapes the tree: {path!r:.80}")
        if len(part.encode("utf-8", "surrogateescape")) > NAME_MAX:
            raise HostileManifestError(f"path component too long: {part[:80]!r}...")
    return path


def all_plain(paths: list[str]) -> bool:
    """True if every item is a string ``check_relpath`` accepts by its plain-path regex.

    False does not mean invalid: the caller then checks each path itself.
    """
    try:
        joined = "\n".join(paths)
    except TypeError:  # not all strings
        return False
    # A newline inside a path would pass as two plain paths: count the separators.
    if joined.count("\n") != len(paths) - 1 or _PLAIN_LINES.fullmatch(joined) is None:
        return False
    return not paths or max(map(len, paths)) <= PATH_MAX


def is_valid_relpath(path: object) -> bool:
    try:
        check_relpath(path)
    except HostileManifestError:
        return False
    return True


def parent_dirs(path: str) -> list[str]:
    """All ancestor directories of a relative path, shortest first ('a/b/c' -> ['a', 'a/b'])."""
    out = []
    i = path.find("/")
    while i != -1:  # str.find, not split+join: this runs for every entry of a manifest
        out.append(path[:i])
        i = path.find("/", i + 1)
    return out


def ancestor_dirs(paths: Iterable[str]) -> set[str]:
    """Every ancestor directory of the given relative paths ('a/b/c' gives 'a', 'a/b').

    One ``rfind`` per path and one step per directory not seen yet: a set of
    ``parent_dirs`` would cost a list per path (100,000s in a manifest).
    """
    out: set[str] = set()
    add = out.add
    for p in paths:
        i = p.rfind("/")
        while i > 0:
            d = p[:i]
            if d in out:
                break  # its ancestors were added with it
            add(d)
            i = d.rfind("/")
    return out
