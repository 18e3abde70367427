"""Which filesystem a path lives on, and refusing the ones the node state dir cannot use.

LMDB relies on a shared memory map and POSIX locks that network and FUSE
filesystems do not provide coherently (and the casfs mount itself is FUSE), so
the node state dir must be on a local filesystem. The type comes from
/proc/self/mountinfo: the mount with the longest mount point that contains the
path (the last one listed wins when mounts are stacked on one point).
"""

from __future__ import annotations

import logging
import os
import re

from casfs.errors import UnsupportedFilesystemError

log = logging.getLogger(__name__)

MOUNTINFO = "/proc/self/mountinfo"

# Exact fs types that are shared/network filesystems; "fuse" and "fuse.*" are
# matched by prefix below.
NETWORK_FS_TYPES = frozenset(
    {
        "nfs", "nfs4", "lustre", "cifs", "smb", "smb2", "smb3", "smbfs", "ceph",
        "gpfs", "wekafs", "9p", "beegfs", "glusterfs", "afs", "gfs2", "ocfs2",
        "panfs", "pvfs2", "orangefs", "davfs", "ncpfs", "coda", "quobyte",
    }
)  # fmt: skip

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo octal."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[tuple[str, str]]:
    """(mount point, fs type) for each line of a mountinfo file, in file order."""
    mounts: list[tuple[str, str]] = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)  # optional fields end with a lone "-"
            mounts.append((_unescape(fields[4]), fields[sep + 1]))
        except (ValueError, IndexError):
            log.debug("unparsable mountinfo line: %r", line)
    return mounts


def _contains(mountpoint: str, path: str) -> bool:
    return mountpoint == "/" or path == mountpoint or path.startswith(mountpoint + "/")


def fs_type(path: str | os.PathLike[str], mountinfo: str = MOUNTINFO) -> str:
    """The filesystem type of ``path`` (e.g. "ext4", "nfs4"), or "unknown"."""
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            mounts = parse_mountinfo(f.read())
    except OSError as e:
        log.debug("cannot read %s: %s", mountinfo, e)
        return "unknown"
    target = os.path.realpath(os.path.abspath(path))  # symlinks resolved; may not exist yet
    best, best_len = "unknown", -1
    for mountpoint, fstype in mounts:
        # >= so a later mount stacked on the same point wins
        if _contains(mountpoint, target) and len(mountpoint) >= best_len:
            best, best_len = fstype, len(mountpoint)
    return best


def is_network_fs(fstype: str) -> bool:
    return fstype in NETWORK_FS_TYPES or fstype == "fuse" or fstype.startswith(("fuse.", "fuseblk"))


def check_local_fs(path: str | os.PathLike[str], what: str, mountinfo: str = MOUNTINFO) -> str:
    """Raise UnsupportedFilesystemError if ``path`` is on a network or FUSE filesystem.

    Returns the fs type. ``what`` names the role of the path in the message.
    """
    fstype = fs_type(path, mountinfo)
    if is_network_fs(fstype):
        raise UnsupportedFilesystemError(
            f"{what} {os.fspath(path)} is on a {fstype} filesystem; "
            "it must be on node-local disk (LMDB cannot run on network or FUSE filesystems)"
        )
    return fstype


FSTAB = "/etc/fstab"


def unmounted_fstab_mount(path: str | os.PathLike[str], fstab: str | None = None,
                          mountinfo: str = MOUNTINFO) -> str | None:
    """The mount point of an ``/etc/fstab`` entry that contains ``path`` and is not
    mounted now (a shared filesystem that is down, or not up yet), else None.

    Creating a shared root there would put it on the local disk underneath: the
    node would share with nobody, silently, and the real root would later be
    mounted over it. ``CASFS_FSTAB`` names another file (tests).
    """
    fstab = fstab or os.environ.get("CASFS_FSTAB") or FSTAB
    try:
        with open(fstab, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            mounted = {mp for mp, _ in parse_mountinfo(f.read())}
    except OSError:
        return None
    target = os.path.realpath(os.path.abspath(path))
    for line in lines:
        fields = line.split()
        if len(fields) < 2 or fields[0].startswith("#"):
            continue
        mp = _unescape(fields[1])
        if (mp.startswith("/") and mp != "/" and fields[2:3] != ["swap"]
                and _contains(mp, target) and mp not in mounted):
            return mp
    return None
