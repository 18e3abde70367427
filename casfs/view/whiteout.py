"""How deletions of lower entries are recorded in the upper directory.

casfs follows the OCI image-layer convention, so an upper directory can be
read by anything that understands container layers:

* ``<dir>/.wh.<name>``: an empty marker file. It hides the lower entry
  ``<dir>/<name>`` (file or directory, with everything below it).
* ``<dir>/.wh..wh..opq``: the upper ``<dir>`` is opaque: every lower child of
  ``<dir>`` (at any depth) is hidden. Written when a lower directory is removed
  and re-created, and when a directory is moved (a moved tree is copied up
  whole, so at its new place it must not merge with lower entries).
* ``<upper>/.wh..wh.casfs.work/``: staging for copy-up; emptied at start.

Every name starting with ``.wh.`` is metadata: never shown through the mount,
refused on create (EPERM), never promoted. An upper entry shadows the lower
entry of the same path; a whiteout next to an upper entry of the same name is
harmless (the upper entry wins and the lower one stays hidden).

This module is pure: the merge of one directory's listing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

WH_PREFIX = ".wh."
OPAQUE = ".wh..wh..opq"
WORK_DIR = ".wh..wh.casfs.work"

T = TypeVar("T")
U = TypeVar("U")


def is_reserved(name: str) -> bool:
    """True for names that are overlay metadata (never visible, never creatable)."""
    return name.startswith(WH_PREFIX)


def whiteout_name(name: str) -> str:
    """The marker that hides lower ``name`` in the same directory."""
    return WH_PREFIX + name


def merge_children(
    upper: Iterable[tuple[str, T]],
    lower: Iterable[tuple[str, U]],
    *,
    lower_hidden: Callable[[str], bool] = lambda _name: False,
) -> list[tuple[str, T | U]]:
    """Visible children of one merged directory, sorted by name, without duplicates.

    ``upper`` holds every name in the upper directory (markers included: they
    are interpreted here), ``lower`` the lower children; pass ``lower=()`` when
    the lower directory is hidden or the upper one is opaque. ``lower_hidden``
    hides further lower names (e.g. objects that failed to fetch).
    """
    merged: dict[str, T | U] = {}
    whiteouts: set[str] = set()
    for name, node in upper:
        if is_reserved(name):
            if name != OPAQUE:
                whiteouts.add(name[len(WH_PREFIX):])
            continue
        merged[name] = node
    for name, lnode in lower:
        if name in merged or name in whiteouts or is_reserved(name) or lower_hidden(name):
            continue
        merged[name] = lnode
    return sorted(merged.items())


def has_opaque_marker(upper_names: Iterable[str]) -> bool:
    return any(n == OPAQUE for n in upper_names)
