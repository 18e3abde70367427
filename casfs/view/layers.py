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
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from casfs.store.entry import Entry
from casfs.util import beneath
from casfs.util.counters import Counters
from casfs.view import whiteout as wh
from casfs.view.lower import DIR, LowerNode, LowerTree
from casfs.view.quota import BLOCK, NamespaceQuota, link_charge
from casfs.view.whiteout import merge_children

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
        self.version = 0  # bumped on each add: resolved nodes cached before are stale

    def add(self, path: str, *, permanent: bool = False) -> None:
        self._until[path] = math.inf if permanent else time.monotonic() + self.retry_after
        self.version += 1

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


_ABSENT_MAX = 1 << 16  # remembered absent upper names (~100 B each)
_NODES_MAX = 1 << 15  # remembered lower-only nodes (~230 B each: <= 8 MB; a job's hot set)
_LISTINGS_MAX = 1 << 12  # remembered listings of lower-only directories (~0.5 KB each)


class Layers:
    def __init__(self, lower: LowerTree, upper_dir: Path,
                 counters: Counters | None = None) -> None:
        self.lower_version = 0  # bumped whenever the lower tree may have changed
        self.counters = counters  # subdir_recount: merged listings made to count subdirs
        self._lower = lower
        self._nlink: dict[str, tuple[tuple[int, ...], int]] = {}
        self.upper_dir = Path(upper_dir)
        self.failed = FailedPaths()  # lower paths whose object failed: absent for now
        self.hide_failed = True  # False: they stay shown (OpsBase.stable_names)
        self.upper_dir.mkdir(parents=True, exist_ok=True)
        # A new view of the namespace: deletions made by earlier ones end here.
        unswept: list[str] = []
        self.swept = wh.sweep(self.upper_dir, errors=unswept)
        # Whiteouts the upper may hold: after a complete sweep, only those this view
        # makes (``add_whiteout``; the mount refuses mknod of the marker's device).
        # While there are none, an upper directory's ENOTEMPTY is the job's too.
        self._whiteouts = len(unswept)
        self.work_dir = wh.work_dir_for(self.upper_dir)
        shutil.rmtree(self.work_dir, ignore_errors=True)
        self.work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Upper entries are reached relative to this fd: a path of the mount up to
        # PATH_MAX stays within PATH_MAX in the upper, whatever the upper's own path.
        self.fd = os.open(self.upper_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        weakref.finalize(self, os.close, self.fd)
        # Upper names known absent, with the creation count when that was seen. A warm
        # open of a lower file lstat'ed its upper path and an ancestor, both absent,
        # every time (two syscalls and two exceptions). Every upper entry is created
        # through the methods below, which bump ``_created`` after the change; a check
        # reads the count before its lstat, so an answer that raced a creation is
        # never kept. Removals need nothing: absent stays absent.
        self._created = 0
        self._absent: dict[str, int] = {}
        # Resolved lower-only nodes (no upper entry: nothing in them changes but by
        # a change through this class, a failed fetch or a new lower tree), keyed
        # by the count of those: a warm open, getattr or listing resolved each path
        # again (an upper lstat per ancestor, a lower lookup) on every request.
        self._changes = 0
        self._nodes: dict[str, tuple[tuple[int, int, int], Node]] = {}
        # Lower paths known absent, with the lower_version they were seen at. A served
        # tree from the index answers a miss with an LMDB read transaction, and a
        # Triton put asks ~17 times about names no lower tree has (its temporary dir,
        # the file in it, the name it is renamed to). Lower entries are only ever
        # added, each addition bumps lower_version (``lower_added``, a new tree), and
        # every lower entry comes with its directories: under an absent directory,
        # nothing is there either.
        self._lower_absent: dict[str, int] = {}
        self._listings: dict[str, tuple[tuple[int, int, int], list[tuple[str, UpperOrLower]]]] = {}
        # The tenant's bounds (casfs.view.quota), None: not counted. Every upper entry
        # is created and removed through the methods below, so they charge inodes (and
        # a directory's block) here; file bytes are charged where they are written
        # (casfs.view.op_files, op_attrs, op_copyup). ``is_open(path)``: whether a
        # handle holds the upper file at ``path`` (set by the view): a removed file
        # still open keeps its space until its last handle goes, so its charge is
        # given back then (``deferred``), not at the unlink.
        self.quota: NamespaceQuota | None = None
        self.is_open: Callable[[str], bool] = lambda path: False
        self.deferred: set[tuple[int, int]] = set()

    @property
    def lower(self) -> LowerTree:
        return self._lower

    @lower.setter
    def lower(self, lower: LowerTree) -> None:
        self._lower = lower
        self.lower_version += 1

    def up(self, path: str) -> str:
        """Absolute upper path (logs, tests, worker threads); handlers use ``rel`` + ``fd``."""
        return os.path.join(self.upper_dir, path) if path else str(self.upper_dir)

    @staticmethod
    def rel(path: str) -> str:
        return path or "."

    # --- upper operations, relative to the upper's fd ------------------------------
    def moved_above(self, path: str) -> bool:
        """Whether an upper entry on the way to ``path`` is no directory (a symlink).

        The calls here resolve ``path`` relative to the upper's fd, following its
        directories: sound for a path the kernel just looked up (it never looks up
        inside a symlink), not for one a handler held across an await (a copy-up),
        while the job renamed a directory of it away and made a symlink of that
        name. A handler checks this after its await, before using the path again.
        """
        parent = split(path)[0]
        while parent:
            try:
                os.close(beneath.open_dir(self.fd, parent))
                return False
            except FileNotFoundError:
                parent = split(parent)[0]  # not in the upper (yet): the part above that is
            except OSError as e:
                if e.errno in beneath.REFUSED:
                    return True
                raise
        return False

    def lstat(self, path: str) -> os.stat_result:
        return os.stat(self.rel(path), dir_fd=self.fd, follow_symlinks=False)

    def open(self, path: str, flags: int, mode: int = 0o777) -> int:
        """``os.open`` beneath the upper; a create (O_CREAT) charges an inode when it
        makes one (the view creates with O_EXCL: always)."""
        if not flags & os.O_CREAT:
            return os.open(self.rel(path), flags, mode, dir_fd=self.fd)
        q = self.quota
        if q is not None and not flags & os.O_EXCL:
            try:
                self.lstat(path)
                q = None  # there already: nothing made
            except FileNotFoundError:
                pass
        if q is not None:
            q.take(0, 1)
        try:
            return os.open(self.rel(path), flags, mode, dir_fd=self.fd)
        except BaseException:
            if q is not None:
                q.give(0, 1)
            raise
        finally:
            self._created += 1

    def _creating(self) -> None:
        """An upper entry may have been created (call after the change)."""
        self._created += 1
        self._changes += 1

    def _touched(self, path: str) -> None:
        """``path`` was created, removed or hidden: its directory's subdir count is stale."""
        self._changes += 1
        self._nlink.pop(split(path)[0], None)
        self._nlink.pop(path, None)

    def mkdir(self, path: str, mode: int, *, new: bool = False) -> None:
        """``new``: nothing showed at ``path`` before (a job's mkdir, not a copy-up of a
        lower directory), so its directory's kept subdir count, if exact, goes up by
        one instead of being recounted: a new Triton key dir in a cache root of N
        entries made the next GETATTR of the root merge all N (O(N) per kernel)."""
        parent = split(path)[0]
        count = self._nlink.get(parent) if new else None
        self._touched(path)
        q = self.quota
        if q is not None:
            q.take(BLOCK, 1)
        try:
            os.mkdir(self.rel(path), mode, dir_fd=self.fd)
        except BaseException:
            if q is not None:
                q.give(BLOCK, 1)
            raise
        finally:
            self._creating()
        if count is not None:  # exact before the mkdir (``_touched`` drops a stale one)
            self._nlink[parent] = (count[0], count[1] + 1)

    def mknod(self, path: str, mode: int, rdev: int = 0) -> None:
        with self._new_inode():
            os.mknod(self.rel(path), mode, rdev, dir_fd=self.fd)

    def symlink(self, target: bytes, path: str) -> None:
        with self._new_inode(link_charge(len(target))):
            os.symlink(target, os.fsencode(self.rel(path)), dir_fd=self.fd)

    @contextlib.contextmanager
    def _new_inode(self, nbytes: int = 0) -> Iterator[None]:
        """Charge one inode (and ``nbytes``) for an entry made in the block (given back
        if it fails)."""
        q = self.quota
        if q is not None:
            q.take(nbytes, 1)
        try:
            yield
        except BaseException:
            if q is not None:
                q.give(nbytes, 1)
            raise
        finally:
            self._creating()

    def _removing(self, path: str) -> os.stat_result | None:
        """lstat of ``path`` before it is removed (None: not counted, or absent)."""
        if self.quota is None:
            return None
        try:
            return self.lstat(path)
        except FileNotFoundError:
            return None

    def _removed(self, path: str, st: os.stat_result | None) -> None:
        """The name ``path`` (stat ``st`` before) is gone: give back what its entry
        counted if this was its last name; if a handle still holds it, at the last
        handle's release (``deferred``)."""
        q = self.quota
        if q is None or st is None or wh.is_whiteout(st):
            return
        if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
            q.give(0, 1)  # this name; another keeps the inode
            return
        if stat.S_ISREG(st.st_mode) and self.is_open(path):
            self.deferred.add((st.st_dev, st.st_ino))
            return
        q.give_entry(st)

    def readlink(self, path: str) -> bytes:
        return os.readlink(os.fsencode(self.rel(path)), dir_fd=self.fd)

    def link(self, src: str, dst: str) -> None:
        with self._new_inode():  # a name, counted as an inode (casfs.view.quota)
            os.link(self.rel(src), self.rel(dst), src_dir_fd=self.fd, dst_dir_fd=self.fd,
                    follow_symlinks=False)

    def unlink(self, path: str) -> None:
        self._changes += 1
        st = self._removing(path)
        os.unlink(self.rel(path), dir_fd=self.fd)
        self._removed(path, st)

    def rmdir(self, path: str) -> None:
        self._touched(path)
        os.rmdir(self.rel(path), dir_fd=self.fd)
        if self.quota is not None:
            self.quota.give(BLOCK, 1)

    def rmdir_if_empty(self, path: str) -> bool:
        """rmdir the upper directory ``path`` if it holds nothing at all; False (and
        nothing changed) if it holds entries, whiteouts included."""
        try:
            os.rmdir(self.rel(path), dir_fd=self.fd)
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            raise
        self._touched(path)
        if self.quota is not None:
            self.quota.give(BLOCK, 1)
        return True

    @property
    def whiteouts_possible(self) -> bool:
        """Whether any upper directory may hold a whiteout (see ``_whiteouts``)."""
        return self._whiteouts > 0

    def holds_visible(self, path: str) -> bool:
        """Whether the upper directory ``path`` holds anything but whiteouts (stops at
        the first such entry: no listing, no merge)."""
        if self.counters is not None:
            self.counters.inc("whiteout_scan")
        fd = self.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            with os.scandir(fd) as it:
                return any(not wh.entry_is_whiteout(e) for e in it)
        finally:
            os.close(fd)

    def rename(self, old: str, new: str) -> None:
        self._touched(old)
        self._touched(new)
        replaced = self._removing(new)  # an entry renamed over is removed
        if replaced is not None and not stat.S_ISDIR(replaced.st_mode):
            st = self._removing(old)
            if st is not None and (st.st_dev, st.st_ino) == (replaced.st_dev, replaced.st_ino):
                replaced = None  # two names of one file: rename(2) leaves both
        try:
            os.rename(self.rel(old), self.rel(new), src_dir_fd=self.fd, dst_dir_fd=self.fd)
        finally:
            self._creating()
        self._removed(new, replaced)

    def chmod(self, path: str, mode: int) -> None:
        """chmod (follows a symlink: callers never chmod one)."""
        os.chmod(self.rel(path), mode, dir_fd=self.fd)

    def lchown(self, path: str, uid: int, gid: int) -> None:
        os.chown(self.rel(path), uid, gid, dir_fd=self.fd, follow_symlinks=False)

    def utime(self, path: str, ns: tuple[int, int]) -> None:
        os.utime(self.rel(path), ns=ns, dir_fd=self.fd, follow_symlinks=False)

    def truncate(self, path: str, size: int) -> None:
        fd = self.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)

    def scandir(self, path: str) -> Iterator[os.DirEntry[str]]:
        """Entries of an upper directory (``entry.path`` is a name; ``entry.stat`` only
        works while the iteration runs: the directory's fd is closed at its end)."""
        fd = self.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            with os.scandir(fd) as it:
                yield from it
        finally:
            os.close(fd)

    def _opaque(self, path: str) -> bool:
        try:
            return wh.is_opaque(self.up(path), runtime=True)
        except OSError as e:
            if e.errno != errno.ENAMETOOLONG:
                raise
        fd = self.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            return wh.is_opaque(fd, runtime=True)
        finally:
            os.close(fd)

    def changed_elsewhere(self) -> None:
        """The upper changed other than through this class (a predecessor still draining
        writes it, casfs.node.handover): forget what was remembered of it."""
        self._created += 1
        self._changes += 1

    def raw_stat(self, path: str) -> os.stat_result | None:
        """lstat of the upper entry at ``path``, whiteouts included."""
        created = self._created
        if self._absent.get(path) == created:
            return None
        try:
            return self.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            if len(self._absent) >= _ABSENT_MAX:
                self._absent.clear()
            self._absent[path] = created
            return None

    def upper_stat(self, path: str) -> os.stat_result | None:
        """lstat of the real upper entry at ``path`` (None for nothing or a whiteout)."""
        st = self.raw_stat(path)
        return None if st is None or wh.is_whiteout(st) else st

    def lower_visible(self, path: str) -> bool:
        """Whether nothing in upper (whiteout, opaque dir, non-dir) hides lower ``path``.

        An upper entry at ``path`` itself does not count (the question is
        whether lower ``path`` would show once that entry is gone).
        """
        if self.hide_failed and path in self.failed:
            return False
        if not path:
            return True
        parts = path.split("/")
        cur = ""
        for i, name in enumerate(parts):
            if cur and self._opaque(cur):
                return False
            cur = join(cur, name)
            st = self.raw_stat(cur)
            if st is None:
                return True  # nothing deeper exists in upper, so nothing deeper hides
            if wh.is_whiteout(st):
                return False
            if not stat.S_ISDIR(st.st_mode):
                return i == len(parts) - 1
        return True

    def lower_lookup(self, path: str) -> LowerNode | None:
        """``lower.lookup(path)``, with misses remembered (see ``_lower_absent``)."""
        version = self.lower_version
        absent = self._lower_absent
        if absent.get(path) == version:
            return None
        if absent.get(path.rpartition("/")[0]) != version:
            node = self._lower.lookup(path)
            if node is not None:
                return node
        if len(absent) >= _ABSENT_MAX:
            absent.clear()
        absent[path] = version
        return None

    def lower_node(self, path: str) -> LowerNode | None:
        """The visible lower node at ``path`` (ignoring an upper entry at ``path`` itself)."""
        node = self.lower_lookup(path)
        if node is None or not self.lower_visible(path):
            return None
        return node

    def state(self) -> tuple[int, int, int]:
        """Changes so far to what any path resolves to: equal states, equal answers."""
        return (self._changes, self.lower_version, self.failed.version)

    def resolve(self, path: str) -> Node | None:
        key = (self._changes, self.lower_version, self.failed.version)
        hit = self._nodes.get(path)
        if hit is not None and hit[0] == key:
            return hit[1]
        st = self.upper_stat(path)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            return Node(path, st, None)
        lnode = self.lower_node(path)
        if st is None and lnode is None:
            return None
        if st is not None and lnode is not DIR:
            lnode = None  # an upper dir over a lower file: the file is shadowed
        node = Node(path, st, lnode)
        if st is None:  # an upper stat changes with every write: never kept
            if len(self._nodes) >= _NODES_MAX:
                self._nodes.clear()
            self._nodes[path] = (key, node)
        return node

    def is_opaque(self, path: str) -> bool:
        return bool(path) and self._opaque(path)

    def children(self, node: Node) -> list[tuple[str, UpperOrLower]]:
        """Visible children of a merged directory, sorted, without duplicates.

        A lower-only directory's listing is kept as its resolved node is (see
        ``resolve``): callers must not change the list.
        """
        # Not while any lower object failed: a failure shows again when it expires.
        if node.upper is None and not (self.hide_failed and len(self.failed)):
            key = (self._changes, self.lower_version, self.failed.version)
            hit = self._listings.get(node.path)
            if hit is not None and hit[0] == key:
                return hit[1]
            listing = self._children(node)
            if len(self._listings) >= _LISTINGS_MAX:
                self._listings.clear()
            self._listings[node.path] = (key, listing)
            return listing
        return self._children(node)

    def _children(self, node: Node) -> list[tuple[str, UpperOrLower]]:
        upper: list[tuple[str, os.DirEntry[str]]] = []
        whiteouts: list[str] = []
        if node.upper is not None:
            for e in self.scandir(node.path):
                if wh.entry_is_whiteout(e):
                    whiteouts.append(e.name)
                else:
                    upper.append((e.name, e))
        opaque = node.upper is not None and self.is_opaque(node.path)
        lower_iter = (
            self.lower.children(node.path) if node.has_lower_dir and not opaque else iter(())
        )
        return merge_children(
            upper,
            lower_iter,
            whiteouts=whiteouts,
            lower_hidden=((lambda name: join(node.path, name) in self.failed)
                          if self.hide_failed else (lambda name: False)),
        )

    def subdir_count(self, node: Node) -> int:
        """Visible subdirectories of a merged or lower directory (its link count - 2).

        Cached until a change through these methods touches the directory
        (``_touched``) or the lower tree changes: a stat of a large cache root
        must not merge its whole listing every time. (Not keyed on ctime: its
        clock is coarse, two changes may share one value.)
        """
        up = node.upper
        key = (self.lower_version,) if up is None else (self.lower_version, up.st_ino)
        hit = self._nlink.get(node.path)
        if hit is not None and hit[0] == key:
            return hit[1]
        if self.counters is not None:
            self.counters.inc("subdir_recount")
        n = 0
        for _, child in self.children(node):
            if child is DIR or (
                isinstance(child, os.DirEntry) and child.is_dir(follow_symlinks=False)
            ):
                n += 1
        if len(self._nlink) > 10_000:
            self._nlink.clear()
        self._nlink[node.path] = (key, n)
        return n

    # --- mutations of upper ---------------------------------------------
    def ensure_upper_dir(self, path: str, dir_mode: int) -> os.stat_result | None:
        """Make ``path`` and its ancestors exist as upper directories (copy-up of dirs).

        Returns the directory's stat when it already existed (None if made here):
        a create in it needs the parent's group and setgid bit, without asking again.
        """
        if not path:
            return None
        st = self.upper_stat(path)
        if st is not None:
            return st
        parent, _ = split(path)
        self.ensure_upper_dir(parent, dir_mode)
        try:
            self.mkdir(path, dir_mode)
        except FileExistsError:
            return None
        self.chmod(path, dir_mode)  # not subject to the daemon's umask
        return None

    def add_whiteout(self, path: str, dir_mode: int) -> None:
        """Hide lower ``path``, replacing a non-directory upper entry there atomically.

        The marker is made in the work dir and renamed over the name, so a
        crash never leaves the lower entry showing through in between.
        """
        parent, _ = split(path)
        self.ensure_upper_dir(parent, dir_mode)
        st = self.raw_stat(path)
        if st is not None and wh.is_whiteout(st):
            return
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "remove the directory first", path)
        self._touched(path)
        self._whiteouts += 1
        tmp = os.path.join(self.work_dir, f"wh-{os.urandom(8).hex()}")
        wh.make_whiteout(tmp)
        try:
            os.rename(tmp, self.rel(path), dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        finally:
            self._creating()
        self._removed(path, st)  # the upper entry it replaced, if any

    def remove_whiteout(self, path: str) -> bool:
        """Free the name ``path`` of its whiteout (before creating an entry there)."""
        st = self.raw_stat(path)
        if st is None or not wh.is_whiteout(st):
            return False
        self._touched(path)
        with contextlib.suppress(FileNotFoundError):
            self.unlink(path)
        return True

    def has_whiteout(self, path: str) -> bool:
        st = self.raw_stat(path)
        return st is not None and wh.is_whiteout(st)

    def make_opaque(self, path: str) -> None:
        self._touched(path)
        fd = self.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            wh.make_opaque(fd)
        finally:
            os.close(fd)

    def clear_markers(self, path: str) -> None:
        """Drop the whiteouts of an upper dir with no visible children (before rmdir or rename)."""
        markers = [e.name for e in self.scandir(path) if wh.entry_is_whiteout(e)]
        for name in markers:
            self.unlink(join(path, name))

    def stage_copy(self, src: str | None, entry: Entry, content: bytes | None = None) -> str:
        """Copy ``src`` (None: empty file; ``content``: these bytes instead) into the work
        dir with the entry's mode/mtime.

        Blocking: runs in a worker thread. Returns the staged path.
        """
        fd, tmp = _mkstemp(self.work_dir)
        try:
            if content is not None:
                with os.fdopen(os.dup(fd), "wb") as fout:
                    fout.write(content)
            elif src is not None:
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
            os.link(tmp, self.rel(path), dst_dir_fd=self.fd)
            return True
        except FileExistsError:
            return False
        finally:
            self._creating()
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
