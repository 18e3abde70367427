"""Validation of the relative paths stored in manifests.

Every path that comes out of the shared root is hostile until checked: a
manifest is written by other nodes, other versions, or damaged storage. A
valid path is relative, already normalised (no '.', '..' or empty parts, no
leading or trailing '/', no '//'), free of NUL and control characters, and
within the usual Linux name and path length limits.
"""

from __future__ import annotations

import re

from casfs.errors import HostileManifestError

NAME_MAX = 255
PATH_MAX = 4095


# The common case, decided by one regex (manifests hold 100,000s of paths):
# ASCII components of ordinary characters, none starting with '.', each at
# most NAME_MAX bytes. Anything else takes the full checks below.
_PLAIN = re.compile(
    r"[A-Za-z0-9_+=,@%-][A-Za-z0-9._+=,@%-]{0,254}(?:/[A-Za-z0-9_+=,@%-][A-Za-z0-9._+=,@%-]{0,254})*"
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_relpath(path: object) -> str:
    """Return ``path`` if it is a safe, normalised relative path; raise otherwise."""
    if isinstance(path, str) and len(path) <= PATH_MAX and _PLAIN.fullmatch(path):
        return path
    if not isinstance(path, str):
        raise HostileManifestError(f"path is not a string: {path!r:.80}")
    if not path:
        raise HostileManifestError("empty path")
    if len(path.encode("utf-8", "surrogateescape")) > PATH_MAX:
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
