"""The storage backend interface under the object store, and its POSIX implementation.

The object and generation layers speak only these few verbs, over keys that
are '/'-separated relative names (``objects/ab/cd...``,
``namespaces/ns/generations/000000000001``). A later object-storage backend
implements the same verbs (put-if-absent = conditional PUT, create-exclusive =
If-None-Match): ``casfs.store.s3backend.S3Backend``. Both pass the same
conformance suite (tests/store/test_backend_conformance.py).

``LocalBackend`` is for a POSIX directory seen by every node (local disk,
NFS, Lustre, CephFS, WEKA). It never rewrites or modifies a name in place: new
content is staged in ``<root>/tmp``, fsynced, and linked into place
(casfs.util.atomic holds the durability policy).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from casfs.util import atomic, beneath

log = logging.getLogger(__name__)


class NotRegularFileError(OSError):
    """A key names something that is not a regular file (symlink, FIFO, directory, device).

    Never followed, never read: for an object it means corrupt (a miss, repaired
    by writing the object again); for a record, damage.
    """


@dataclass(frozen=True, slots=True)
class KeyInfo:
    size: int
    mtime: float


class Backend(Protocol):
    """The verbs the store needs from shared storage."""

    staging_dir: Path
    """A node-visible directory where complete files are staged before put_if_absent."""

    remote: bool
    """Each request is a round trip on a network (an object store): callers prefer one
    request that settles a question to a check before it (a POSIX stat is cheap)."""

    def put_if_absent(self, key: str, staged: Path) -> bool:
        """Store the complete file ``staged`` as ``key`` unless ``key`` exists.

        Returns True if this call created it. ``staged`` is consumed either way.
        Not durable by itself: see ``sync``.
        """
        ...

    def sync(self) -> None:
        """Make every earlier put_if_absent durable (called before writing a record)."""
        ...

    def replace(self, key: str, staged: Path) -> None:
        """Atomically replace ``key`` with ``staged`` (repairing a damaged object only)."""
        ...

    def create_exclusive(self, key: str, data: bytes) -> bool:
        """Create ``key`` holding ``data`` atomically; False if it already exists."""
        ...

    def open(self, key: str) -> BinaryIO:
        """Open ``key`` for reading; FileNotFoundError if absent."""
        ...

    def info(self, key: str) -> KeyInfo | None:
        """Size and mtime of ``key``, None if absent."""
        ...

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes of ``key`` from ``offset`` (pack members); FileNotFoundError."""
        ...

    def touch(self, key: str) -> None:
        """Best effort only (object stores cannot): nothing may depend on it, gc included."""
        ...

    def list(self, prefix: str) -> Iterator[str]:
        """Names directly under the directory-like ``prefix`` (no trailing '/')."""
        ...

    def list_after(self, prefix: str, after: str) -> Iterator[str]:
        """``list(prefix)``'s names that sort after ``after``: on an object store one
        request from there (S3's start-after), not the whole directory."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key``; absent is not an error."""
        ...

    def staging_entries(self) -> Iterator[tuple[str, float]]:
        """(name, age in seconds) of shared staging leftovers gc may remove."""
        ...


class LocalBackend:
    """A Backend over a POSIX directory."""

    remote = False

    def __init__(self, root: Path) -> None:
        self.root = root
        self._root = str(root)
        self.staging_dir = root / "tmp"
        self._ident: tuple[int, int] | None = None  # the root directory's, at first use
        with contextlib.suppress(OSError):
            st = os.stat(self._root)
            self._ident = (st.st_dev, st.st_ino)

    def _path(self, key: str) -> Path:
        return Path(self._spath(key))

    def _spath(self, key: str) -> str:
        # Keys are built by casfs itself from validated parts; check anyway (not
        # with assert: python -O would drop the check). A str: pathlib's join cost
        # more than the lstat of a promotion's probe.
        if key.startswith("/") or ".." in key.split("/") or "\0" in key:
            raise ValueError(f"storage key escapes the root: {key!r:.120}")
        return f"{self._root}/{key}"

    @contextlib.contextmanager
    def _beneath(self, key: str) -> Iterator[Path]:
        """``key``'s path through an fd of its directory, made (``mkdir -p``) and reached
        beneath the root with no symlink followed (ELOOP or ENOTDIR otherwise).

        Others write the shared root (a tenant owns her namespace directories, and
        object fan-out directories she made first): one who swaps a directory for a
        symlink while root writes a key (gc merging her outcome records) must never
        redirect the write outside the root. ``/proc/self/fd/<fd>/<name>`` names
        the directory opened, not a path resolved again.
        """
        *dirs, name = self._spath(key)[len(self._root) + 1:].split("/")
        base = os.open(self._root, beneath.DIR_FLAGS | os.O_CLOEXEC)
        try:
            self._check_ident(base)
            fd = beneath.mkdirs(base, "/".join(dirs)) if dirs else os.dup(base)
        finally:
            os.close(base)
        try:
            yield Path(f"/proc/self/fd/{fd}/{name}")
        finally:
            os.close(fd)

    def _check_ident(self, fd: int) -> None:
        """Writes go only into the directory opened: a shared filesystem unmounted under
        a running node leaves its bare mount point, and a publication there would say
        it published while nothing reached the root (ESTALE: the caller retries later)."""
        st = os.fstat(fd)
        if self._ident is None:
            self._ident = (st.st_dev, st.st_ino)
        elif (st.st_dev, st.st_ino) != self._ident:
            raise OSError(errno.ESTALE, f"shared root {self._root} is no longer the directory"
                          " casfs opened (its filesystem unmounted, or the directory"
                          " replaced): nothing is written there")

    def put_if_absent(self, key: str, staged: Path) -> bool:
        with self._beneath(key) as target:
            return atomic.link_exclusive(staged, target, sync=False)

    def sync(self) -> None:
        atomic.sync_filesystem(self.root)

    def replace(self, key: str, staged: Path) -> None:
        with self._beneath(key) as target:
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISDIR(os.lstat(target).st_mode):
                    # rename() cannot replace a directory: move it into staging,
                    # where gc removes it after the grace period.
                    os.rename(target, atomic.temp_name(self.staging_dir, "damaged-"))
            atomic.replace_file(staged, target, sync=False)

    def create_exclusive(self, key: str, data: bytes) -> bool:
        with self._beneath(key) as target:
            return atomic.create_exclusive(target, data, self.staging_dir)

    def open(self, key: str) -> BinaryIO:
        path = self._path(key)
        # Not following links and not blocking: a FIFO planted under objects/
        # must not hang a reader, nor a symlink make it read /etc/passwd. lstat
        # first so a device node is never even opened; fstat after, so a name
        # swapped in between is caught too.
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(errno.EINVAL, "not a regular file", str(path))
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise NotRegularFileError(errno.EINVAL, "not a regular file", str(path)) from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise NotRegularFileError(errno.EINVAL, "not a regular file", str(path))
        return os.fdopen(fd, "rb")

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        with self.open(key) as f:  # the same checks: regular files only, never blocking
            return os.pread(f.fileno(), length, offset) if length > 0 else b""

    def info(self, key: str) -> KeyInfo | None:
        try:
            st = os.lstat(self._spath(key))  # the name itself: a dangling symlink exists too
        except (FileNotFoundError, NotADirectoryError):
            return None
        return KeyInfo(st.st_size, st.st_mtime)

    def touch(self, key: str) -> None:
        with contextlib.suppress(OSError):  # best effort: read-only roots still serve
            os.utime(self._spath(key), follow_symlinks=False)

    def list(self, prefix: str) -> Iterator[str]:
        try:
            with os.scandir(self._path(prefix) if prefix else self.root) as it:
                names = [e.name for e in it]
        except (FileNotFoundError, NotADirectoryError):
            return iter(())
        return iter(sorted(names))

    def list_after(self, prefix: str, after: str) -> Iterator[str]:
        return (n for n in self.list(prefix) if n > after)

    def _parent_fd(self, key: str) -> tuple[int, str]:
        """A directory fd on ``key``'s parent, reached below the root without following
        a symlink at any step, and ``key``'s last name.

        The root is shared and writable by others: a planted ``tmp -> /etc`` (or
        ``objects/ab -> /home/x``) must never let gc unlink outside it. ELOOP or
        ENOTDIR if a directory on the way is a symlink or not a directory.
        """
        *dirs, name = self._spath(key)[len(self._root) + 1:].split("/")
        fd = os.open(self._root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in dirs:
                sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=fd)
                os.close(fd)
                fd = sub
        except BaseException:
            os.close(fd)
            raise
        return fd, name

    def delete(self, key: str) -> None:
        try:
            fd, name = self._parent_fd(key)
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            log.warning("not deleting %s: a directory on its path in the shared root is a"
                        " symbolic link or not a directory", key)
            return
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            if key.startswith("tmp/untrusted-"):
                # A namespace directory moved aside by casfs.store.tenancy: the whole
                # tree is garbage once gc's grace has passed.
                shutil.rmtree(name, dir_fd=fd, ignore_errors=True)
                return
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=fd)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
        finally:
            os.close(fd)

    def staging_entries(self) -> Iterator[tuple[str, float]]:
        """(name, age in seconds) of each file in the staging directory."""
        now = time.time()
        with contextlib.suppress(OSError):
            if not stat.S_ISDIR(os.lstat(self.staging_dir).st_mode):
                # A symlink planted as tmp/: its target is not ours to collect.
                log.warning("%s is not a directory (a symbolic link?): not collecting it",
                            self.staging_dir)
                return
        try:
            with os.scandir(self.staging_dir) as it:
                for e in it:
                    with contextlib.suppress(FileNotFoundError):
                        yield e.name, now - e.stat(follow_symlinks=False).st_mtime
        except (FileNotFoundError, NotADirectoryError):  # nothing staged there to collect
            return
