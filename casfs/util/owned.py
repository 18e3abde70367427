"""Paths casfs mounts or writes at must belong to their user: checked component by component.

A mount base, state dir or POSIX shared root in a place another user can
rename into is a place another user can redirect: create ``/tmp/casfs-<uid>``
first and the victim's cache is the attacker's. So before casfs uses such a
path, every component is checked (``lstat``, never following):

- each directory on the way is owned by root or the user, and writable by
  group or others only if it is root-owned and sticky (``/tmp``), or
  group-writable with a group the user is in (a 2770 group tenant's directory);
- the component right below a sticky directory is owned by the user (or root)
  and not writable by others (``/tmp/casfs-<uid>``, 0700);
- a symlink is followed only if it lies in a directory that passed and is
  owned by root or the user (``/var/run -> /run``); its target is checked the same way;
- the last component may be a shared root owned by anyone, not writable by
  others unless sticky (a ``--multi-user`` root is 1777), where the caller says so.

Anything else raises UnsafePathError, one line naming the component. Missing
components are created one at a time (``mkdir`` with the given mode, which an
existing directory must then pass like any other). Once a path passes, only
root or the user can change it, so using the path string afterwards is safe.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from casfs.errors import ConfigError

log = logging.getLogger(__name__)

_MAX_LINKS = 40


class UnsafePathError(ConfigError):
    """A path component another user could redirect (the message names it)."""


def _fmt(st: os.stat_result) -> str:
    return f"owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}"


class _Checker:
    def __init__(self, uid: int, groups: Iterable[int] | None, what: str,
                 extra_owners: Iterable[int] = ()) -> None:
        self.uid = uid
        self.owners = {0, uid}
        self.last_owners = self.owners | set(extra_owners)
        self.groups = set(os.getgroups() if groups is None else groups) | (
            {os.getegid()} if groups is None else set())
        self.what = what

    def refuse(self, p: str, why: str) -> UnsafePathError:
        return UnsafePathError(f"{self.what}: refusing {p}: {why}")

    def dir_ok(self, p: str, st: os.stat_result, below_sticky: bool, last: bool,
               shared_last: bool) -> None:
        """One existing directory component (``last``: the path itself)."""
        mode = stat.S_IMODE(st.st_mode)
        owners = self.last_owners if last else self.owners
        if last and shared_last and (mode & 0o1002 == 0o1002 or not mode & 0o002):
            # A shared root: any owner (a service account; nobody on a root-squashed
            # NFS), or a --multi-user root, sticky and open to all by design. What it
            # holds is checked as a possibly hostile store (tenancy, hashes).
            return
        if st.st_uid not in owners:
            raise self.refuse(p, f"owned by another user ({_fmt(st)})")
        if below_sticky and mode & 0o002:
            raise self.refuse(p, f"writable by others below a sticky directory ({_fmt(st)})")
        if mode & 0o002 and not (st.st_uid == 0 and mode & stat.S_ISVTX):
            raise self.refuse(p, f"writable by others ({_fmt(st)})")
        if (mode & 0o020 and not mode & 0o002 and st.st_gid not in self.groups
                and not (st.st_uid == 0 and mode & stat.S_ISVTX)):
            raise self.refuse(p, f"writable by group {st.st_gid}, not one of the user's"
                                 f" ({_fmt(st)})")


def _walk(path: Path, ck: _Checker, *, create_mode: int | None, shared_last: bool) -> Path:
    """Check (and create) ``path``; the path with its symlinks resolved."""
    todo = list(Path(os.path.abspath(path)).parts[1:])
    cur = "/"
    in_sticky = False  # is ``cur`` sticky (its entries: owned by the user, not o+w)
    links = 0
    while todo:
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            cur = os.path.dirname(cur)
            in_sticky = bool(os.lstat(cur).st_mode & stat.S_ISVTX)
            continue
        p = os.path.join(cur, name)
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            if create_mode is None:
                raise
            with contextlib.suppress(FileExistsError):  # made meanwhile: checked below
                os.mkdir(p, create_mode)
            st = os.lstat(p)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == ck.uid == os.geteuid():
                os.chmod(p, create_mode)  # exact: not narrowed by the umask
                st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise ck.refuse(p, "too many symlinks")
            if st.st_uid not in ck.owners or in_sticky:
                raise ck.refuse(p, f"a symlink another user could change ({_fmt(st)})")
            target = os.readlink(p)
            if os.path.isabs(target):
                cur, in_sticky = "/", False
            todo = [*Path(target).parts[1 if os.path.isabs(target) else 0:], *todo]
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise ck.refuse(p, "not a directory")
        ck.dir_ok(p, st, in_sticky, not todo, shared_last)
        in_sticky = bool(st.st_mode & stat.S_ISVTX)
        cur = p
    return Path(cur)


def check_dir(path: Path, what: str, *, uid: int | None = None,
              groups: Iterable[int] | None = None, create_mode: int | None = None,
              shared: bool = False, extra_owners: Iterable[int] = ()) -> Path:
    """Check that ``path`` (a directory) belongs to ``uid`` (default: this process's).

    ``create_mode``: create missing components with this mode (else a missing one
    raises FileNotFoundError). ``shared``: the path itself may be a --multi-user
    shared root (sticky, world-writable, any owner). ``extra_owners``: uids that may
    also own the path itself (the tenant a root mount serves). Returns the resolved
    path. UnsafePathError (one line naming the component) when it does not pass.
    """
    ck = _Checker(os.geteuid() if uid is None else uid, groups, what, extra_owners)
    try:
        return _walk(Path(path), ck, create_mode=create_mode, shared_last=shared)
    except FileNotFoundError:
        if create_mode is None:
            raise
        raise ck.refuse(str(path), "it vanished while being checked") from None
    except UnsafePathError:
        raise
    except OSError as e:
        raise ck.refuse(str(path), e.strerror or str(e)) from None


def check_mountpoint(path: Path, what: str, *, create_mode: int | None = None) -> Path:
    """A mount point (or a dir-mode cache directory): its parent checked (and created).

    The path itself is not looked at: it may be a mount (a live one of another
    process, or a dead one that fails every lstat with ENOTCONN) that the mount
    process takes over; it lies in a directory only the user (or root) can change.
    """
    return check_dir(Path(path).parent, what, create_mode=create_mode) / Path(path).name


def private_dir(path: Path, what: str) -> Path:
    """A state dir: checked and made (0700) as ``check_dir`` does, and, as root, closed
    to every other user if it is wider (0755: made by an older casfs, by hand, or by a
    ``mkdir -p`` of one of its subdirectories). Tenants own directories inside root's
    state dir (their uppers, their links layers): reached there, behind casfs's view,
    one could swap a directory of hers for a symlink under a file the view writes as
    root (found by a review on 2026-12-06)."""
    p = check_dir(path, what, create_mode=0o700)
    if os.geteuid() == 0:
        mode = stat.S_IMODE(os.lstat(p).st_mode)
        if mode & 0o077:
            os.chmod(p, mode & ~0o077)
            log.info("%s %s was open to other users (mode %04o): made %04o", what, p, mode,
                     mode & ~0o077)
    return p
