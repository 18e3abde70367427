"""The ``dir`` view mode: a plain directory, restored by copy and watched with inotify.

For hosts without FUSE (a container without /dev/fuse). The store, index,
promotion and publication are the same as in the FUSE mode; two things differ:

- restore is eager: every lower file is fetched, verified and *copied* into
  the directory at start (and after a refresh). Copies, never hard links
  into the local object cache: the linker truncates and rewrites ``.so``
  files in place, which would corrupt a shared cache object. A file that
  already exists locally is left alone (local shadows lower), and an object
  that fails to fetch is skipped: a miss.
- restored files are recognised, never re-hashed: ``RestoreStamps`` keeps the
  (size, mtime_ns, inode) each restored file had when casfs linked it into
  place (kept in memory, and in the node state dir across restarts), and a
  file whose size and mtime_ns equal its lower entry's is the published file
  (restore sets that mtime; a job writing other bytes gets its own mtime).
  Promotion asks ``RestoreStamps.unchanged`` before hashing.
- writes are observed through inotify (watchdog) instead of FUSE handlers.
  inotify cannot tell a read open from a write open, so a file counts as
  open for writing from its first IN_MODIFY to its IN_CLOSE_WRITE.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileOpenedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
    FileSystemMovedEvent,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

from casfs.errors import CasfsError
from casfs.index.tree import LowerTree
from casfs.promote.tracker import WriteTracker
from casfs.store.entry import Entry
from casfs.util.atomic import temp_name, write_atomic
from casfs.util.counters import Counters
from casfs.view.lower import ObjectFetcher

log = logging.getLogger(__name__)


class RestoreStamps:
    """What each restored file looked like when casfs put it in place.

    ``unchanged(rel, st)`` is True for a file casfs restored and nobody has
    touched since (same size, mtime_ns and inode: a rename over it or an
    in-place rewrite changes one of them), and for a file whose size and
    mtime_ns equal its lower entry's (restored by an earlier process or node
    into this same directory). Such files are published already: promotion
    skips them without hashing. Safe to call from any thread.
    """

    def __init__(self, path: Path | None, lower: LowerTree | None = None) -> None:
        self.path = path  # persisted here (node state dir); None: memory only
        self.lower = lower
        self._stamps: dict[str, tuple[int, int, int]] = {}
        if path is not None:
            try:
                self._stamps = {k: (v[0], v[1], v[2]) for k, v in
                                json.loads(path.read_bytes()).items()}
            except (OSError, ValueError, TypeError, IndexError, AttributeError):
                self._stamps = {}

    def __len__(self) -> int:
        return len(self._stamps)

    def add(self, rel: str, st: os.stat_result) -> None:
        self._stamps[rel] = (st.st_size, st.st_mtime_ns, st.st_ino)

    def unchanged(self, rel: str, st: os.stat_result) -> bool:
        if self._stamps.get(rel) == (st.st_size, st.st_mtime_ns, st.st_ino):
            return True
        if self.lower is None:
            return False
        e = self.lower.lookup(rel)
        return isinstance(e, Entry) and (e.size, e.mtime_ns) == (st.st_size, st.st_mtime_ns)

    def save(self) -> None:
        if self.path is not None:
            write_atomic(self.path, json.dumps(self._stamps, separators=(",", ":")).encode())


def restore(
    directory: Path, entries: Iterable[Entry], fetcher: ObjectFetcher, counters: Counters,
    stamps: RestoreStamps | None = None,
    present: Callable[[Entry, str], bytes | None] | None = None,
) -> list[Entry]:
    """Copy every entry not present in ``directory`` into it; returns the entries written.

    Each file written is stamped in ``stamps`` as soon as it is in place, before
    promotion can see it.
    """
    written: list[Entry] = []
    for e in entries:
        target = directory / e.path
        if os.path.lexists(target):
            continue
        try:
            src = fetcher.fetch(e)
        except CasfsError as err:
            counters.inc("fetch_errors")
            log.warning("not restoring %s: %s", e.path, err)
            continue
        tmp = temp_name(target.parent, "restore-")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            data = present(e, src) if present is not None else None
            if data is None:
                shutil.copyfile(src, tmp)
            else:  # a family rewrites it for this directory's path (casfs.families)
                with open(tmp, "wb") as f:
                    f.write(data)
            os.chmod(tmp, e.mode & 0o777)
            os.utime(tmp, ns=(e.mtime_ns, e.mtime_ns))
            # link, not rename: a file the job created meanwhile must win.
            os.link(tmp, target)
            if stamps is not None:
                stamps.add(e.path, os.lstat(target))
        except FileExistsError:
            continue
        except OSError as err:
            counters.inc("restore_errors")
            log.warning("not restoring %s: %s", e.path, err)
            continue
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            fetcher.unpin(e.digest)
        written.append(e)
    counters.inc("restored_files", len(written))
    if stamps is not None and written:
        stamps.save()
    return written


def replace_file(directory: Path, e: Entry, fetcher: ObjectFetcher, expect: os.stat_result,
                 stamps: RestoreStamps | None = None,
                 present: Callable[[Entry, str], bytes | None] | None = None) -> bool:
    """Put the newer published version ``e`` of a replaced path in place of the local
    file, atomically (rename: a reader sees the old or the new file whole, and one
    holding the old file open keeps reading it), but only if the local file is
    still ``expect`` (same inode, size and mtime) just before the rename. False
    if it changed or the fetch failed (the local file stays)."""
    target = directory / e.path
    try:
        src = fetcher.fetch(e)
    except CasfsError as err:
        log.warning("not refreshing %s: %s", e.path, err)
        return False
    tmp = temp_name(target.parent, "restore-")
    try:
        data = present(e, src) if present is not None else None
        if data is None:
            shutil.copyfile(src, tmp)
        else:
            with open(tmp, "wb") as f:
                f.write(data)
        os.chmod(tmp, e.mode & 0o777)
        os.utime(tmp, ns=(e.mtime_ns, e.mtime_ns))
        st = os.lstat(target)
        if (st.st_ino, st.st_size, st.st_mtime_ns) != (
                expect.st_ino, expect.st_size, expect.st_mtime_ns):
            return False  # the job rewrote it meanwhile: its version stays
        os.rename(tmp, target)
        if stamps is not None:
            stamps.add(e.path, os.lstat(target))
            stamps.save()
        return True
    except OSError as err:
        log.warning("not refreshing %s: %s", e.path, err)
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        fetcher.unpin(e.digest)


class _Handler(FileSystemEventHandler):
    """Feeds inotify events into the WriteTracker (paths relative to the directory)."""

    def __init__(self, directory: Path, tracker: WriteTracker,
                 on_open: Callable[[str], object] | None = None) -> None:
        self.directory = str(directory)
        self.tracker = tracker
        self.on_open = on_open
        self.writing: set[str] = set()

    def _rel(self, path: str | bytes) -> str | None:
        p = os.fsdecode(path)
        rel = os.path.relpath(p, self.directory)
        return None if rel.startswith("..") or rel == "." else rel

    def on_any_event(self, event: FileSystemEvent) -> None:
        rel = self._rel(event.src_path)
        if rel is None:
            return
        if isinstance(event, FileOpenedEvent):  # IN_OPEN: retention by use, profiles
            if self.on_open is not None:
                self.on_open(rel)
        elif isinstance(event, FileModifiedEvent):
            if rel not in self.writing:
                self.writing.add(rel)
                self.tracker.opened_for_write(rel)
            else:
                self.tracker.modified(rel)
        elif isinstance(event, FileClosedEvent):  # IN_CLOSE_WRITE
            if rel in self.writing:
                self.writing.discard(rel)
                self.tracker.closed_for_write(rel)
            else:
                self.tracker.modified(rel)
        elif isinstance(event, FileCreatedEvent | DirCreatedEvent):
            self.tracker.modified(rel)
        elif isinstance(event, FileSystemMovedEvent):
            dest = self._rel(event.dest_path)
            if rel in self.writing:
                self.writing.discard(rel)
                if dest is not None:
                    self.writing.add(dest)
            if dest is None:
                self.tracker.removed(rel)
            else:
                self.tracker.renamed(rel, dest)
        elif isinstance(event, FileDeletedEvent) or event.event_type == "deleted":
            self.writing.discard(rel)
            self.tracker.removed(rel)


def watch(directory: Path, tracker: WriteTracker,
          on_open: Callable[[str], object] | None = None) -> BaseObserver:
    """Start watching ``directory`` recursively; the caller stops and joins the observer.

    ``on_open(rel)``: a file was opened (any mode, any process: inotify's
    IN_OPEN, which the watch receives anyway; this process's own reads too)."""
    observer = Observer()
    # Only the events the handler uses reach this process: watchdog would otherwise
    # subscribe to IN_CLOSE_NOWRITE (every read) and, without on_open, IN_OPEN.
    wanted: list[type[FileSystemEvent]] = [
        FileModifiedEvent, FileClosedEvent, FileCreatedEvent, DirCreatedEvent,
        FileMovedEvent, DirMovedEvent, FileDeletedEvent, DirDeletedEvent]
    if on_open is not None:
        wanted.append(FileOpenedEvent)
    observer.schedule(_Handler(directory, tracker, on_open), str(directory), recursive=True,
                      event_filter=wanted)
    observer.start()
    return observer


def open_for_writing(directory: Path, rels: list[str]) -> set[str]:
    """Which of ``rels`` some process on this node holds open for writing (like fuser).

    inotify reports writes late and never reports a writable open, so before
    promoting in dir mode the candidates are checked against /proc: a file
    still held open for writing is not stable, whatever its last event says.
    """
    if not rels:
        return set()
    wanted = {str(directory / r): r for r in rels}
    busy: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            rel = wanted.get(target)
            if rel is None or rel in busy:
                continue
            try:
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    info = f.read()
                flags = int(info.split("flags:", 1)[1].split()[0], 8)
            except (OSError, ValueError, IndexError):
                continue
            if flags & os.O_ACCMODE != os.O_RDONLY:
                busy.add(rel)
    return busy
