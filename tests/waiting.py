"""Waiting in tests: poll until a condition holds, for every test package.

    from waiting import wait_until
    entries = wait_until(lambda: published(root), "the final publication")

The deadline only stops a hung test; it is never a timing assertion. It is far
past anything a loaded 2-core CI machine needs, so a slow machine waits longer
instead of failing. Wait for the condition an ordering needs, never a fixed sleep.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

DEADLINE = 120.0  # seconds: "soon" for anything a test waits on


def wait_until(pred: Callable[[], Any], what: str, timeout: float = DEADLINE, *,
               interval: float = 0.05, proc: subprocess.Popen[Any] | None = None) -> Any:
    """Poll ``pred`` until it returns something truthy, and return that.

    Fails naming ``what`` at the deadline, or at once when ``proc`` (the process
    that should make ``pred`` true) has exited.
    """
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"process {proc.pid} exited (rc={proc.returncode}) while waiting"
                        f" for {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def wait_idle(watch: Any, quiet: float = 0.2, timeout: float = 10.0) -> None:
    """Until ``watch`` (casfs.view.inowatch.TreeWatch) has read no event for ``quiet``
    seconds: what it will see of what a test just did has been dispatched."""
    deadline = time.monotonic() + timeout
    seen, since = watch.events, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        if watch.events != seen:
            seen, since = watch.events, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
