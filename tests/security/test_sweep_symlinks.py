"""A view's start sweeps the deletion markers of an earlier view from its upper, as root.

In overlay mode a job that keeps its cwd in the overlay across a stop and start of
casfsd still writes the upper through the detached overlay. A review (2026-12-06)
swapped a directory of it for a symlink to a root-only directory, over and over, while
the start swept: root removed whiteouts and opaque attributes there (1,500 of each
became 931 and 1,042). The sweep now reaches every directory beneath the upper
through fds. Here the swap is made at the moment the sweep visits the directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from casfs.util import beneath
from casfs.view import whiteout as wh


def _markers(d: Path) -> tuple[int, int]:
    """(opaque directories, whiteouts) under ``d``."""
    opaque = whiteouts = 0
    for here, dirs, files in os.walk(d):
        for name in dirs:
            opaque += wh.is_opaque(os.path.join(here, name))
        for name in files + dirs:
            whiteouts += wh.is_whiteout(os.lstat(os.path.join(here, name)))
    return opaque, whiteouts


def test_a_directory_swapped_for_a_symlink_mid_sweep_is_never_entered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "victim"  # root's, 0700: the tenant cannot read it
    for i in range(3):
        (victim / f"d{i}").mkdir(parents=True)
        wh.make_opaque(str(victim / f"d{i}"))
        wh.make_whiteout(str(victim / f"d{i}" / "wh"))
    os.chmod(victim, 0o700)
    upper = tmp_path / "upper"
    (upper / "x" / "a" / "sub").mkdir(parents=True)
    wh.make_whiteout(str(upper / "x" / "mine"))  # hers, an earlier view's: swept
    assert _markers(victim) == (3, 3)

    swapped: list[str] = []

    def swap_once(seen: str) -> None:
        if not swapped and seen.rstrip("/").endswith("x/a"):
            os.rename(upper / "x" / "a", upper / "x" / "a.away")
            os.symlink(victim, upper / "x" / "a")
            swapped.append(seen)

    def hooked(real: Callable[..., Any], key: Callable[..., str]) -> Callable[..., Any]:
        def call(*a: Any, **kw: Any) -> Any:
            swap_once(key(*a))
            return real(*a, **kw)
        return call

    monkeypatch.setattr(beneath, "open_read", hooked(beneath.open_read, lambda b, r, *_: r))
    monkeypatch.setattr(wh.os, "scandir", hooked(os.scandir, lambda p=".": str(p)))
    errors: list[str] = []
    removed = wh.sweep(upper, errors)
    assert swapped, "the sweep never visited x/a"
    assert _markers(victim) == (3, 3)  # (before: 0 and 0, root's own markers removed)
    assert not (upper / "x" / "mine").exists() and removed == 1
    assert errors == [str(upper / "x" / "a")]  # refused, so the view keeps checking
