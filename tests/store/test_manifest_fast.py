"""The column-wise manifest check accepts and refuses exactly what the row-wise one does."""

from __future__ import annotations

import json
from typing import Any

import pytest

from casfs.errors import HostileManifestError
from casfs.store import manifest
from casfs.util.paths import ancestor_dirs, parent_dirs

GOOD: list[Any] = ["a/b", "1" * 64, 3, 0o644, 5]


def doc(rows: list[Any], version: int = 2) -> bytes:
    return json.dumps({"casfs_manifest": version, "kind": "full", "entries": rows}).encode()


def rowwise(rows: list[Any], version: int) -> list[Any]:
    entries = [manifest._entry(r, version) for r in rows]
    manifest.check_tree(entries)
    return entries


@pytest.mark.parametrize("bad", [
    ["a/c", "A" * 64, 3, 0o644, 5], ["a/c", "1" * 63 + "g", 3, 0o644, 5],
    ["a/c", "1" * 63, 3, 0o644, 5], ["a/c", "1" * 65, 3, 0o644, 5],
    ["a/c", "1" * 64, True, 0o644, 5], ["a/c", "1" * 64, -1, 0o644, 5],
    ["a/c", "1" * 64, 3, 0o10000, 5], ["a/c", "1" * 64, 3, 0o644, 1 << 63],
    ["a/c", "1" * 64, 3.0, 0o644, 5], ["a//c", "1" * 64, 3, 0o644, 5],
    ["a/../c", "1" * 64, 3, 0o644, 5], ["/a/c", "1" * 64, 3, 0o644, 5],
    [7, "1" * 64, 3, 0o644, 5], ["a/c", 7, 3, 0o644, 5], ["a/c", "\u00e9" * 64, 3, 0o644, 5],
    ["a/c", "1" * 64, 3, 0o644, 5, {"Bad": 1}], ["a/c", "1" * 64, 3, 0o644], "a/c",
    ["a/c/" + "x" * 256, "1" * 64, 3, 0o644, 5], ["a\nb", "1" * 64, 3, 0o644, 5],
    ["a/c", "\ud800" * 64, 3, 0o644, 5], ["a/\ud800", "1" * 64, 3, 0o644, 5],
])
def test_refused_alike(bad: Any) -> None:
    rows = [GOOD, bad]
    with pytest.raises(HostileManifestError) as slow:
        rowwise(rows, 2)
    with pytest.raises(HostileManifestError) as fast:
        manifest.decode(doc(rows))
    assert fast.value.message == slow.value.message


@pytest.mark.parametrize("rows,version", [
    ([GOOD, ["a/c", "2" * 64, 0, 0, -5], ["b", "3" * 64, 1, 0o7777, 0]], 1),
    ([GOOD, ["a/c", "2" * 64, 1, 0o600, 7, {"pack": "x"}], ["d", "3" * 64, 1, 0, 0, {}]], 2),
    ([GOOD, ["b/.hidden", "2" * 64, 1, 0o600, 7]], 2),  # odd names take the row path
    ([], 1),
])
def test_accepted_alike(rows: list[Any], version: int) -> None:
    assert manifest.decode(doc(rows, version))[1] == rowwise(rows, version)


@pytest.mark.parametrize("rows", [[GOOD, ["a/b/c", "1" * 64, 1, 0, 0]],  # a file is a dir
                                  [["b", "1" * 64, 1, 0, 0], GOOD],  # unsorted
                                  [GOOD, GOOD]])  # duplicate
def test_tree_refused(rows: list[Any]) -> None:
    with pytest.raises(HostileManifestError):
        manifest.decode(doc(rows))


def test_ancestor_dirs() -> None:
    paths = ["a/b/c", "a/b/d", "a/e", "f", "g/h/i/j", "g/x"]
    assert ancestor_dirs(paths) == {d for p in paths for d in parent_dirs(p)}
    assert ancestor_dirs([]) == set()
