"""Upper names known absent are remembered only until something creates an upper entry."""

from __future__ import annotations

import os
from pathlib import Path

from casfs.store.entry import Entry
from casfs.view.layers import Layers
from casfs.view.lower import DictLowerTree


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
