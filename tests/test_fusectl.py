"""casfs.util.fusectl mounts fusectl where a container's /sys lacks it (as root)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = r"""
import ctypes, os
from casfs.util import fusectl
from casfs.util.libc import libc
assert libc().umount2(fusectl.CONNECTIONS.encode(), 2) == 0, os.strerror(ctypes.get_errno())
def mounted():
    with open("/proc/self/mountinfo") as f:
        return any(ln.split(" - ")[1].split()[0] == "fusectl" for ln in f)
print("before", mounted())
fusectl._mount_fusectl()
print("after", mounted())
"""


def test_fusectl_is_mounted_where_a_container_lacks_it() -> None:
    if os.geteuid() != 0:
        pytest.fail("needs root (a mount namespace of its own)")
    if not os.path.ismount("/sys/fs/fuse/connections"):
        pytest.fail("this machine has no fusectl mounted: the test needs it to take it away")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c",
                        PROBE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["before", "False", "after", "True"], r.stdout
    assert os.path.ismount("/sys/fs/fuse/connections")  # the host's: untouched
