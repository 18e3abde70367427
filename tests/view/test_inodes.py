"""Inode numbers: stable per path, counted, detached on removal, moved on rename."""

from __future__ import annotations

from casfs.view.inodes import ROOT_INODE, InodeTable


def test_stable_and_forgotten_at_zero() -> None:
    t = InodeTable()
    a = t.lookup("a")
    assert t.lookup("a") == a != ROOT_INODE
    t.forget(a, 1)
    assert t.path(a) == "a"
    t.forget(a, 1)
    assert t.path(a) is None and t.find("a") is None
    assert t.lookup("a") != a  # numbers are never reused


def test_detach_keeps_number_but_frees_path() -> None:
    t = InodeTable()
    a = t.lookup("d/f")
    t.detach("d/f")
    assert t.path(a) is None and t.last_path(a) == "d/f"
    b = t.lookup("d/f")
    assert b != a
    t.forget(a, 1)
    assert t.path(b) == "d/f"


def test_rename_moves_descendants_and_replaces_target() -> None:
    t = InodeTable()
    d, f, g = t.lookup("x"), t.lookup("x/sub/f"), t.lookup("y")
    other = t.lookup("xy")  # a sibling sharing the prefix must not move
    t.rename("x", "y")
    assert t.path(d) == "y" and t.path(f) == "y/sub/f"
    assert t.path(g) is None  # the replaced target is detached
    assert t.path(other) == "xy" and t.find("x") is None


def test_drop_if_unused() -> None:
    t = InodeTable()
    a = t.ino("p")
    t.drop_if_unused(a)
    assert t.find("p") is None
    b = t.lookup("q")
    t.drop_if_unused(b)
    assert t.find("q") == b


def test_children_index_matches_a_full_scan() -> None:
    """Random lookups, renames, detaches and forgets: same answers as scanning every path."""
    import random

    rng = random.Random(7)
    names = ["a", "b", "c", "ab"]

    def rand_path() -> str:
        return "/".join(rng.choice(names) for _ in range(rng.randint(1, 4)))

    t = InodeTable()
    ref: dict[int, str | None] = {}  # ino -> expected path (None: detached)
    counts: dict[int, int] = {}
    for _ in range(3000):
        op = rng.random()
        if op < 0.5:
            p = rand_path()
            ino = t.lookup(p)
            ref[ino] = p
            counts[ino] = counts.get(ino, 0) + 1
        elif op < 0.7:
            old, new = rand_path(), rand_path()
            if new == old or new.startswith(old + "/"):
                continue
            for ino, p in ref.items():
                if p is not None and (p == new or p.startswith(new + "/")):
                    ref[ino] = None
            for ino, p in ref.items():
                if p is not None and (p == old or p.startswith(old + "/")):
                    ref[ino] = new + p[len(old):]
            t.rename(old, new)
        elif op < 0.85:
            gone = rand_path()
            for ino, p in ref.items():
                if p is not None and (p == gone or p.startswith(gone + "/")):
                    ref[ino] = None
            t.detach(gone)
        elif counts:
            ino = rng.choice(list(counts))
            t.forget(ino, counts.pop(ino))
            ref.pop(ino, None)
        for ino, p in ref.items():
            assert t.path(ino) == p
            if p is not None:
                assert t.find(p) == ino


def test_hard_links_share_one_inode() -> None:
    t = InodeTable()
    a = t.lookup("a", key=(1, 99))
    assert t.lookup("d/b", key=(1, 99)) == a  # a name first seen later joins its sibling
    t.add_name(a, "c")
    assert t.names(a) == ["a", "c", "d/b"]
    t.detach("a")  # unlink the primary: the inode lives on under its other names
    assert t.path(a) in {"c", "d/b"} and t.find("a") is None
    t.rename("d", "e")
    assert sorted(t.names(a)) == ["c", "e/b"]
    t.detach("c")
    assert t.names(a) == ["e/b"]
    t.detach("e/b")
    assert t.path(a) is None and t.last_path(a) is not None  # detached: open handles only
    t.forget(a, 2)
    assert t.lookup("x", key=(1, 99)) != a  # a forgotten inode's key is gone too
