"""The merged lower+upper tree, as plain synchronous filesystem operations.

No FUSE and no trio here, so the merge rules can be tested in-process. The
whiteout convention is described in casfs.view.whiteout. Paths are relative
to the mount root ('' is the root).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from casfs.store.entry import Entry
from casfs.view.lower import DIR, LowerNode, LowerTree
from casfs.view.whiteout import OPAQUE, WORK_DIR, is_reserved, merge_children, whiteout_name

log = logging.getLogger(__name__)

UpperOrLower = os.DirEntry[str] | LowerNode


def join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


def split(path: str) -> tuple[str, str]:
    parent, _, name = path.rpartition("/")
    return parent, name


@dataclass(frozen=True, slots=True)
class Node:
    """One visible path: its upper stat (if upper has it) and its visible lower node."""

    path: str
    upper: os.stat_result | None
    lower: LowerNode | None

    @property
    def is_dir(self) -> bool:
        if self.upper is not None:
            return stat.S_ISDIR(self.upper.st_mode)
        return self.lower is DIR

    @property
    def lower_file(self) -> Entry | None:
        """The lower entry when this path is served from lower only."""
        if self.upper is None and isinstance(self.lower, Entry):
            return self.lower
        return None

    @property
    def has_lower_dir(self) -> bool:
        return self.lower is DIR


class FailedPaths:
    """Lower paths whose object failed to fetch, shown as absent.

    A corrupt object is absent for the life of the mount (its bytes will not
    change); anything else (a missing object on a lagging NFS client, a
    timeout, an unreachable root) only for ``retry_after`` seconds, so a
    passing outage does not hide a path from a mount that lives for weeks.
    """

    def __init__(self, retry_after: float = 30.0) -> None:
        self.retry_after = retry_after
        self._until: dict[str, float] = {}

    def add(self, path: str, *, permanent: bool = False) -> None:
        self._until[path] = math.inf if permanent else time.monotonic() + self.retry_after

    def __contains__(self, path: object) -> bool:
        until = self._until.get(path) if isinstance(path, str) else None
        if until is None:
            return False
        if until < time.monotonic():
            del self._until[str(path)]
            return False
        return True

    def __len__(self) -> int:
        return len(self._until)


class Layers:
    def __init__(self, lower: LowerTree, upper_dir: Path) -> None:
        self.lower = lower
        self.upper_dir = Path(upper_dir)
        self.failed = FailedPaths()  # lower paths whose object failed: absent for now
        self.work_dir = self.upper_dir / WORK_DIR
        shutil.rmtree(self.work_dir, ignore_errors=True)
        self.work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)

    def up(self, path: str) -> str:
        return os.path.join(self.upper_dir, path) if path else str(self.upper_dir)

    def upper_stat(self, path: str) -> os.stat_result | None:
        try:
            return os.lstat(self.up(path))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _exists_upper(self, path: str) -> bool:
        return os.path.lexists(self.up(path))

    def lower_visible(self, path: str) -> bool:
        """Whether nothing in upper (whiteout, opaque dir, non-dir) hides lower ``path``."""
        if path in self.failed:
            return False
        if not path:
            return True
        parts = path.split("/")
        for i, name in enumerate(parts):
            parent = "/".join(parts[:i])
            st = self.upper_stat(parent)
            if st is None:
                return True  # nothing deeper exists in upper, so nothing deeper hides
            if not stat.S_ISDIR(st.st_mode):
                return False
            if self._exists_upper(join(parent, OPAQUE)) and parent:
                return False
            if self._exists_upper(join(parent, whiteout_name(name))):
                return False
        return True

    def lower_node(self, path: str) -> LowerNode | None:
        """The visible lower node at ``path`` (ignoring an upper entry at ``path`` itself)."""
        node = self.lower.lookup(path)
        if node is None or not self.lower_visible(path):
            return None
        return node

    def resolve(self, path: str) -> Node | None:
        if any(is_reserved(p) for p in path.split("/")):
            return None
        st = self.upper_stat(path)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            return Node(path, st, None)
        lnode = self.lower_node(path)
        if st is None and lnode is None:
            return None
        if st is not None and lnode is not DIR:
            lnode = None  # an upper dir over a lower file: the file is shadowed
        return Node(path, st, lnode)

    def is_opaque(self, path: str) -> bool:
        return self._exists_upper(join(path, OPAQUE))

    def children(self, node: Node) -> list[tuple[str, UpperOrLower]]:
        """Visible children of a merged directory, sorted, without duplicates."""
        upper: list[tuple[str, os.DirEntry[str]]] = []
        if node.upper is not None:
            with os.scandir(self.up(node.path)) as it:
                upper = [(e.name, e) for e in it]
        opaque = any(n == OPAQUE for n, _ in upper) and node.path != ""
        lower_iter = (
            self.lower.children(node.path) if node.has_lower_dir and not opaque else iter(())
        )
        return merge_children(
            upper,
            lower_iter,
            lower_hidden=lambda name: join(node.path, name) in self.failed,
        )

    # --- mutations of upper ---------------------------------------------
    def ensure_upper_dir(self, path: str, dir_mode: int) -> None:
        """Make ``path`` and its ancestors exist as upper directories (copy-up of dirs)."""
        if not path or self.upper_stat(path) is not None:
            return
        parent, _ = split(path)
        self.ensure_upper_dir(parent, dir_mode)
        try:
            os.mkdir(self.up(path), dir_mode)
        except FileExistsError:
            return
        os.chmod(self.up(path), dir_mode)  # not subject to the daemon's umask

    def add_whiteout(self, path: str, dir_mode: int) -> None:
        parent, name = split(path)
        self.ensure_upper_dir(parent, dir_mode)
        marker = self.up(join(parent, whiteout_name(name)))
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.close(fd)

    def remove_whiteout(self, path: str) -> bool:
        parent, name = split(path)
        try:
            os.unlink(self.up(join(parent, whiteout_name(name))))
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def has_whiteout(self, path: str) -> bool:
        parent, name = split(path)
        return self._exists_upper(join(parent, whiteout_name(name)))

    def make_opaque(self, path: str) -> None:
        fd = os.open(self.up(join(path, OPAQUE)), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.close(fd)

    def clear_markers(self, path: str) -> None:
        """Drop the markers of an upper dir with no visible children (before rmdir or rename)."""
        with os.scandir(self.up(path)) as it:
            for e in it:
                if is_reserved(e.name):
                    os.unlink(e.path)

    def stage_copy(self, src: str | None, entry: Entry) -> str:
        """Copy ``src`` (None: empty file) into the work dir with the entry's mode/mtime.

        Blocking: runs in a worker thread. Returns the staged path.
        """
        fd, tmp = _mkstemp(self.work_dir)
        try:
            if src is not None:
                with open(src, "rb") as fin, os.fdopen(os.dup(fd), "wb") as fout:
                    shutil.copyfileobj(fin, fout, 1 << 20)
            os.fchmod(fd, entry.mode & 0o777)
            os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        os.close(fd)
        return tmp

    def install_staged(self, tmp: str, path: str) -> bool:
        """Link a staged copy into place unless upper already has ``path``; always drops tmp."""
        try:
            os.link(tmp, self.up(path))
            return True
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def _mkstemp(directory: Path) -> tuple[int, str]:
    for _ in range(100):
        tmp = os.path.join(directory, f"up-{os.urandom(8).hex()}")
        try:
            return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), tmp
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, "cannot create a staging file", str(directory))
