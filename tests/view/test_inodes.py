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
