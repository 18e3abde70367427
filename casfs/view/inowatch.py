"""A recursive inotify watch of a directory a tenant writes, read in batches.

The overlay's upper and a dir-mode directory are watched for what the
promoter needs (casfs.view.dirmode's ``_Handler``: writes, closes, creates,
moves, deletes, and in dir mode opens). Why not watchdog's observer: its
reader sleeps in poll(), and the kernel wakes a poller on every event it
queues, a wakeup paid in the writer's own syscalls. A Triton put queues ~7
events: watched that way, overlay writes took 1.45x a bare overlayfs, with
this watch 1.21x, unwatched 1.1-1.15x (docs/performance.md, "Overlay writes:
the upper's watch, read in batches").
Here, while events flow, the reader sleeps ``GATHER_S`` between reads (the
queue fills with no one to wake) and drains it whole, as casfs.view.opens
does for fanotify. The promoter waits seconds for a file to be stable, so a
batch's delay changes nothing it decides.

Safety: the tree is the tenant's, who can swap a directory for a symlink at
any moment. Every directory is opened beneath the root with no symlink
followed (casfs.util.beneath), watched through that fd (its /proc/self/fd
name is exactly the inode opened) and listed from it: a watch never lands
outside the tree. A directory moved out of the tree has its watches removed
(their events would otherwise be named as if inside).

What the kernel's queue cannot carry (IN_Q_OVERFLOW: more than
max_queued_events unread) is recovered by walking the tree again (at most
once per ``OVERFLOW_WALK_S``): every file is reported created and every file
being written as closed, which makes the promoter look at all of them (it
skips what is unchanged).

``flush`` tells the sink, in the caller's thread, everything queued until
then, and whether the watch has missed nothing since it started: then a
release or ``casfs publish`` needs no walk of the whole tree (in dir mode the
tree holds every restored file: a walk of 4,800 was 0.15 s on every last
job's way out, of 100,000 seconds). The kernel queues an event within the
writer's own syscall, so once the writer returned, its event is in the queue.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import struct
import threading
import time
from typing import Protocol

from casfs.util import beneath
from casfs.util.libc import libc

log = logging.getLogger(__name__)

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_OPEN = 0x20
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_ISDIR = 0x40000000

MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
        | IN_DELETE | IN_ONLYDIR)
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name
READ_BYTES = 1 << 16
READS = 16  # at most this many reads a drain (~30,000 events)
# While events flow the reader sleeps GATHER_S after each drain. A drain of more
# than BUSY_EVENTS (a burst a tenth of the kernel's default queue, 16,384) reads
# again at once instead, so the queue never fills while it sleeps.
GATHER_S = 0.05
BUSY_EVENTS = 1600
PAIR_WAIT_MS = 5  # how long a move's second half may trail its first in the queue
# At most one walk of the whole tree per this long, however often the queue overflows
# (a tarball of 100,000 files unpacked into a dir-mode cache overflows it again and
# again: a walk each time would be quadratic); one due meanwhile waits its turn.
OVERFLOW_WALK_S = 2.0
FLUSH_S = 2.0  # how long a flush may drain writers that keep writing
# Opening a directory to watch it: nothing there to watch (gone, not a directory, a
# symlink now: never followed), so nothing beneath it goes untold.
_NOTHING_THERE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EXDEV)


def watch_budget() -> int:
    """Watches one tree may hold: an eighth of fs.inotify.max_user_watches. Watches
    count against root's limit, node-wide: a tenant making directories by the
    million must not use them all up for everyone else (systemd's path units, the
    node's other mounts). Beyond it, directories go unwatched and their files are
    found by the rescans. (The kernel's default limit is 1% of memory's worth, at
    most 1,048,576: 131,072 directories a tree; 192,540 on this 24 GiB machine.)"""
    try:
        with open("/proc/sys/fs/inotify/max_user_watches") as f:
            return max(1024, int(f.read()) // 8)
    except (OSError, ValueError):
        return 1024


class Sink(Protocol):
    """Where the events go: relative paths, in the order the kernel queued them."""

    def opened(self, rels: list[str]) -> None: ...  # a batch: the opens of one drain
    def written(self, rel: str) -> None: ...
    def closed(self, rel: str) -> None: ...
    def created(self, rel: str) -> None: ...
    def changed(self, rel: str) -> None: ...  # its mode or times (chmod, utime)
    def moved(self, src: str, dest: str) -> None: ...
    def removed(self, rel: str) -> None: ...
    def overflowed(self) -> None: ...


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


class TreeWatch:
    """Watches ``directory`` and everything beneath it, feeding ``sink`` from one
    thread. ``start`` adds the watches (raises OSError if the root cannot be
    watched); ``stop`` and ``join`` end it. ``opens``: report IN_OPEN of files too."""

    def __init__(self, directory: str | os.PathLike[str], sink: Sink, *,
                 opens: bool = False) -> None:
        self.directory = os.fspath(directory)
        self.sink = sink
        self.mask = MASK | (IN_OPEN if opens else 0)
        self.events = 0  # events read, and the reads that found them (for tests, status)
        self.drains = 0
        self.overflows = 0
        self.errors = 0  # events a sink failed on
        self.walks = 0  # walks of the whole tree after an overflow
        self._walk_due: float | None = None
        self._last_walk = -OVERFLOW_WALK_S
        self._fd = -1
        self._base = -1
        self._paths: dict[int, str] = {}  # wd -> directory, relative ("" is the root)
        self._wds: dict[str, int] = {}
        self._warned = False  # about running out of watches: once per tree
        self._budget = watch_budget()
        # False once anything may have gone untold (an overflow, a directory not
        # watched or not listed, a sink's error, the reader's end): see ``flush``.
        self.lossless = True
        self._lock = threading.Lock()
        # Held around every read of the queue and its dispatch (the reader's, a flush's)
        # and around closing it: one reader at a time, never of a closed (reused) fd.
        self._drain_lock = threading.RLock()
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="casfs-tree-watch", daemon=True)

    # --- life ------------------------------------------------------------------------
    def start(self) -> TreeWatch:
        self._fd = _check(libc().inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC), "inotify_init1")
        try:
            self._base = beneath.open_base(self.directory)
            self._add_tree("", report=False)
            if "" not in self._wds:
                raise OSError(errno.ENOENT, f"cannot watch {self.directory}")
        except BaseException:
            self._close()
            raise
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:  # never a write to an fd number the thread closed and reused
            if self._stop_w >= 0:
                with contextlib.suppress(OSError):
                    os.write(self._stop_w, b"!")

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def flush(self, limit_s: float = FLUSH_S) -> bool:
        """Tell the sink, in this thread, every event queued until now (a writer's
        events are queued by its own syscalls). True if nothing was missed since the
        watch started, so that the sink knows every change: False after an overflow,
        a directory not watched or not listed, a sink's error, once the reader has
        stopped, or if writers outpace the drain for ``limit_s`` (the caller walks the
        tree instead)."""
        if not self.lossless:
            return False  # (and no wait on the reader's walk of the tree after an overflow)
        deadline = time.monotonic() + limit_s
        with self._drain_lock:
            if self._fd < 0 or not self._thread.is_alive():
                return False
            while self._drain() >= BUSY_EVENTS:
                if time.monotonic() > deadline:
                    return False
            return self.lossless

    def _close(self) -> None:
        with self._drain_lock, self._lock:
            for fd in (self._fd, self._base, self._stop_r, self._stop_w):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._fd = self._base = self._stop_r = self._stop_w = -1

    def _run(self) -> None:
        # poll, not select: the mount process may hold fds past select's 1,024
        either = select.poll()
        either.register(self._fd, select.POLLIN)
        either.register(self._stop_r, select.POLLIN)
        stopped = select.poll()
        stopped.register(self._stop_r, select.POLLIN)
        try:
            while True:
                due = self._walk_due
                wait = None if due is None else max(0.0, (due - time.monotonic()) * 1000)
                ready = either.poll(wait)
                if any(fd == self._stop_r for fd, _ in ready):
                    return
                with self._drain_lock:
                    self._walk_if_due()
                    drained = self._drain() if ready else 0
                if not ready:
                    continue
                # events are flowing: gather, rather than be woken per event
                if drained < BUSY_EVENTS and stopped.poll(GATHER_S * 1000):
                    return
        except Exception:  # a bug here must not take the mount down
            self.lossless = False
            log.exception("watching %s stopped", self.directory)
        finally:
            self.lossless = False  # nothing is told from now on
            self._close()

    # --- events ----------------------------------------------------------------------
    def _read(self, wait_ms: int = 0) -> list[tuple[int, int, int, bytes]]:
        """The events queued now, up to READS reads (after waiting up to ``wait_ms``
        for the first)."""
        if wait_ms:
            p = select.poll()
            p.register(self._fd, select.POLLIN)
            if not p.poll(wait_ms):
                return []
        out: list[tuple[int, int, int, bytes]] = []
        for _ in range(READS):  # writers faster than this thread: dispatch, then go on
            try:
                buf = os.read(self._fd, READ_BYTES)
            except BlockingIOError:
                break
            off = 0
            while off + _EVENT.size <= len(buf):
                wd, mask, cookie, n = _EVENT.unpack_from(buf, off)
                name = buf[off + _EVENT.size:off + _EVENT.size + n].rstrip(b"\0")
                off += _EVENT.size + n
                out.append((wd, mask, cookie, name))
        return out

    def _drain(self) -> int:
        events = self._read()
        # A rename queues its two halves one after the other; a drain may fall
        # between them: wait a moment for the second before calling it a move out.
        if events and events[-1][1] & IN_MOVED_FROM:
            events += self._read(PAIR_WAIT_MS)
        self.events += len(events)
        self.drains += 1
        self._dispatch(events)
        return len(events)

    def _rel(self, wd: int, name: bytes) -> str | None:
        d = self._paths.get(wd)
        if d is None or not name:
            return None
        leaf = os.fsdecode(name)
        return f"{d}/{leaf}" if d else leaf

    def _dispatch(self, events: list[tuple[int, int, int, bytes]]) -> None:
        arrivals: dict[int, int] = {}  # cookie -> index of its IN_MOVED_TO
        for i, (_, mask, cookie, _) in enumerate(events):
            if mask & IN_MOVED_TO:
                arrivals[cookie] = i
        taken: set[int] = set()  # IN_MOVED_TOs handled with their IN_MOVED_FROM
        opens: list[str] = []  # told at the end, at once (a job's start opens thousands)
        for i in range(len(events)):
            if i in taken:
                continue
            try:
                self._event(events, i, arrivals, taken, opens)
            except Exception:  # a sink's bug (a recording that failed): the next event goes on
                self._failed()
        if opens:
            try:
                self.sink.opened(opens)
            except Exception:
                self._failed()

    def _failed(self) -> None:
        self.lossless = False
        self.errors += 1
        if self.errors == 1 or self.errors % 1000 == 0:
            log.exception("watching %s: an event not handled (%d so far)",
                          self.directory, self.errors)

    def _event(self, events: list[tuple[int, int, int, bytes]], i: int,
               arrivals: dict[int, int], taken: set[int], opens: list[str]) -> None:
        sink = self.sink
        wd, mask, cookie, name = events[i]
        if mask & IN_Q_OVERFLOW:
            self._overflowed()
            return
        if mask & IN_IGNORED:  # the watch is gone (its directory deleted, or removed)
            d = self._paths.pop(wd, None)
            if d is not None and self._wds.get(d) == wd:
                del self._wds[d]
            return
        rel = self._rel(wd, name)
        if rel is None:
            return
        is_dir = bool(mask & IN_ISDIR)
        if mask & IN_MOVED_FROM:
            j = arrivals.get(cookie)
            dest = self._rel(events[j][0], events[j][3]) if j is not None and j > i else None
            if j is not None and j > i:
                taken.add(j)
            if dest is None:  # moved out of the tree
                if is_dir:
                    self._unwatch(rel)
                sink.removed(rel)
            else:
                sink.moved(rel, dest)
                if is_dir and rel in self._wds:
                    self._rename(rel, dest)
                elif is_dir:  # moved before its creation was read: never watched
                    self._add_tree(dest, report=True)
        elif mask & (IN_CREATE | IN_MOVED_TO):  # IN_MOVED_TO here: moved in from outside
            sink.created(rel)
            if is_dir:
                self._add_tree(rel, report=True)
        elif mask & IN_DELETE:  # a file, or a directory with everything in it
            sink.removed(rel)
        elif is_dir:
            return  # a directory's own opens and attribute changes: nothing to promote
        elif mask & IN_MODIFY:
            sink.written(rel)
        elif mask & IN_CLOSE_WRITE:
            sink.closed(rel)
        elif mask & IN_ATTRIB:
            sink.changed(rel)
        elif mask & IN_OPEN:
            opens.append(rel)

    def _overflowed(self) -> None:
        self.lossless = False
        self.overflows += 1
        if self._walk_due is None:
            self._walk_due = max(time.monotonic(), self._last_walk + OVERFLOW_WALK_S)
        self._walk_if_due()

    def _walk_if_due(self) -> None:
        if self._walk_due is None or time.monotonic() < self._walk_due:
            return
        self._walk_due = None
        self._last_walk = time.monotonic()
        self.walks += 1
        log.warning("watching %s: the kernel's event queue overflowed (events lost; %d "
                    "overflows, %d walks): every file there is looked at again",
                    self.directory, self.overflows, self.walks)
        self.sink.overflowed()
        self._add_tree("", report=True)

    # --- watches ---------------------------------------------------------------------
    def _add_tree(self, top: str, report: bool) -> None:
        """Watch ``top`` and every directory beneath it; ``report``: each entry found is
        reported created (made before its directory's watch, it queued no event).
        A directory watched first, listed second: nothing made between is missed."""
        stack = [top]
        while stack:
            rel = stack.pop()
            if len(self._wds) >= self._budget and rel not in self._wds:
                self._unwatched(rel, f"{self._budget} directories watched already")
                continue
            try:
                fd = (os.open(f"/proc/self/fd/{self._base}", os.O_RDONLY | os.O_DIRECTORY
                              | os.O_CLOEXEC) if rel == "" else
                      beneath.open_read(self._base, rel, os.O_DIRECTORY))
            except OSError as e:  # gone meanwhile, or a symlink now: never followed
                if e.errno not in _NOTHING_THERE:  # e.g. EMFILE: its writes go untold
                    self.lossless = False
                log.debug("not watching %s/%s: %s", self.directory, rel, e)
                continue
            try:
                wd = libc().inotify_add_watch(self._fd, f"/proc/self/fd/{fd}".encode(),
                                              self.mask)
                if wd < 0:
                    err = ctypes.get_errno()
                    self._unwatched(rel, os.strerror(err) + (
                        " (fs.inotify.max_user_watches)" if err == errno.ENOSPC else ""))
                    continue
                old = self._paths.get(wd)
                if old is not None and self._wds.get(old) == wd:
                    del self._wds[old]
                self._paths[wd] = rel
                self._wds[rel] = wd
                with os.scandir(fd) as it:  # d_type: a stat by name would cross a mount
                    entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
            except OSError as e:  # what it held before its watch may go untold
                self.lossless = False
                log.debug("listing %s/%s: %s", self.directory, rel, e)
                continue
            finally:
                os.close(fd)
            for name, is_dir in entries:
                child = f"{rel}/{name}" if rel else name
                if report:
                    self.sink.created(child)
                if is_dir:
                    stack.append(child)

    def _unwatched(self, rel: str, why: str) -> None:
        self.lossless = False
        if not self._warned:
            self._warned = True
            log.warning("watching %s: %s/%s and further directories not watched: %s; "
                        "their files are promoted from rescans", self.directory,
                        self.directory, rel, why)
        else:
            log.debug("not watching %s/%s: %s", self.directory, rel, why)

    def _subtree(self, rel: str) -> list[str]:
        prefix = rel + "/"
        return [d for d in self._wds if d == rel or d.startswith(prefix)]

    def _rename(self, src: str, dest: str) -> None:
        """A watched directory moved within the tree: its watches follow it (same wds)."""
        for d in self._subtree(dest):  # whatever was at dest is gone
            self._paths.pop(self._wds.pop(d), None)
        for d in self._subtree(src):
            wd = self._wds.pop(d)
            new = dest + d[len(src):]
            self._paths[wd] = new
            self._wds[new] = wd

    def _unwatch(self, rel: str) -> None:
        """A directory moved out of the tree: its watches would name outside paths."""
        for d in self._subtree(rel):
            wd = self._wds.pop(d)
            self._paths.pop(wd, None)
            libc().inotify_rm_watch(self._fd, wd)

