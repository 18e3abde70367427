"""How the upper layer records deletions of lower entries: overlayfs's own format.

One format for every view mode that has an upper layer (``fuse`` here, and
``overlay``, where the kernel's overlayfs writes the very same markers):

* **whiteout**: a character device with device number 0/0 *at the name it
  hides* (``<dir>/<name>``). It hides the lower entry ``<dir>/<name>`` (file
  or directory, with everything below it). Because the marker takes the name
  itself, no prefix is added and every legal name (up to NAME_MAX, 255
  bytes, whatever it starts with) can be whited out; no name is reserved.
* **opaque directory**: an upper directory carrying the extended attribute
  ``trusted.overlay.opaque = "y"`` (``user.overlay.opaque`` when the daemon
  is not root: overlayfs's ``userxattr`` convention). Every lower child of
  it, at any depth, is hidden. Written when a lower directory is removed and
  re-created, and when a directory is moved (a moved tree is copied up whole,
  so at its new place it must not merge with lower entries).

Creating a 0/0 character device needs no privilege since Linux 5.8 (the
kernel allows exactly this device for whiteouts); through the view, ``mknod``
of that one device is refused (EPERM; other device nodes are allowed to
CAP_MKNOD callers, as on any directory, and the mount is ``nodev``), so a
0/0 device in the upper is always a marker. Copy-up staging lives outside the upper directory
(``work_dir_for``), as overlayfs's workdir does, so it takes no name either.

Scope (shared decision 3): a whiteout hides published entries only for the
mounts that made it. Markers live as long as the per-namespace view that
wrote them: from the namespace's activation (mount start, or the first
lease after a release) to its release or the end of the mount process.
When a view of the namespace starts again, ``sweep`` removes every whiteout
and opaque marker from its upper, so a job that ran ``rm -rf $CACHE/*``
does not make later jobs on the node miss the cluster's cache. Files the
job created stay (they are its unpublished writes).

Uppers written by casfs before this format used OCI markers (empty files
``.wh.<name>`` and ``.wh..wh..opq``, staging in ``.wh..wh.casfs.work``);
``sweep`` recognises such an upper by that staging directory and removes the
old markers once (they were whiteouts, which the scope rule drops anyway).
After that, ``.wh.`` names are ordinary names.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)

WHITEOUT_DEV = 0  # os.makedev(0, 0)
OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque")
LEGACY_PREFIX = ".wh."
LEGACY_OPAQUE = ".wh..wh..opq"
LEGACY_WORK_DIR = ".wh..wh.casfs.work"

T = TypeVar("T")
U = TypeVar("U")


def opaque_xattr() -> str:
    """The opaque attribute this process writes (trusted.* needs CAP_SYS_ADMIN)."""
    return OPAQUE_XATTRS[0] if os.geteuid() == 0 else OPAQUE_XATTRS[1]


def work_dir_for(upper_dir: Path) -> Path:
    """Staging directory of an upper: a sibling, so it is on the same filesystem.

    ``<parent>/.casfs-work/<name>``: namespace names never start with a dot,
    so this never collides with another namespace's upper.
    """
    return upper_dir.parent / ".casfs-work" / upper_dir.name


def is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == WHITEOUT_DEV


def make_whiteout(path: str) -> None:
    """Create the marker at ``path`` (which must not exist)."""
    os.mknod(path, stat.S_IFCHR | 0o000, WHITEOUT_DEV)


def is_opaque(path: str | int, *, runtime: bool = False) -> bool:
    """Whether the upper directory ``path`` (or open fd) is opaque.

    ``runtime``: only the attribute this process writes is read (every view
    sweeps older markers at start), one syscall per check on the lookup path.
    """
    names = (opaque_xattr(),) if runtime else OPAQUE_XATTRS
    for name in names:
        try:
            if os.getxattr(path, name, follow_symlinks=isinstance(path, int)) == b"y":
                return True
        except OSError as e:
            if e.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EPERM, errno.EACCES):
                raise
    return False


def make_opaque(path: str | int) -> None:
    os.setxattr(path, opaque_xattr(), b"y", follow_symlinks=isinstance(path, int))


def entry_is_whiteout(entry: os.DirEntry[str]) -> bool:
    """Classify a scandir entry, with an lstat only for the rare special files."""
    if entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False):
        return False
    if entry.is_symlink():
        return False
    try:
        return is_whiteout(entry.stat(follow_symlinks=False))
    except FileNotFoundError:
        return False


def merge_children(
    upper: Iterable[tuple[str, T]],
    lower: Iterable[tuple[str, U]],
    *,
    whiteouts: Iterable[str] = (),
    lower_hidden: Callable[[str], bool] = lambda _name: False,
) -> list[tuple[str, T | U]]:
    """Visible children of one merged directory, sorted by name, without duplicates.

    ``upper`` holds the real upper entries (whiteouts already taken out and
    passed as ``whiteouts``), ``lower`` the lower children; pass ``lower=()``
    when the lower directory is hidden or the upper one is opaque.
    ``lower_hidden`` hides further lower names (e.g. objects that failed to fetch).
    """
    merged: dict[str, T | U] = dict(upper)
    hidden = set(whiteouts)
    for name, lnode in lower:
        if name in merged or name in hidden or lower_hidden(name):
            continue
        merged[name] = lnode
    return sorted(merged.items())


def _size(e: os.DirEntry[str]) -> int:
    try:
        return e.stat(follow_symlinks=False).st_size
    except FileNotFoundError:
        return -1


def _fd_owner_writable(dfd: int, fn: Callable[[], None]) -> None:
    """``fn()`` with the directory open at ``dfd`` open to its owner's write and search
    for that one call, its mode restored after: the view's own markers under a
    directory the job made read-only (0555, as its owner may) are still the view's to
    remove."""
    mode = stat.S_IMODE(os.fstat(dfd).st_mode)
    os.chmod(dfd, mode | stat.S_IWUSR | stat.S_IXUSR)
    try:
        fn()
    finally:
        os.chmod(dfd, mode)


def _clear_opaque_fd(dfd: int) -> None:
    for name in OPAQUE_XATTRS:
        try:
            os.removexattr(dfd, name)
        except PermissionError:  # a dir the job made read-only (user.* xattrs need write)
            with contextlib.suppress(OSError):
                _fd_owner_writable(dfd, functools.partial(os.removexattr, dfd, name))
        except OSError:
            pass


def _unlink_marker(dfd: int, name: str, where: str) -> bool:
    """Remove the marker ``name`` in the directory open at ``dfd`` (see
    ``_fd_owner_writable``); False, logged, if it stays."""
    try:
        try:
            os.unlink(name, dir_fd=dfd)
        except PermissionError:
            _fd_owner_writable(dfd, lambda: os.unlink(name, dir_fd=dfd))
        return True
    except FileNotFoundError:
        return True
    except OSError as e:
        log.warning("sweeping %s/%s: %s", where, name, e)
        return False


def sweep(upper_dir: Path, errors: list[str] | None = None) -> int:
    """Drop every deletion marker in ``upper_dir`` (see Scope above); returns how many.

    Also migrates an upper of the old OCI format (recognised by its old
    staging directory) by removing its ``.wh.*`` marker files, once.
    ``errors``: gets the directories that could not be listed or still hold a
    marker (the view then keeps checking for whiteouts). Never raises for one
    marker: a view that cannot start is every job's miss on this node.

    Every directory is reached beneath the upper through fds (casfs.util.beneath:
    no symlink followed, no mount crossed) and its markers removed through its fd:
    in overlay mode a job holding the previous, detached overlay still writes this
    upper, and swapped a directory for a symlink mid-sweep to have root remove
    markers and attributes wherever it pointed (a review, 2026-12-06).
    """
    from casfs.util import beneath

    try:
        base = beneath.open_base(upper_dir)
    except OSError:
        return 0  # none (yet), or not a directory
    try:
        return _sweep(base, upper_dir, errors)
    finally:
        os.close(base)


def _sweep(base: int, upper_dir: Path, errors: list[str] | None) -> int:
    from casfs.util import beneath

    try:
        migrate = stat.S_ISDIR(beneath.lstat(base, LEGACY_WORK_DIR).st_mode)
    except OSError:
        migrate = False
    if migrate:
        beneath.rmtree(base, LEGACY_WORK_DIR)
    removed = 0
    # scandir's d_type: only special files get an lstat, so a sweep of a large
    # upper costs one readdir per directory and one getxattr per directory.
    stack = [""]
    while stack:
        rel = stack.pop()
        where = os.path.join(upper_dir, rel) if rel else str(upper_dir)
        try:
            dfd = (os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=base)
                   if not rel else beneath.open_read(base, rel, os.O_DIRECTORY))
        except FileNotFoundError:
            continue  # gone meanwhile: nothing of it to sweep
        except OSError as err:
            if err.errno not in beneath.REFUSED:
                log.warning("sweeping %s: %s", where, err)
            if errors is not None:
                errors.append(where)
            continue
        try:
            if rel and is_opaque(dfd):
                _clear_opaque_fd(dfd)
                removed += 1
            with os.scandir(dfd) as it:
                entries = list(it)
            for ent in entries:
                if ent.is_dir(follow_symlinks=False):
                    stack.append(f"{rel}/{ent.name}" if rel else ent.name)
                    continue
                legacy_marker = (
                    migrate and ent.name.startswith(LEGACY_PREFIX)
                    and ent.is_file(follow_symlinks=False) and _size(ent) == 0
                )
                if legacy_marker or entry_is_whiteout(ent):
                    if _unlink_marker(dfd, ent.name, where):
                        removed += 1
                    elif errors is not None and where not in errors:
                        errors.append(where)
        except OSError as err:
            log.warning("sweeping %s: %s", where, err)
            if errors is not None:
                errors.append(where)
        finally:
            os.close(dfd)
    if removed:
        log.info("%s: dropped %d deletion markers of an earlier view%s", upper_dir, removed,
                 " (old .wh. format)" if migrate else "")
    return removed
