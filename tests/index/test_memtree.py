"""Lazy ingest: a generation served from memory answers exactly as its LMDB rows do."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from casfs.index.memtree import MemLowerTree, StagedLowerTree
from casfs.index.node_index import NodeIndex
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot
from casfs.view.lower import DIR

T = 1_700_000_000_000_000_000


def put(root: SharedRoot, path: str, data: bytes, extras: dict[str, object] | None = None,
        ) -> Entry:
    return Entry(path, root.objects.put_bytes(data).digest, len(data), 0o644, T, extras)


def published(tmp_path: Path) -> tuple[SharedRoot, list[str]]:
    """A namespace of a base and two deltas: nested dirs, a replaced path, relocate/pack extras."""
    root = SharedRoot.open(tmp_path / "root", create=True)
    gens = root.generations()
    gens.publish("ns", [put(root, "a/b/c.json", b"c"), put(root, "a/d.so", b"d"),
                        put(root, "top", b"t"),
                        put(root, "x/idx.py", b"v1", {"replace": True}),
                        put(root, "g/__grp__k.json", b"{}", {"relocate": 2})],
                 node="n1", requires=["replace"])
    gens.publish("ns", [put(root, "a/b/e", b"e"), put(root, "z/y/w/v", b"deep"),
                        put(root, "p", b"p", {"pack": "junk-not-a-location"})], node="n2")
    gens.publish("ns", [put(root, "x/idx.py", b"v2, newer", {"replace": True})], node="n3",
                 requires=["replace"])
    paths = ["", "a", "a/b", "a/b/c.json", "a/b/e", "a/d.so", "top", "x", "x/idx.py", "g",
             "g/__grp__k.json", "z", "z/y", "z/y/w", "z/y/w/v", "p", "nope", "a/nope",
             "top/under-a-file", "a/b/c.json/x"]
    return root, paths


@contextlib.contextmanager
def both_trees(tmp_path: Path, root: SharedRoot) -> Iterator[tuple[MemLowerTree, Any]]:
    """The newest generation of "ns" in memory and as LMDB rows."""
    gens = root.generations()
    _, rec, snap = gens.newest_valid("ns")
    assert rec is not None
    ix = NodeIndex.open(tmp_path / "state")
    try:
        for part in rec.parts:
            ix.add_entries("ns", rec.seq, gens.part_entries(part))
        yield MemLowerTree(snap.entries, snap.dirs), ix.lower_tree("ns", rec.seq)
    finally:
        ix.close()


def test_memory_tree_answers_as_lmdb_rows_do(tmp_path: Path) -> None:
    root, paths = published(tmp_path)
    gens = root.generations()
    _, rec, _ = gens.newest_valid("ns")
    assert rec is not None and len(rec.parts) > 1  # several parts, merged
    with both_trees(tmp_path, root) as (mem, db):
        for p in paths:
            assert mem.lookup(p) == db.lookup(p), p
            assert list(mem.children(p)) == list(db.children(p)), p
        assert list(mem.walk()) == list(db.walk())
        idx = mem.lookup("x/idx.py")
        assert isinstance(idx, Entry) and idx.size == len(b"v2, newer")  # newest version
        grp = mem.lookup("g/__grp__k.json")
        assert isinstance(grp, Entry) and grp.extras == {"relocate": 2}
        assert mem.lookup("p") == db.lookup("p") and mem.lookup("p").extras is None  # type: ignore[union-attr]


def test_memory_tree_is_a_copy(tmp_path: Path) -> None:
    """A later publication advances the GenerationStore's Snapshot in place: not the tree."""
    root, _ = published(tmp_path)
    gens = root.generations()
    _, _, snap = gens.newest_valid("ns")
    mem = MemLowerTree(snap.entries, snap.dirs)
    gens.publish("ns", [put(root, "new/file", b"n")], node="n4")
    gens.newest_valid("ns")
    assert "new/file" in snap.entries  # advanced in place ...
    assert mem.lookup("new/file") is None and mem.lookup("new") is None  # ... the tree not


def test_staged_tree_switches_to_lmdb(tmp_path: Path) -> None:
    root, _ = published(tmp_path)
    gens = root.generations()
    _, rec, snap = gens.newest_valid("ns")
    assert rec is not None
    ix = NodeIndex.open(tmp_path / "state")
    try:
        staged = StagedLowerTree(ix.lower_tree("ns", rec.seq), MemLowerTree(snap.entries,
                                                                              snap.dirs))
        assert staged.staged and not staged.indexed.is_set()
        assert staged.lookup("a/b/e") is not None  # from memory: no row written yet
        assert ix.lower_tree("ns", rec.seq).lookup("a/b/e") is None
        for part in rec.parts:
            ix.add_entries("ns", rec.seq, gens.part_entries(part))
        staged.finish()
        assert not staged.staged and staged.indexed.is_set()
        assert staged.lookup("a/b/e") == ix.lower_tree("ns", rec.seq).lookup("a/b/e")
        staged.max_seq = rec.seq + 1  # refresh raises the LMDB tree's seq
        assert staged.max_seq == rec.seq + 1
        assert [n for n, _ in staged.children("")] == ["a", "g", "p", "top", "x", "z"]
        assert staged.lookup("z") is DIR
    finally:
        ix.close()


def test_memory_walk_is_the_listing_walks_order(tmp_path: Path) -> None:
    """The sorted walk visits files depth first in name order, as a walk by listings and
    LMDB's rows do: names sorting around "/" ('-' and '.' before it, 'b' after) too."""
    from casfs.index.tree import walk

    root = SharedRoot.open(tmp_path / "root", create=True)
    gens = root.generations()
    names = ["a.b", "a/c", "a-b/x", "a/b.c", "a/b/d", "ab", "a/b-", "a0/z", "A/q", "a/b/c/e"]
    gens.publish("ns", [put(root, n, n.encode()) for n in names], node="n1")
    with both_trees(tmp_path, root) as (mem, db):
        got = [e.path for e in mem.walk()]
        assert got == [e.path for e in walk(mem, "")] == [e.path for e in db.walk()]
        assert got.index("a/c") < got.index("a-b/x") < got.index("a.b")  # not string order
        assert sorted(got) == sorted(names)
        assert [e.path for e in mem.walk("a")] == [e.path for e in walk(mem, "a")] == \
            ["a/b/c/e", "a/b/d", "a/b-", "a/b.c", "a/c"]
        assert [e.path for e in mem.walk()] == got  # again, from the kept order
