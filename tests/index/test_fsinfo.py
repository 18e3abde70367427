from __future__ import annotations

import os
from pathlib import Path

import pytest

from casfs.errors import UnsupportedFilesystemError
from casfs.util.fsinfo import check_local_fs, fs_type, is_network_fs, parse_mountinfo

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
40 27 0:50 / /shared rw,relatime shared:5 - lustre 10.0.0.1@tcp:/fs rw
41 40 0:51 / /shared/local\\040disk rw,relatime - xfs /dev/sdb rw
42 27 0:52 / /mnt/nfs rw - nfs4 server:/export rw
43 27 0:53 / /mnt/fuse rw - fuse.sshfs host:/ rw
44 42 0:54 / /mnt/nfs rw - tmpfs tmpfs rw
"""


@pytest.fixture
def mountinfo(tmp_path: Path) -> str:
    p = tmp_path / "mountinfo"
    p.write_text(MOUNTINFO)
    return str(p)


def test_parse_unescapes_spaces_and_skips_optional_fields() -> None:
    mounts = dict(parse_mountinfo(MOUNTINFO))
    assert mounts["/shared/local disk"] == "xfs"
    assert mounts["/shared"] == "lustre"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/shared/casfs/state", "lustre"),
        ("/shared/local disk/state", "xfs"),
        ("/sharedx", "ext4"),  # a prefix of the name is not containment
        ("/mnt/fuse/x", "fuse.sshfs"),
        ("/mnt/nfs/x", "tmpfs"),  # stacked on the same point: the last mount wins
        ("/var/lib/casfs", "ext4"),
    ],
)
def test_longest_mount_point_wins(mountinfo: str, path: str, expected: str) -> None:
    assert fs_type(path, mountinfo) == expected


def test_check_local_fs_refuses_network_fs(mountinfo: str) -> None:
    with pytest.raises(UnsupportedFilesystemError) as ei:
        check_local_fs("/shared/casfs/state", "node state dir", mountinfo)
    msg = ei.value.message
    assert "/shared/casfs/state" in msg and "lustre" in msg and "\n" not in msg
    with pytest.raises(UnsupportedFilesystemError):
        check_local_fs("/mnt/fuse/state", "node state dir", mountinfo)
    assert check_local_fs("/shared/local disk/s", "node state dir", mountinfo) == "xfs"


def test_network_fs_names() -> None:
    for t in ("nfs", "nfs4", "lustre", "fuse", "fuse.gcsfuse", "cifs", "smb3", "ceph", "gpfs",
              "wekafs", "9p", "beegfs", "glusterfs"):  # fmt: skip
        assert is_network_fs(t), t
    for t in ("ext4", "xfs", "btrfs", "tmpfs", "zfs", "overlay"):
        assert not is_network_fs(t), t


def test_unreadable_mountinfo_is_unknown(tmp_path: Path) -> None:
    assert fs_type(tmp_path, str(tmp_path / "missing")) == "unknown"
    assert check_local_fs(tmp_path, "x", str(tmp_path / "missing")) == "unknown"


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_real_tmpfs_and_nonexistent_child() -> None:
    assert fs_type("/dev/shm") == "tmpfs"
    # a path that does not exist yet is judged by its nearest existing ancestor
    assert fs_type("/dev/shm/casfs-does-not-exist/a/b") == "tmpfs"
