"""tests/killguard.py: a signal to pid 0 or the run's own group is refused (-1 is
refused too, but never tried here: as root, unguarded, it reaches every process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import killguard
killguard.install()
for call in ({call},):
    try:
        call()
    except AssertionError as e:
        print("refused:", e)
os.kill(os.getpid(), 0)  # a probe (signal 0) still goes through
print("alive")
"""


@pytest.mark.parametrize("call", [
    "lambda: os.kill(0, signal.SIGKILL)",
    "lambda: os.killpg(os.getpgrp(), signal.SIGKILL)",
    "lambda: os.kill(-os.getpgrp(), signal.SIGTERM)",
])
def test_a_group_kill_is_refused_and_the_caller_lives(call: str) -> None:
    # its own session: were the guard missing, the kill reaches only the probe
    r = subprocess.run([sys.executable, "-c", PROBE.format(
        tests=str(Path(__file__).parent), call=call)], capture_output=True, text=True,
        timeout=60, start_new_session=True, check=False)
    assert r.returncode == 0, (r.returncode, r.stderr)
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("refused: ") and lines[1] == "alive", lines
