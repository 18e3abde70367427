"""Mount lifecycle helpers: detecting and clearing a dead FUSE mount."""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from fusehelpers import mounted

from casfs.view.session import clear_stale_mount, is_mountpoint, mount_options

from .conftest import Overlay

pytestmark = pytest.mark.fuse


def test_mount_options() -> None:
    opts = mount_options("casfs-x", allow_other=True, debug=False)
    assert {"default_permissions", "allow_other", "fsname=casfs-x"} <= opts
    assert "allow_other" not in mount_options("x", allow_other=False, debug=False)


def test_plain_dir_is_not_a_mountpoint(tmp_path: Path) -> None:
    assert not is_mountpoint(tmp_path)
    assert not clear_stale_mount(tmp_path)
    assert is_mountpoint(Path("/"))


@pytest.mark.expect_log(r"clearing a dead mount at ")
def test_dead_mount_is_cleared(overlay: Callable[..., Overlay]) -> None:
    ov = overlay()
    assert is_mountpoint(ov.mnt)
    proc = ov.view.proc
    assert proc is not None
    proc.send_signal(signal.SIGKILL)  # no chance to unmount: a dead mount stays behind
    proc.wait()
    with pytest.raises(OSError) as exc:
        os.listdir(ov.mnt)  # (stat may still be answered from the kernel's attribute cache)
    assert exc.value.errno == errno.ENOTCONN
    assert is_mountpoint(ov.mnt)
    assert clear_stale_mount(ov.mnt)
    assert not mounted(ov.mnt)
    assert os.path.isdir(ov.mnt)


def test_sigterm_unmounts_cleanly(overlay: Callable[..., Overlay]) -> None:
    ov = overlay()
    proc = ov.view.proc
    assert proc is not None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert not mounted(ov.mnt)
    assert "unmounted" in ov.view.log()
