"""casfs.util.fdwait.wait_exit: a child's exit wakes the wait (a pidfd), not a poll."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from casfs.util.fdwait import wait_exit


def _count_looks(proc: subprocess.Popen[Any]) -> list[int]:
    """Popen.wait(timeout) looks with waitpid(WNOHANG) (``_try_wait``) between sleeps
    of up to 50 ms; count this one child's looks (the instance only: other threads
    of the test process sleep and wait as they like)."""
    looks: list[int] = []
    real = proc._try_wait  # type: ignore[attr-defined]

    def counted(flags: int) -> Any:
        looks.append(flags)
        return real(flags)

    proc._try_wait = counted  # type: ignore[attr-defined]
    return looks


def test_an_exit_is_seen_when_it_happens() -> None:
    code = "import time; time.sleep(0.3); raise SystemExit(7)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    looks = _count_looks(proc)
    assert wait_exit(proc, 30) == 7
    assert len(looks) == 1  # once, after the pidfd said it exited (polling: ~10 looks)
    assert wait_exit(proc, 30) == 7  # reaped already: the status it had


def test_a_child_still_running_times_out() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        looks = _count_looks(proc)
        with pytest.raises(subprocess.TimeoutExpired):
            wait_exit(proc, 0.2)
        assert looks == [] and proc.returncode is None
    finally:
        proc.kill()
        proc.wait()
