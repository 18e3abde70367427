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

Other users write a multi-user root (they own their namespace directories and
object fan-out directories they made first), so every key is reached beneath
the root's directory through ``casfs.util.beneath``: no symlink followed, and no
mount point crossed. A user may mount a FUSE file system of her own on a
directory she owns there, and where /etc/fuse.conf has ``user_allow_other`` a
stat or open by root inside it waits on her server, which need never answer
(casfsd's attach, gc, report, verify hung for good: found by a review on
2026-12-06). A key under such a mount is a refusal (EXDEV), as a symlink is: a
miss for a reader, an error for a writer.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
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

    def _rel(self, key: str) -> str:
        return self._spath(key)[len(self._root) + 1:]

    def _base(self) -> int:
        """An O_PATH fd of the root directory (the caller closes it)."""
        return os.open(self._root, beneath.DIR_FLAGS | os.O_CLOEXEC)

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
        fd, name = self._dir_fd(key)
        try:
            yield Path(f"/proc/self/fd/{fd}/{name}")
        finally:
            os.close(fd)

    def _dir_fd(self, key: str) -> tuple[int, str]:
        """(fd of ``key``'s directory, made if missing, beneath the root as opened; the
        key's last name): ``_beneath``'s parts."""
        *dirs, name = self._rel(key).split("/")
        base = self._base()
        try:
            self._check_ident(base)
            return (beneath.mkdirs(base, "/".join(dirs)) if dirs else os.dup(base)), name
        finally:
            os.close(base)

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
        fd, name = self._dir_fd(key)
        try:
            target = Path(f"/proc/self/fd/{fd}/{name}")
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISDIR(beneath.lstat(fd, name).st_mode):  # (never into a mount)
                    # rename() cannot replace a directory: move it into staging,
                    # where gc removes it after the grace period.
                    os.rename(target, atomic.temp_name(self.staging_dir, "damaged-"))
            atomic.replace_file(staged, target, sync=False)
        finally:
            os.close(fd)

    def create_exclusive(self, key: str, data: bytes) -> bool:
        with self._beneath(key) as target:
            return atomic.create_exclusive(target, data, self.staging_dir)

    def open(self, key: str) -> BinaryIO:
        # Reached beneath the root (no symlink, no mount point on the way: the module's
        # docstring) and never blocking: a FIFO planted under objects/ must not hang a
        # reader, nor a symlink make it read /etc/passwd. Opened O_PATH and fstat()ed
        # first, so a device node is never even opened; then that same inode is opened
        # for reading through its /proc entry.
        base = self._base()
        try:
            fd = beneath.open(base, self._rel(key), os.O_PATH)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EXDEV):
                raise NotRegularFileError(errno.EINVAL, "not a regular file (a symbolic link"
                                          " or another mount on its path)", key) from None
            raise
        finally:
            os.close(base)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise NotRegularFileError(errno.EINVAL, "not a regular file", key)
            rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        finally:
            os.close(fd)
        return os.fdopen(rfd, "rb")

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        with self.open(key) as f:  # the same checks: regular files only, never blocking
            return os.pread(f.fileno(), length, offset) if length > 0 else b""

    def info(self, key: str) -> KeyInfo | None:
        """None if absent, or reached only through a symlink or another mount (absent to
        a reader; a write there is refused). The name itself is looked at: a dangling
        symlink exists too."""
        base = self._base()
        try:
            st = beneath.lstat(base, self._rel(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EXDEV):
                return None
            raise
        finally:
            os.close(base)
        return KeyInfo(st.st_size, st.st_mtime)

    def touch(self, key: str) -> None:
        with contextlib.suppress(OSError):  # best effort: read-only roots still serve
            base = self._base()
            try:
                now = time.time_ns()
                beneath.utime(base, self._rel(key), (now, now))
            finally:
                os.close(base)

    def list(self, prefix: str) -> Iterator[str]:
        base = self._base()
        try:
            names = beneath.names(base, self._rel(prefix) if prefix else "")
        except (FileNotFoundError, NotADirectoryError):
            return iter(())
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.EXDEV):
                raise
            log.warning("not listing %s in the shared root: a symbolic link or another"
                        " mount on its path", prefix)
            return iter(())
        finally:
            os.close(base)
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
        *dirs, name = self._rel(key).split("/")
        base = self._base()
        try:
            fd = beneath.open_dir(base, "/".join(dirs)) if dirs else os.dup(base)
        except OSError as e:
            if e.errno == errno.EXDEV:  # another mount on the way: refused as a symlink is
                raise OSError(errno.ELOOP, "another mount on the way", key) from None
            raise
        finally:
            os.close(base)
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
                        " symbolic link, another mount or not a directory", key)
            return
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            if key.startswith("tmp/untrusted-"):
                # A namespace directory moved aside by casfs.store.tenancy: the whole
                # tree is garbage once gc's grace has passed.
                beneath.rmtree(fd, name)  # (never into a mount of hers there)
                return
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=fd)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
        finally:
            os.close(fd)

    def staging_entries(self) -> Iterator[tuple[str, float]]:
        """(name, age in seconds) of each file in the staging directory (each looked at
        beneath it: a planted symlink as tmp/, or a mount of someone's there, is left)."""
        now = time.time()
        base = self._base()
        try:
            fd = beneath.open_dir(base, "tmp")
            names = beneath.names(fd, "")
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
                log.warning("%s is not a directory (a symbolic link, another mount?): not"
                            " collecting it", self.staging_dir)
            return  # (FileNotFoundError: nothing staged there to collect)
        finally:
            os.close(base)
        try:
            for name in names:
                with contextlib.suppress(OSError):  # gone, or a mount point: not ours
                    yield name, now - beneath.lstat(fd, name).st_mtime
        finally:
            os.close(fd)
