"""casfs.util.fdwait.wait_exit: a child's exit wakes the wait (a pidfd), not a poll."""

from __future__ import annotations

import subprocess
import sys

import pytest

from casfs.util.fdwait import wait_exit


def _never_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Popen.wait(timeout) polls with time.sleep (up to 50 ms between looks)."""
    def refuse(_s: float) -> None:
        raise AssertionError("waited by polling")

    monkeypatch.setattr(subprocess.time, "sleep", refuse)  # type: ignore[attr-defined]


def test_an_exit_is_seen_when_it_happens(monkeypatch: pytest.MonkeyPatch) -> None:
    code = "import time; time.sleep(0.3); raise SystemExit(7)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    _never_sleeps(monkeypatch)
    assert wait_exit(proc, 30) == 7
    assert wait_exit(proc, 30) == 7  # reaped already: the status it had


def test_a_child_still_running_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _never_sleeps(monkeypatch)
        with pytest.raises(subprocess.TimeoutExpired):
            wait_exit(proc, 0.2)
        assert proc.returncode is None
    finally:
        proc.kill()
        proc.wait()
