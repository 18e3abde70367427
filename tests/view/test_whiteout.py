"""The pure merge rule of one directory listing."""

from __future__ import annotations

from casfs.view.whiteout import OPAQUE, is_reserved, merge_children, whiteout_name


def test_upper_shadows_lower_without_duplicates() -> None:
    got = merge_children([("b", "U"), ("a", "U")], [("a", "L"), ("c", "L")])
    assert got == [("a", "U"), ("b", "U"), ("c", "L")]


def test_whiteouts_hide_lower_and_are_never_listed() -> None:
    upper = [(whiteout_name("a"), "U"), (OPAQUE, "U"), ("z", "U")]
    got = merge_children(upper, [("a", "L"), ("b", "L")])
    assert got == [("b", "L"), ("z", "U")]


def test_reserved_lower_names_and_hidden_names_dropped() -> None:
    got = merge_children([], [(".wh.x", "L"), ("bad", "L"), ("ok", "L")],
                         lower_hidden=lambda n: n == "bad")
    assert got == [("ok", "L")]


def test_reserved_names() -> None:
    assert is_reserved(".wh.foo") and is_reserved(OPAQUE)
    assert not is_reserved(".whx") and not is_reserved("wh.foo")
