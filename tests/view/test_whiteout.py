"""The whiteout format (overlayfs's) and the pure merge rule of one directory listing."""

from __future__ import annotations

import os
from pathlib import Path

from casfs.view.whiteout import (
    is_opaque,
    is_whiteout,
    make_opaque,
    make_whiteout,
    merge_children,
    sweep,
    work_dir_for,
)


def test_upper_shadows_lower_without_duplicates() -> None:
    got = merge_children([("b", "U"), ("a", "U")], [("a", "L"), ("c", "L")])
    assert got == [("a", "U"), ("b", "U"), ("c", "L")]


def test_whiteouts_hide_lower_and_are_never_listed() -> None:
    got = merge_children([("z", "U")], [("a", "L"), ("b", "L")], whiteouts=["a"])
    assert got == [("b", "L"), ("z", "U")]


def test_hidden_lower_names_dropped_and_no_name_reserved() -> None:
    got = merge_children([], [(".wh.x", "L"), ("bad", "L"), ("ok", "L")],
                         lower_hidden=lambda n: n == "bad")
    assert got == [(".wh.x", "L"), ("ok", "L")]


def test_markers_on_disk_and_sweep(tmp_path: Path) -> None:
    up = tmp_path / "upper" / "ns"
    (up / "d").mkdir(parents=True)
    long = "x" * 255
    make_whiteout(str(up / long))  # NAME_MAX names need no prefix
    make_whiteout(str(up / "d" / "gone"))
    make_opaque(str(up / "d"))
    (up / "d" / "kept").write_bytes(b"mine")
    assert is_whiteout(os.lstat(up / long)) and is_opaque(str(up / "d"))
    assert not is_whiteout(os.lstat(up / "d" / "kept"))
    assert sweep(up) == 3
    assert sorted(os.listdir(up)) == ["d"] and os.listdir(up / "d") == ["kept"]
    assert not is_opaque(str(up / "d"))
    assert work_dir_for(up) == tmp_path / "upper" / ".casfs-work" / "ns"


def test_sweep_leaves_dot_wh_names_of_the_new_format(tmp_path: Path) -> None:
    (tmp_path / ".wh.x").touch()  # no legacy staging dir: an ordinary user file
    assert sweep(tmp_path) == 0 and (tmp_path / ".wh.x").exists()
