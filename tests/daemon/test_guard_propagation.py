"""The read-only guard under a shared mount (every mount is shared under systemd).

A bind mount of a directory on a shared mount joins that mount's peer group, so what
is later mounted on it propagates back into the directory it was bound from. The
guard (casfs.node.guard) is a bind of ``<state>/run/casfs-guard-empty`` on each mount
point, with the FUSE mount on top: under systemd the FUSE mount also landed on the
empty dir in the state dir, and the next mount's guard failed (EACCES while it
served, ENOTCONN once it died): casfsd with two FUSE mounts did not start under a
real systemd (found by tests/system/test_systemd.py). Here the same with a shared
bind mount for the state dir's filesystem and a tmpfs standing in for FUSE.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from fusehelpers import mounted

from casfs.node import guard


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")
def test_a_mount_on_the_guard_does_not_propagate_into_the_state_dir(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    state = shared / "state"
    mps = [tmp_path / "mnt-a", tmp_path / "mnt-b"]
    _mount("--bind", str(shared), str(shared))
    try:
        _mount("--make-shared", str(shared))
        for mp in mps:
            assert guard.install(mp, state)
            _mount("-t", "tmpfs", "-o", "size=1m", "standin-for-fuse", str(mp))
        empty = state / "run" / guard.GUARD_DIR_NAME
        assert not mounted(empty), "the FUSE stand-in propagated into the state dir"
        assert os.listdir(empty) == []
        for mp in mps:
            assert [m.fstype for m in guard.mounts_at(mp)] == [
                guard.mounts_at(mp)[0].fstype, "tmpfs"]
            assert guard.is_guard(guard.mounts_at(mp)[0])
    finally:
        for mp in [*mps, state / "run" / guard.GUARD_DIR_NAME, shared]:
            while mounted(mp):
                if subprocess.run(["umount", "-l", str(mp)], capture_output=True).returncode:
                    break
