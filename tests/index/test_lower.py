from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs.index.node_index import NodeIndex
from casfs.store.entry import Entry
from casfs.view.lower import DIR, DictLowerTree, LowerTree

D1 = "11" * 32
D2 = "22" * 32


@pytest.fixture
def index(tmp_path: Path) -> Iterator[NodeIndex]:
    ix = NodeIndex.open(tmp_path)
    yield ix
    ix.close()


def e(path: str, digest: str = D1, size: int = 1) -> Entry:
    return Entry(path, digest, size, 0o644, 1_700_000_000_000_000_000)


def test_lookup_and_children(index: NodeIndex) -> None:
    index.add_entries("ns", 1, [e("a/b/c.json"), e("a/d.so", D2, 5), e("top")])
    tree: LowerTree = index.lower_tree("ns", 1)
    assert tree.lookup("") is DIR
    assert tree.lookup("a") is DIR
    assert tree.lookup("a/b") is DIR
    assert tree.lookup("a/d.so") == e("a/d.so", D2, 5)
    assert tree.lookup("a/nope") is None
    assert tree.lookup("a/b/c.json/x") is None
    assert list(tree.children("")) == [("a", DIR), ("top", e("top"))]
    assert list(tree.children("a")) == [("b", DIR), ("d.so", e("a/d.so", D2, 5))]
    assert list(tree.children("a/d.so")) == []
    assert list(tree.children("missing")) == []


def test_seq_filtering(index: NodeIndex) -> None:
    index.add_entries("ns", 1, [e("k1/a")])
    index.add_entries("ns", 2, [e("k1/b"), e("k2/c")])
    old = index.lower_tree("ns", 1)
    new = index.lower_tree("ns", 2)
    assert old.lookup("k2") is None and old.lookup("k2/c") is None and old.lookup("k1/b") is None
    assert [n for n, _ in old.children("")] == ["k1"]
    assert [n for n, _ in old.children("k1")] == ["a"]
    assert [n for n, _ in new.children("")] == ["k1", "k2"]
    assert new.lookup("k2/c") == e("k2/c")


def test_out_of_order_ingest_lowers_directory_seq(index: NodeIndex) -> None:
    index.add_entries("ns", 5, [e("d/late")])
    index.add_entries("ns", 2, [e("d/early")])
    tree = index.lower_tree("ns", 2)
    assert tree.lookup("d") is DIR
    assert [n for n, _ in tree.children("d")] == ["early"]


def test_tree_sees_entries_added_after_it_was_made(index: NodeIndex) -> None:
    tree = index.lower_tree("ns", 10)
    assert tree.lookup("x/y") is None
    index.add_entries("ns", 3, [e("x/y")])
    assert tree.lookup("x/y") == e("x/y")


def test_first_writer_wins_and_idempotence(index: NodeIndex) -> None:
    r1 = index.add_entries("ns", 1, [e("a/f", D1), e("g")])
    assert (r1.added, r1.kept, r1.conflicts) == (2, 0, 0)
    r2 = index.add_entries("ns", 2, [e("a/f", D1), e("a/f2", D1)])
    assert (r2.added, r2.kept, r2.conflicts) == (1, 1, 0)
    r3 = index.add_entries("ns", 3, [e("a/f", D2, 9), e("a", D2), e("g/under-a-file")])
    assert (r3.added, r3.kept, r3.conflicts) == (0, 0, 3)
    tree = index.lower_tree("ns", 3)
    assert tree.lookup("a/f") == e("a/f", D1)
    assert tree.lookup("a") is DIR
    assert tree.lookup("g") == e("g")
    assert tree.lookup("g/under-a-file") is None


def test_invalid_paths_are_refused(index: NodeIndex) -> None:
    r = index.add_entries("ns", 1, [e("../escape"), e("/abs"), e("a//b"), e("ok")])
    assert (r.added, r.invalid) == (1, 3)
    assert [n for n, _ in index.lower_tree("ns", 1).children("")] == ["ok"]


def test_namespaces_are_isolated(index: NodeIndex) -> None:
    index.add_entries("a", 1, [e("f")])
    index.add_entries("ab", 1, [e("g")])
    assert [n for n, _ in index.lower_tree("a", 1).children("")] == ["f"]
    assert index.lower_tree("ab", 1).lookup("f") is None
    index.set_ns_state("a", {"seq": 1})
    assert index.drop_namespace("a") == 1
    assert index.lower_tree("a", 1).lookup("f") is None
    assert index.ns_state("a") is None
    assert index.lower_tree("ab", 1).lookup("g") == e("g")


def test_large_directory_listed_across_batches_in_name_order(index: NodeIndex) -> None:
    names = [f"kernel-{i:05d}.cubin" for i in range(1300)]
    index.add_entries("ns", 1, [e(f"d/{n}") for n in reversed(names)])
    assert [n for n, _ in index.lower_tree("ns", 1).children("d")] == names


def test_long_paths_use_hashed_parents(index: NodeIndex) -> None:
    deep = "/".join(f"{i:02d}" + "d" * 150 for i in range(20))  # ~3 KB of directories
    index.add_entries("ns", 1, [e(f"{deep}/f.bin"), e(f"{deep}/g.bin")])
    tree = index.lower_tree("ns", 1)
    assert tree.lookup(f"{deep}/f.bin") == e(f"{deep}/f.bin")
    assert [n for n, _ in tree.children(deep)] == ["f.bin", "g.bin"]
    assert [x.path for x in tree.walk()] == [f"{deep}/f.bin", f"{deep}/g.bin"]


def test_matches_the_in_memory_reference(index: NodeIndex) -> None:
    entries = [
        e(f"{a}/{b}/{c}", D1 if (a + b + c) % 2 else D2, a * b + c)
        for a in range(4) for b in range(5) for c in range(6)
    ] + [e("0/1"), e("0/1/2/x"), e("3")]  # fmt: skip
    entries = [Entry(x.path.replace("0", "zero"), x.digest, x.size, x.mode, 0) for x in entries]
    ref = DictLowerTree(entries)
    index.add_entries("ns", 1, entries)
    tree = index.lower_tree("ns", 1)
    assert sorted(tree.walk(), key=lambda x: x.path) == sorted(
        (n for n in ref._nodes.values() if isinstance(n, Entry)), key=lambda x: x.path
    )
    for path in [*ref._nodes, "nope", "1/nope"]:
        assert tree.lookup(path) == ref.lookup(path), path
        assert list(tree.children(path)) == list(ref.children(path)), path


def test_lookup_many_is_lookup_of_each(index: NodeIndex) -> None:
    """One read transaction for a batch (overlay's recorded opens), same answers."""
    from casfs.index.memtree import StagedLowerTree

    index.add_entries("ns", 1, [e("a/b/c.json"), e("a/d.so", D2, 5)])
    index.add_entries("ns", 2, [e("later")])
    paths = ["a/d.so", "", "a", "a/b/c.json", "a/nope", "later", "a/d.so"]
    want = [e("a/d.so", D2, 5), DIR, DIR, e("a/b/c.json"), None, None, e("a/d.so", D2, 5)]
    tree = index.lower_tree("ns", 1)
    assert tree.lookup("a/b/c.json") is not None  # one memoised, the rest read
    assert tree.lookup_many(paths) == want
    assert tree.lookup_many(paths) == want  # now from the memo
    tree.max_seq = 2  # a refresh: the memo is dropped, the new entry shows
    assert tree.lookup_many(["later", "a/nope"]) == [e("later"), None]
    staged = StagedLowerTree(index.lower_tree("ns", 1))
    assert staged.lookup_many(paths) == want


def test_digests_many_is_the_digest_of_each_file(index: NodeIndex) -> None:
    """Recording a batch of kernel-served opens: digests of file entries, None for
    directories and absent paths, entries above max_seq unseen, nothing memoised."""
    from casfs.index.memtree import StagedLowerTree

    index.add_entries("ns", 1, [e("a/b/c.json"), e("a/d.so", D2, 5)])
    index.add_entries("ns", 2, [e("later")])
    paths = ["a/d.so", "", "a", "a/b/c.json", "a/nope", "later", "a/d.so"]
    want = [D2, None, None, e("a/b/c.json").digest, None, None, D2]
    tree = index.lower_tree("ns", 1)
    assert tree.lookup("a/d.so") is not None  # one memoised, the rest read
    assert tree.digests_many(paths) == want
    assert tree.lookup_many(["a/b/c.json"]) == [e("a/b/c.json")]
    assert tree.digests_many(paths) == want  # from the memo where it has them
    tree.max_seq = 2
    assert tree.digests_many(["later", "a/nope"]) == [e("later").digest, None]
    staged = StagedLowerTree(index.lower_tree("ns", 1))
    assert staged.digests_many(paths) == want


def test_a_row_put_right_replaces_the_wrong_size_of_the_same_digest(index: NodeIndex) -> None:
    """A generation's row with the right digest but a wrong size (a buggy writer's) is
    a miss on every node; its repair (the same digest, the right size, marked as a newer
    version: casfs.store.generations._merge) replaces it. Without the mark the first
    writer still wins."""
    from casfs.store.generations import REPLACE

    index.add_entries("ns", 1, [e("k/a", D1, 7)])
    plain = index.add_entries("ns", 2, [e("k/a", D1, 5)])
    assert (plain.kept, plain.replaced) == (1, ())
    right = Entry("k/a", D1, 5, 0o644, 1_700_000_000_000_000_000, {REPLACE: True})
    fixed = index.add_entries("ns", 3, [right])
    assert (fixed.kept, fixed.replaced) == (0, ("k/a",))
    found = index.lower_tree("ns", 3).lookup("k/a")
    assert isinstance(found, Entry) and (found.digest, found.size) == (D1, 5)
    again = index.add_entries("ns", 4, [right])
    assert (again.kept, again.replaced) == (1, ())
