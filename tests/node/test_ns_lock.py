"""The namespace lock (casfs.node.nsregistry.take_lock) and the processes a mount forks.

A mount process forks its workers (fetch, promotion, spares) from other threads at any
moment; each fork copies every open fd, a namespace lock's too, until its child execs.
A namespace let go of and served again at once must not find it "already mounted"
then (CI: a hosted namespace closed and reopened in one test process failed so, once).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from casfs.errors import UsageError
from casfs.node.config import MountConfig
from casfs.node.nsregistry import take_lock


def _config(tmp_path: Path) -> MountConfig:
    return MountConfig(name="t", family="generic", namespace="testns",
                       mountpoint=tmp_path / "mnt", root=tmp_path / "root",
                       state_dir=tmp_path / "state")


def _fork_holding(seconds: float) -> int:
    """A child that keeps its copies of our fds for ``seconds``, as one between its
    fork and its exec does."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        time.sleep(seconds)
        os._exit(0)
    return pid


def test_a_lock_a_fork_still_holds_for_a_moment_is_waited_for(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    fd = take_lock(cfg)
    child = _fork_holding(0.5)
    os.close(fd)  # let go of: only the child's copy holds it now
    t0 = time.monotonic()
    try:
        again = take_lock(cfg)
    finally:
        os.waitpid(child, 0)
    os.close(again)
    assert time.monotonic() - t0 >= 0.3  # it did wait for the child's copy to go


def test_a_namespace_really_mounted_elsewhere_is_still_refused(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    fd = take_lock(cfg)
    try:
        with pytest.raises(UsageError, match="already mounted"):
            take_lock(cfg)
        with pytest.raises(UsageError, match="already mounted"):  # a reclaim: at once
            take_lock(cfg, wait_for_reclaim=False)
    finally:
        os.close(fd)
