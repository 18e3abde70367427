"""A manifest entry: one published file of a namespace."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Manifests hold an mtime as signed 64-bit nanoseconds, and readers reject any
# other (casfs.store.manifest): a file dated past 2262 (or before 1677) cannot be
# published, and one such row would make its whole generation unreadable.
MTIME_NS_LIMIT = 1 << 63


def mtime_storable(mtime_ns: int) -> bool:
    """Whether a manifest can hold ``mtime_ns`` (what readers accept)."""
    return -MTIME_NS_LIMIT < mtime_ns < MTIME_NS_LIMIT


# Extras key: seconds the entry took to compile where it was first made (an estimate,
# docs/format.md "cs"); set on one row per entry (its commit record, or its last file).
COMPILE_SECONDS = "cs"
COMPILE_SECONDS_MAX = 7 * 86400  # a figure above a week is no compile time: ignored


def compile_seconds(e: Entry) -> float | None:
    """The row's ``cs``: a number of seconds in [0, a week], else None (absent, or not
    a figure: ignored, never damage; the row serves as any other)."""
    x = e.extras
    if not x:
        return None
    v = x.get(COMPILE_SECONDS)
    if not (type(v) is int or type(v) is float):  # no bools (type is not int)
        return None
    f = float(v)
    return f if 0 <= f <= COMPILE_SECONDS_MAX else None  # NaN: no comparison holds


@dataclass(frozen=True, slots=True)
class Entry:
    """A regular file in a generation.

    ``path`` is relative and normalised (see casfs.util.paths); ``digest`` is the
    blake3-256 hex digest of the uncompressed content; ``mode`` holds permission
    bits only (``st_mode & 0o7777``); ``mtime_ns`` is the file's mtime at promotion.
    ``extras`` is the optional per-entry dict of a v2 manifest row (keys listed
    in docs/format.md); None when the row has none. It takes part in equality
    but not in the hash (a dict is not hashable).
    """

    path: str
    digest: str
    size: int
    mode: int
    mtime_ns: int
    extras: dict[str, Any] | None = field(default=None, hash=False)


# Entries made without the frozen dataclass's __init__ (six object.__setattr__ calls
# an entry: half the cost of decoding a manifest's 100,000 rows): each field's slot
# set directly. For rows already checked (casfs.store.manifest); the same objects
# as ``Entry(...)`` (tests/store/test_entry_rows.py compares them, field by field).
_new = object.__new__
_SET_PATH, _SET_DIGEST, _SET_SIZE, _SET_MODE, _SET_MTIME, _SET_EXTRAS = (
    Entry.__dict__[f].__set__ for f in ("path", "digest", "size", "mode", "mtime_ns", "extras"))


def entries_of(rows: list[list[Any]]) -> list[Entry]:
    """``Entry(path, digest, size, mode, mtime_ns)`` of each 5-element row, no extras."""
    out: list[Entry] = []
    add = out.append
    for p, d, s, m, t in rows:
        e = _new(Entry)
        _SET_PATH(e, p)
        _SET_DIGEST(e, d)
        _SET_SIZE(e, s)
        _SET_MODE(e, m)
        _SET_MTIME(e, t)
        _SET_EXTRAS(e, None)
        add(e)
    return out
