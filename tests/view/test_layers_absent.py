"""Upper names known absent are remembered only until something creates an upper entry."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from casfs.store.entry import Entry
from casfs.view.layers import Layers
from casfs.view.lower import DictLowerTree, LowerNode


def layers(tmp_path: Path) -> Layers:
    lower = DictLowerTree([Entry("a/b", "11" * 32, 1, 0o644, 0)])
    return Layers(lower, tmp_path / "upper")


def test_every_way_of_creating_shows_at_once(tmp_path: Path) -> None:
    ly = layers(tmp_path)
    creations = {
        "d": lambda p: ly.mkdir(p, 0o755),
        "f": lambda p: os.close(ly.open(p, os.O_CREAT | os.O_WRONLY, 0o644)),
        "n": lambda p: ly.mknod(p, 0o600 | 0o010000),  # a FIFO
        "s": lambda p: ly.symlink(b"target", p),
        "l": lambda p: ly.link("f", p),
        "r": lambda p: ly.rename("l", p),
        "w": lambda p: ly.add_whiteout(p, 0o755),
    }
    for name, create in creations.items():
        assert ly.raw_stat(name) is None and ly.raw_stat(name) is None  # remembered
        create(name)
        assert ly.raw_stat(name) is not None, name
    assert ly.raw_stat("l") is None  # renamed away: absent again (after an lstat)
    staged = ly.stage_copy(None, Entry("x", "22" * 32, 0, 0o644, 0))
    assert ly.raw_stat("x") is None
    assert ly.install_staged(staged, "x")
    assert ly.raw_stat("x") is not None


def test_absent_answers_do_not_hide_a_creation_between_check_and_record(
        tmp_path: Path) -> None:
    ly = layers(tmp_path)
    real = ly.lstat

    def racing(path: str) -> os.stat_result:
        try:
            return real(path)
        finally:
            if path == "late":  # another handler creates it right after our lstat
                ly.mkdir("late", 0o755)

    ly.lstat = racing  # type: ignore[method-assign]
    assert ly.raw_stat("late") is None  # the lstat ran before the mkdir
    ly.lstat = real  # type: ignore[method-assign]
    assert ly.raw_stat("late") is not None  # not answered from the stale record


class CountingTree(DictLowerTree):
    def __init__(self, entries: list[Entry]) -> None:
        super().__init__(entries)
        self.asked: list[str] = []

    def lookup(self, path: str) -> LowerNode | None:
        self.asked.append(path)
        return super().lookup(path)


def test_lower_misses_are_remembered_until_the_lower_tree_grows(tmp_path: Path) -> None:
    """A served tree answers a miss from LMDB: each absent path is asked once, a path
    under an absent directory not at all, until lower_version says entries were added."""
    tree = CountingTree([Entry("a/b", "11" * 32, 1, 0o644, 0)])
    ly = Layers(tree, tmp_path / "upper")
    for _ in range(3):
        assert ly.lower_lookup("k") is None
        assert ly.lower_lookup("k/tmp") is None and ly.lower_lookup("k/tmp/f") is None
        assert ly.lower_lookup("a/b") is not None
    assert tree.asked == ["k", "a/b", "a/b", "a/b"]  # found nodes: the tree's own memo
    tree.add(Entry("k/tmp/f", "22" * 32, 1, 0o644, 0))
    assert ly.lower_lookup("k/tmp/f") is None  # not told yet (a refresh tells first)
    ly.lower_version += 1  # what ``lower_added`` and a new lower tree do
    assert ly.lower_lookup("k/tmp/f") is not None
    assert ly.resolve("k/tmp/f") is not None and ly.resolve("k") is not None


@pytest.mark.expect_log(r"sweeping .*: \[Errno 13\] denied")
def test_whiteouts_are_possible_only_after_one_is_made_or_a_sweep_missed_a_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from casfs.view import whiteout as wh

    upper = tmp_path / "upper"
    (upper / "a" / "k").mkdir(parents=True)
    wh.make_whiteout(str(upper / "a" / "k" / "gone"))  # an earlier view's marker
    ly = Layers(DictLowerTree([Entry("a/b", "11" * 32, 1, 0o644, 0)]), upper)
    assert ly.swept == 1 and not ly.whiteouts_possible
    ly.add_whiteout("a/b", 0o755)
    assert ly.whiteouts_possible
    # A directory the sweep could not list may still hold markers: scan as before.
    wh.make_whiteout(str(upper / "a" / "k" / "gone"))
    from casfs.util import beneath

    real = beneath.open_read

    def failing(base: int, rel: str, flags: int = 0) -> int:
        if rel.endswith("/k"):
            raise PermissionError(13, "denied", rel)
        return real(base, rel, flags)

    monkeypatch.setattr(beneath, "open_read", failing)
    ly2 = Layers(DictLowerTree([]), upper)
    assert ly2.whiteouts_possible
    monkeypatch.setattr(beneath, "open_read", real)
    assert Layers(DictLowerTree([]), upper).whiteouts_possible is False  # now swept
