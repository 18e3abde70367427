"""The mount point while nothing serves it: read-only and empty, and no stacking.

A job that writes into its cache directory while the mount process is down
(killed, restarting) would write into the directory underneath, where its files
vanish from view once the mount returns. A read-only bind mount of an empty
directory, put on the mount point once and left under the FUSE mount, turns
that window into EROFS for writers and ENOENT for readers: a miss, never lost
bytes. Root ignores permission bits, not EROFS, so a bind mount it must be
(needs CAP_SYS_ADMIN; without it the guard is skipped).

Mounts are read from /proc/self/mountinfo: never by stat'ing the mount point,
which may be a dead FUSE mount or our own.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from casfs.errors import UsageError
from casfs.util.libc import libc

log = logging.getLogger(__name__)

GUARD_DIR_NAME = "casfs-guard-empty"
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MNT_DETACH = 1, 32, 4096, 2  # <sys/mount.h>
_UMOUNT_NOFOLLOW = 8
_MS_PRIVATE, _MS_SHARED = 1 << 18, 1 << 20


@dataclass(frozen=True)
class MountEntry:
    mountpoint: str
    root: str  # the path inside the mounted filesystem (a bind mount's source)
    fstype: str
    source: str
    id: int = 0  # the mount's id (mountinfo's first field; kept by a move)
    parent: int = 0  # the id of the mount it is mounted on
    options: str = ""  # the filesystem's (super block) options
    dev: int = 0  # its device (st_dev of what lies in it), from mountinfo's major:minor


def _unescape(s: str) -> str:
    return s.encode().decode("unicode_escape")


def mounts_at(path: Path) -> list[MountEntry]:
    """Mounts whose mount point is ``path``, bottom first (the last one is visible).

    In stack order, each mounted on the one before: not mountinfo's order, which is
    the order of mounting (a mount moved beneath another, casfs.node.handover, comes
    after the one it is under)."""
    target = os.path.normpath(os.path.abspath(path))
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                a = left.split()
                b = right.split()
                if len(a) >= 5 and len(b) >= 2 and _unescape(a[4]) == target:
                    major, _, minor = a[2].partition(":")
                    found.append(MountEntry(_unescape(a[4]), _unescape(a[3]), b[0],
                                            _unescape(b[1]), int(a[0]), int(a[1]),
                                            _unescape(b[2]) if len(b) > 2 else "",
                                            os.makedev(int(major), int(minor))))
    except (OSError, ValueError):
        pass
    by_parent = {m.parent: m for m in found}
    ids = {m.id for m in found}
    bottoms = [m for m in found if m.parent not in ids]
    if len(bottoms) != 1:
        return found  # not one stack (a race with a mount or unmount): as listed
    out = [bottoms[0]]
    while (up := by_parent.get(out[-1].id)) is not None and len(out) < len(found):
        out.append(up)
    return out if len(out) == len(found) else found


def casfs_mounts_under(base: Path) -> list[str]:
    """Mount points of casfs's FUSE mounts (``fuse.casfs*``) this user made at or below
    ``base``: what a killed ``casfs run`` may have left (dead: ENOTCONN)."""
    top = os.path.normpath(os.path.abspath(base))
    out: list[str] = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                a, b = left.split(), right.split()
                if len(a) < 5 or len(b) < 3 or not b[0].startswith("fuse.casfs"):
                    continue
                mp = _unescape(a[4])
                opts = dict(o.split("=", 1) for o in _unescape(b[2]).split(",") if "=" in o)
                if ((mp == top or mp.startswith(top + "/"))
                        and opts.get("user_id", "0") == str(os.geteuid())):
                    out.append(mp)
    except (OSError, ValueError):
        pass
    return sorted(set(out))


def is_guard(m: MountEntry) -> bool:
    return m.root.rstrip("/").endswith("/" + GUARD_DIR_NAME)


def our_fuse(m: MountEntry) -> bool:
    """A FUSE mount this process's user made (mountinfo's ``user_id``): never one a
    tenant stacked on a directory she can write (her server need not answer)."""
    opts = dict(o.split("=", 1) for o in m.options.split(",") if "=" in o)
    return m.fstype.startswith("fuse") and opts.get("user_id", "0") == str(os.geteuid())


def refuse_foreign(path: Path, what: str) -> None:
    """UsageError if another user's FUSE mount is on top at ``path`` (stacked on a
    mount point she can write, the view's root): nothing may touch the path then."""
    found = mounts_at(path)
    top = found[-1] if found else None
    if top is not None and top.fstype.startswith("fuse") and not our_fuse(top):
        raise UsageError(f"{path}: another user's FUSE mount ({top.source}) is stacked on"
                         f" it; refusing to mount {what} there: unmount it first")


def detach_foreign(path: Path, what: str) -> int:
    """Lazily detach every FUSE mount another user stacked at ``path`` (a mount point of
    casfs's she can write: her dir-mode directory, the view's root): found in the mount
    table and detached with MNT_DETACH, neither of which asks her server anything.
    Left there, the start's first stat of the path went to her server (EACCES without
    ``allow_other``, for good with it) and casfsd refused to start for every tenant
    (found by a review on 2026-12-06). Returns how many were detached."""
    n = 0
    for _ in range(16):  # a stack of hers, one at a time from the top
        found = mounts_at(path)
        top = found[-1] if found else None
        if top is None or not top.fstype.startswith("fuse") or our_fuse(top):
            break
        opts = dict(o.split("=", 1) for o in top.options.split(",") if "=" in o)
        try:
            umount_detach(path)
        except OSError as e:
            log.warning("%s: cannot detach the FUSE mount of uid %s stacked on it: %s", path,
                        opts.get("user_id", "?"), e)
            break
        n += 1
        log.warning("%s: detached a FUSE mount (%s) of uid %s stacked on it: casfs serves %s"
                    " there", path, top.source, opts.get("user_id", "?"), what)
    return n


def umount_detach(path: Path) -> None:
    # UMOUNT_NOFOLLOW: the mount point itself, never where a symlink there would lead
    if libc().umount2(os.fsencode(path), _MNT_DETACH | _UMOUNT_NOFOLLOW) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(path))


def refuse_stacking(path: Path, what: str) -> None:
    """UsageError if a live FUSE mount already serves ``path`` (a dead one is cleared later)."""
    from casfs.view.session import is_dead

    found = mounts_at(path)
    top = found[-1] if found else None
    if top is None or is_guard(top) or not top.fstype.startswith("fuse"):
        return
    if is_dead(path):
        return  # a dead mount: clear_stale_mount detaches it
    raise UsageError(f"{path} is already mounted ({top.source}); refusing to mount {what}"
                     " on top of it: unmount it first or use another path")


def guarded(path: Path) -> bool:
    """A guard is among the mounts at ``path`` (the mount table only: the path is not
    looked at)."""
    return any(is_guard(m) for m in mounts_at(path))


def install(path: Path, state_dir: Path) -> bool:
    """Put the read-only empty guard on ``path`` unless one is there; True if it is there."""
    if guarded(path):
        return True
    if os.geteuid() != 0:
        return False
    empty = state_dir / "run" / GUARD_DIR_NAME
    empty.mkdir(parents=True, exist_ok=True)
    os.chmod(empty, 0o555)
    path.mkdir(parents=True, exist_ok=True)
    # mount(2) directly: two mount(8) processes cost more than the FUSE mount itself
    # on the path to ready.
    target = os.fsencode(path)
    # A bind mount from a shared mount joins that mount's peer group, and what is mounted on
    # it then propagates to its peers: under systemd (every mount shared) the FUSE mount
    # served here would also appear on the empty dir itself, in the state dir, where the
    # next mount's guard then fails (EACCES) or finds a dead FUSE mount (ENOTCONN). Private,
    # then shared again: a peer group of its own, so the FUSE mount still reaches the mount
    # namespaces that copy the mount point (containers, HostToContainer), never the state dir.
    for what, src, flags in (("bind", os.fsencode(empty), _MS_BIND),
                             ("leave the state dir's peer group", None, _MS_PRIVATE),
                             ("share", None, _MS_SHARED),
                             ("remount read-only", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)):
        if libc().mount(src, target, None, flags, None) != 0:
            err = ctypes.get_errno()
            log.warning("cannot guard %s while unmounted (%s): %s", path, what,
                        os.strerror(err))
            remove(path)
            return False
    return True


def remove(path: Path) -> None:
    """Take the guard off ``path`` (only if it is the visible mount there)."""
    found = mounts_at(path)
    if found and is_guard(found[-1]) and libc().umount2(os.fsencode(path), _MNT_DETACH) != 0:
        log.debug("unmount guard %s: %s", path, os.strerror(ctypes.get_errno()))
