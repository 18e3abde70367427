"""statx(2) without asking a FUSE server: what casfs may learn of a tenant's file
without waiting on her.

A user may mount a FUSE file system inside a directory she owns, and where
/etc/fuse.conf has ``user_allow_other`` (common on HPC nodes) root's calls into
it are sent to her server, which may never answer: a thread of casfsd stuck for
good on one tenant's whim. ``AT_STATX_DONT_SYNC`` makes FUSE answer from the
attributes the kernel holds (a new mount's root is known without asking), so a
mount's root is found, and a file's identity (device, inode) read, without a
request to its server. Local file systems ignore the flag.
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass

from casfs.util.libc import libc

AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_SYMLINK_NOFOLLOW = 0x100
AT_NO_AUTOMOUNT = 0x800
AT_STATX_DONT_SYNC = 0x4000
STATX_TYPE = 0x1
STATX_UID = 0x8
STATX_INO = 0x100
STATX_ATTR_MOUNT_ROOT = 0x2000  # kernel 5.8


class _Statx(ctypes.Structure):  # struct statx, 256 bytes (include/uapi/linux/stat.h)
    _fields_ = [("mask", ctypes.c_uint32), ("blksize", ctypes.c_uint32),
                ("attributes", ctypes.c_uint64), ("nlink", ctypes.c_uint32),
                ("uid", ctypes.c_uint32), ("gid", ctypes.c_uint32),
                ("mode", ctypes.c_uint16), ("_spare0", ctypes.c_uint16),
                ("ino", ctypes.c_uint64), ("size", ctypes.c_uint64),
                ("blocks", ctypes.c_uint64), ("attributes_mask", ctypes.c_uint64),
                ("_times", ctypes.c_uint8 * 64), ("rdev_major", ctypes.c_uint32),
                ("rdev_minor", ctypes.c_uint32), ("dev_major", ctypes.c_uint32),
                ("dev_minor", ctypes.c_uint32), ("_rest", ctypes.c_uint8 * 112)]


@dataclass(frozen=True)
class Ident:
    dev: int
    ino: int
    mode: int
    mount_root: bool | None  # None: the kernel does not say (before 5.8)
    uid: int = -1


def ident(dirfd: int, path: str, follow: bool = False) -> Ident:
    """``path`` (relative to ``dirfd``; "" for ``dirfd`` itself) as the kernel already
    knows it, never a request to a FUSE server. OSError as stat's."""
    flags = AT_STATX_DONT_SYNC | AT_NO_AUTOMOUNT
    if not follow:
        flags |= AT_SYMLINK_NOFOLLOW
    if not path:
        flags |= AT_EMPTY_PATH
    buf = _Statx()
    rc = libc().statx(ctypes.c_int(dirfd), os.fsencode(path), ctypes.c_int(flags),
                      ctypes.c_uint(STATX_TYPE | STATX_INO | STATX_UID), ctypes.byref(buf))
    if rc != 0:
        err = ctypes.get_errno() or errno.EIO
        raise OSError(err, os.strerror(err), path)
    known = bool(buf.attributes_mask & STATX_ATTR_MOUNT_ROOT)
    return Ident(os.makedev(buf.dev_major, buf.dev_minor), buf.ino, buf.mode,
                 bool(buf.attributes & STATX_ATTR_MOUNT_ROOT) if known else None, buf.uid)


def refuse_mount(dirfd: int, name: str) -> None:
    """EXDEV if ``name`` in ``dirfd`` is where another file system is mounted (its root,
    by the kernel's attribute, else by a device other than ``dirfd``'s)."""
    leaf = ident(dirfd, name)
    crossed = leaf.mount_root
    if crossed is None:
        crossed = leaf.dev != ident(dirfd, "").dev
    if crossed:
        raise OSError(errno.EXDEV, "a mount point: not crossed", name)



def fs_type(dev: int) -> tuple[str, str] | None:
    """(type, super options) of the file system on device ``dev`` (``fuse.sshfs``,
    ``rw,user_id=1001,...``), from /proc/self/mountinfo (fstatfs would ask a FUSE
    server). None if not listed."""
    want = f"{os.major(dev)}:{os.minor(dev)}"
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and fields[2] == want and " - " in line:
                    tail = line.split(" - ", 1)[1].split()
                    return tail[0], tail[2] if len(tail) > 2 else ""
    except OSError:
        pass
    return None


def others_fuse(dev: int) -> str | None:
    """The uid (as mountinfo says it) that mounted the FUSE file system on ``dev``, if
    that is not this process's euid; None for anything else. A tenant may stack her
    own over a directory she owns, and her server need never answer root."""
    if os.major(dev) != 0:  # a block device's file system; FUSE's devices are anonymous
        return None
    found = fs_type(dev)
    if found is None or not (found[0] == "fuse" or found[0].startswith(("fuse.", "fuseblk"))):
        return None
    opts = dict(o.split("=", 1) for o in found[1].split(",") if "=" in o)
    owner = opts.get("user_id", "0")
    return None if owner == str(os.geteuid()) else owner


def refuse_user_fuse(fd: int, what: str) -> None:
    """EXDEV if root would act on a FUSE file system another user mounted. A user's
    own casfs, and root's own FUSE mounts, are let through."""
    if os.geteuid() != 0:
        return
    owner = others_fuse(ident(fd, "").dev)
    if owner is not None:
        raise OSError(errno.EXDEV, f"on a FUSE file system of uid {owner}: not entered", what)
