"""No test signals a process group by accident (imported by tests/conftest.py).

``kill(0, sig)``, ``kill(-1, sig)`` and ``killpg`` of the test run's own group reach
every process of the run: pytest, its xdist workers and the ``make`` above them. A
pid read from a status file or ``systemctl show MainPID`` is 0 when the process is
down, so one failed wait turned into ``os.kill(0, SIGKILL)`` kills the whole CI run
(exit 137, no report; stop 31's CI). The guard makes that one clear test failure.
A shell inside a container (``nsenter ... kill -9 0``) is out of its reach: such
shells run in a session of their own (tests/system/test_systemd.py)."""

from __future__ import annotations

import os
from typing import Any

_kill = os.kill
_killpg = os.killpg


def _check_group(pgid: int, sig: int) -> None:
    if sig and (pgid <= 1 or pgid == os.getpgrp()):
        raise AssertionError(
            f"refused: signal {sig} to process group {pgid}, the test run's own group or"
            " every process (a pid read as 0 from a process that is down?)")


def guarded_kill(pid: int, sig: int, *rest: Any) -> None:
    if sig and pid <= 0:
        _check_group(-pid if pid < 0 else os.getpgrp(), sig)
    _kill(pid, sig, *rest)


def guarded_killpg(pgid: int, sig: int) -> None:
    _check_group(pgid, sig)
    _killpg(pgid, sig)


def install() -> None:
    os.kill = guarded_kill
    os.killpg = guarded_killpg
