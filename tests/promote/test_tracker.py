"""WriteTracker: which upper paths are dirty, written, and quiet."""

from __future__ import annotations

import time

from casfs.promote.tracker import WriteTracker


def test_open_writer_keeps_a_path_from_being_quiet() -> None:
    t = WriteTracker()
    t.opened_for_write("a")
    assert t.quiet(0.0) == []
    assert t.has_writers("a")
    t.closed_for_write("a")
    assert t.quiet(0.0) == ["a"]
    assert not t.has_writers("a")


def test_quiet_period() -> None:
    t = WriteTracker()
    t.modified("a")
    assert t.quiet(3600.0) == []
    assert t.quiet(0.0) == ["a"]


def test_forget_keeps_a_path_changed_after_it_was_seen() -> None:
    t = WriteTracker()
    t.modified("a")
    seen = time.monotonic()
    t.forget("a", seen)
    assert t.pending() == 0
    t.modified("b")
    seen_b = time.monotonic() - 10  # looked at before the last change
    t.forget("b", seen_b)
    assert t.pending() == 1


def test_rename_of_a_directory_moves_dirty_descendants_and_writers() -> None:
    t = WriteTracker()
    t.modified("tmp.x/k.cubin")
    t.opened_for_write("tmp.x/k.json")
    t.modified("other/f")
    t.renamed("tmp.x", "KEY")
    assert t.has_writers("KEY/k.json") and not t.has_writers("tmp.x/k.json")
    t.closed_for_write("KEY/k.json")
    assert set(t.quiet(0.0)) == {"KEY", "KEY/k.cubin", "KEY/k.json", "other/f"}


def test_removed_drops_a_subtree() -> None:
    t = WriteTracker()
    t.modified("d/a")
    t.modified("d/b/c")
    t.modified("dd")
    t.removed("d")
    assert t.quiet(0.0) == ["dd"]


def test_rename_onto_an_open_file_keeps_both_writers() -> None:
    t = WriteTracker()
    t.opened_for_write("a")
    t.opened_for_write("b")
    t.renamed("a", "b")
    t.closed_for_write("b")
    assert t.has_writers("b")  # the other handle is still open
    t.closed_for_write("b")
    assert not t.has_writers("b")


def test_removing_an_open_file_forgets_its_writer() -> None:
    t = WriteTracker()
    t.opened_for_write("f")
    t.removed("f")
    t.modified("f")  # a new file at the same path
    assert t.quiet(0.0) == ["f"]


def test_a_hold_keeps_what_changed_in_its_window_from_promotion() -> None:
    """A job killed mid-write: what changed in the window is never quiet, even when the
    kernel's late RELEASE of its files comes after the hold; a later write lifts it."""
    t = WriteTracker()
    t.modified("old")
    time.sleep(0.02)
    since = time.monotonic()
    t.opened_for_write("torn")
    assert t.hold(since, time.monotonic() + 0.2) == 1
    t.closed_for_write("torn")  # the dead job's RELEASE, after the hold
    time.sleep(0.25)
    assert t.quiet(0.0) == ["old"]
    assert t.held() == ["torn"]
    t.modified("torn")  # written again after the window: promoted as usual
    assert t.quiet(0.0) == ["old", "torn"] and t.held() == []


class _Counted(float):
    """A window bound that counts the comparisons made with it."""

    made = 0

    def __lt__(self, other: float) -> bool:
        _Counted.made += 1
        return float(self) < other

    def __le__(self, other: float) -> bool:
        _Counted.made += 1
        return float(self) <= other

    def __gt__(self, other: float) -> bool:
        _Counted.made += 1
        return float(self) > other

    def __ge__(self, other: float) -> bool:
        _Counted.made += 1
        return float(self) >= other


def test_many_holds_cost_a_promotion_round_little() -> None:
    """Every killed job of a namespace adds a hold window, for as long as the namespace is
    served; a round's check of each dirty path must not walk them all (it runs under
    the lock every FUSE write takes: 1,000 windows and 50,000 paths were 2 s)."""
    t = WriteTracker()
    for i in range(2000):
        t.modified(f"f{i}")
    base = time.monotonic() - 100_000.0
    for k in range(1000):
        t.hold(_Counted(base + 2 * k), _Counted(base + 2 * k + 1))
    _Counted.made = 0
    assert len(t.quiet(0.0)) == 2000  # none changed in a window
    assert _Counted.made < 2000 * 30  # a search per path, not a walk over 1,000 windows


def test_paths_held_as_they_are_until_written_again() -> None:
    """A drainer died with files open through its FUSE mount: held as they are (dirty
    or not yet seen here), listed as held (removed at release); a later write lifts it."""
    t = WriteTracker()
    t.modified("seen")
    time.sleep(0.01)
    assert t.hold_paths({"seen", "unseen"}) == 2
    assert t.quiet(0.0) == [] and t.held() == ["seen", "unseen"] and t.holding()
    time.sleep(0.01)
    t.modified("seen")  # written again through this process
    assert t.quiet(0.0) == ["seen"] and t.held() == ["unseen"]
    t.renamed("unseen", "moved")  # renamed, still as it was: held under its new name
    assert t.held() == ["moved"] and t.quiet(0.0) == ["seen"]
    t.removed("moved")
    assert not t.holding() and t.held() == []
