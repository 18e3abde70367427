"""Reads of a job's files and directories that leave their access times alone.

casfs reads what a job wrote while the job still sees the same inodes: promotion
reads each file, dir and overlay modes rescan the tree. A plain read sets atime
under relatime whenever it is older than a day, so a job that set an old atime
(utimensat, tar -x) would see it jump to "now" for no reason of its own: a
difference from a plain directory. O_NOATIME is allowed to the file's owner and
to CAP_FOWNER (the daemon); anyone else gets EPERM, and reads without it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def open_noatime(path: str | os.PathLike[str], flags: int) -> int:
    """os.open with O_NOATIME where the kernel allows it."""
    try:
        return os.open(path, flags | os.O_NOATIME)
    except PermissionError as e:
        if e.errno != errno.EPERM:
            raise
        return os.open(path, flags)


def walk(top: str, opendir: Callable[[str], int] | None = None,
         ) -> Iterator[tuple[str, list[str], list[str]]]:
    """os.walk's (dirpath, dirnames, filenames), top-down, in the same order, with
    the same in-place pruning of dirnames and links not followed; unreadable
    directories are skipped (as os.walk does). Only the directory reads differ.

    ``opendir(dirpath)`` opens each directory instead (a tenant's: beneath its fd,
    casfs.util.beneath); then a symlink is listed with the files, never stat()ed:
    following it could reach anything, a FUSE server that never answers too."""
    follow = opendir is None
    stack = [top]
    while stack:
        dirpath = stack.pop()
        try:
            fd = opendir(dirpath) if opendir else open_noatime(dirpath, DIR_FLAGS)
        except OSError:
            continue
        dirs: list[str] = []
        files: list[str] = []
        links: set[str] = set()
        try:
            with os.scandir(fd) as it:
                for e in it:
                    try:
                        is_dir = e.is_dir(follow_symlinks=follow)
                    except OSError:
                        is_dir = False
                    (dirs if is_dir else files).append(e.name)
                    if is_dir and e.is_symlink():
                        links.add(e.name)
        except OSError:
            continue
        finally:
            os.close(fd)
        yield dirpath, dirs, files
        stack.extend(os.path.join(dirpath, d) for d in reversed(dirs) if d not in links)
