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
