"""casfs.store.entry.entries_of: manifest rows made entries without the dataclass's
__init__ (decoding 100,000s of rows): the very objects ``Entry(...)`` makes."""

from __future__ import annotations

import dataclasses

import pytest

from casfs.store import manifest
from casfs.store.entry import Entry, entries_of


def test_entries_of_rows_are_the_entries_the_constructor_makes() -> None:
    rows = [["a/b", "0" * 64, 0, 0o644, -5], ["c", "f" * 64, 1 << 40, 0o7777, 1 << 62]]
    fast = entries_of(rows)
    slow = [Entry(*r) for r in rows]
    assert fast == slow and [hash(e) for e in fast] == [hash(e) for e in slow]
    for a, b in zip(fast, slow, strict=True):
        assert type(a) is Entry
        for f in dataclasses.fields(Entry):  # every field set (a new field: this fails)
            assert getattr(a, f.name) == getattr(b, f.name), f.name
        with pytest.raises(dataclasses.FrozenInstanceError):
            a.size = 1  # type: ignore[misc]
    assert {f.name for f in dataclasses.fields(Entry)} == {
        "path", "digest", "size", "mode", "mtime_ns", "extras"}


def test_a_manifest_decodes_to_the_same_entries_either_way() -> None:
    es = [Entry(f"k{i:03d}/f", f"{i:064x}", i, 0o644, i) for i in range(300)]
    for version_rows in (es, [*es[:-1], Entry(es[-1].path, es[-1].digest, 1, 0o644, 1,
                                                {"cs": 2.5})]):
        kind, got = manifest.decode(manifest.encode(version_rows, "full"))
        assert kind == "full" and got == version_rows
