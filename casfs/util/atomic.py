"""The one durable-write helper every persistent write goes through.

Durability policy (written once, here): a file is written to a unique
temporary name in the directory it will live in (or a staging directory on
the same filesystem), then moved into place with ``rename`` (replace) or
``link`` (create-exclusive: fails with EEXIST if the name exists, which is
atomic on NFS and Lustre where O_EXCL historically was not). The temporary
file is removed on every failure path. Nothing is ever modified in place.

Two strengths of durable:

- ``sync=True`` (records, pins, markers, anything that *names* other data):
  the file is fsynced before it gets its name and the directory after.
- ``sync=False`` (objects): no per-file fsync. Instead, whoever is about to
  write a name that refers to such files first calls ``syncfs`` on that
  filesystem (``sync_filesystem``). Like OSTree's commit strategy, this turns
  two fsyncs per object (expensive round trips on NFS/Lustre) into one sync
  per publication, and keeps the invariant: a generation record never exists
  before the objects it names are durable.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so renames/links into it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as e:  # some network filesystems refuse fsync on dirs
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def temp_name(directory: str | os.PathLike[str], hint: str = "") -> Path:
    """A unique temporary name inside ``directory`` (same filesystem as the target)."""
    return Path(directory) / f".tmp-{hint}{os.getpid()}-{uuid.uuid4().hex}"


@contextlib.contextmanager
def staged_file(
    staging_dir: str | os.PathLike[str], hint: str = "", mode: int = 0o644, *, sync: bool = True
) -> Iterator[tuple[BinaryIO, Path]]:
    """Yield (file, temp path) in ``staging_dir``; closed (and fsynced if ``sync``) on exit.

    The caller moves the temp path into place (see ``publish_file``) inside the
    ``with`` block or after it; on an exception the temp file is removed.
    """
    tmp = temp_name(staging_dir, hint)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, mode)
    except FileNotFoundError:  # the staging dir is made once, not checked on every write
        os.makedirs(staging_dir, exist_ok=True)
        fd = os.open(tmp, flags, mode)
    f = os.fdopen(fd, "wb")
    try:
        yield f, tmp
        f.flush()
        if sync:
            os.fsync(f.fileno())
        f.close()
    except BaseException:
        f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def link_exclusive(tmp: Path, target: Path, *, sync: bool = True) -> bool:
    """Hard-link ``tmp`` to ``target`` unless ``target`` exists; always unlink ``tmp``.

    Returns True if this call created ``target``, False if it already existed.
    Where hard links are not supported, falls back to renameat2(RENAME_NOREPLACE):
    just as atomic, so readers never see a partly written file under the name.
    """
    try:
        try:
            try:
                os.link(tmp, target)
            except FileNotFoundError:
                if not os.path.exists(tmp):
                    raise
                os.makedirs(target.parent, exist_ok=True)  # first object of its fan-out dir
                os.link(tmp, target)
        except FileExistsError:
            return False
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EMLINK, errno.EXDEV):
                raise
            # No hard links here: an atomic rename that refuses to replace.
            os.makedirs(target.parent, exist_ok=True)
            if not rename_noreplace(tmp, target):
                return False
        if sync:
            fsync_dir(target.parent)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def rename_noreplace(src: Path, dst: Path) -> bool:
    """Atomically rename ``src`` to ``dst`` unless ``dst`` exists (False then).

    Raises OSError(ENOTSUP) where the filesystem supports neither: casfs then
    refuses to write rather than risk exposing torn files.
    """
    import ctypes

    from casfs.util.libc import libc

    at_fdcwd, rename_noreplace_flag = -100, 1
    rc = libc().renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst),
                          rename_noreplace_flag)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        return False
    if err in (errno.EINVAL, errno.ENOSYS):
        err = errno.ENOTSUP
    raise OSError(err, f"cannot create {dst} atomically: {os.strerror(err)}")


def replace_file(tmp: Path, target: Path, *, sync: bool = True) -> None:
    """Atomically replace ``target`` with ``tmp`` and make the rename durable."""
    try:
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if sync:
        fsync_dir(target.parent)


def write_atomic(target: str | os.PathLike[str], data: bytes, *, mode: int = 0o644,
                 sync: bool = True) -> None:
    """Durably replace ``target`` with ``data``; ``sync`` False: atomically only (a
    reader sees the old file or the new one whole; a system crash may keep the old)."""
    target = Path(target)
    with staged_file(target.parent, "w-", mode, sync=sync) as (f, tmp):
        f.write(data)
    replace_file(tmp, target, sync=sync)


def create_exclusive(target: str | os.PathLike[str], data: bytes, staging_dir: Path) -> bool:
    """Durably create ``target`` holding ``data``; False if it already exists."""
    target = Path(target)
    with staged_file(staging_dir, "x-", 0o444) as (f, tmp):
        f.write(data)
    return link_exclusive(tmp, target)


def sync_filesystem(path: str | os.PathLike[str]) -> None:
    """Make everything written to the filesystem holding ``path`` durable (syncfs(2))."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _libc_syncfs(fd) != 0:
            os.sync()  # no syncfs here: the whole-machine sync is correct, only slower
    finally:
        os.close(fd)


def _libc_syncfs(fd: int) -> int:
    from casfs.util.libc import libc

    global _syncfs
    if _syncfs is None:
        try:
            _syncfs = libc().syncfs
        except (OSError, AttributeError):
            return -1
    return int(_syncfs(fd))


_syncfs: Any = None
