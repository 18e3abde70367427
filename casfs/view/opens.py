"""Which files jobs open under a mount the kernel serves without casfs (overlay mode).

In overlay mode the kernel serves lower files hard-linked from the local
object cache with no FUSE request, so casfs never sees those opens. Retention
by use and access profiles need them: ``FanotifyOpens`` watches ``FAN_OPEN``
on the overlay mount (a mount mark: every open under it, by any process) and
hands each opened path, relative to the mount, to ``on_open``.

Why a mount mark on the overlay, not on the layers: overlayfs opens its lower
("real") files with notifications off, so marks on the links directory or its
filesystem see nothing (checked on Linux 6.18); the overlay's own open events
carry the overlay path.

Cost bounds:

- about one event per distinct file per *epoch*: when ``on_open`` returns
  True (the path is recorded for this epoch), the file's inode gets an ignore
  mark, so the kernel stops queueing its opens (opens that race the mark,
  queued between the first event's read and the mark, add a few);
  ``reset()`` (each epoch) drops every ignore mark (``FAN_MARK_FLUSH``) so
  files still in use are seen again.
  Ignore marks pin one overlay inode each (a few hundred bytes of kernel
  memory), bounded by the files opened in an epoch;
- events are read in batches (4 KiB, at most 170 fds at once) by one thread; each carries an fd the
  kernel opened for us (read-only, without notification), which is resolved
  with ``readlink(/proc/self/fd/N)`` and closed at once. For a file the
  overlay serves from its FUSE layer that open is one FUSE OPEN/RELEASE pair
  to the mount process (never to the FUSE thread's own call chain, so it
  cannot deadlock), once per file per epoch;
- opens by this process itself are ignored.

Needs CAP_SYS_ADMIN (as overlay mode does); ``start`` raises OSError
otherwise and the caller goes without (the FUSE layer still records the
opens it serves). Linux-only, via ctypes (Python has no fanotify module).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import select
import struct
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

FAN_CLOEXEC = 0x01
FAN_NONBLOCK = 0x02
FAN_CLASS_NOTIF = 0x00
FAN_UNLIMITED_QUEUE = 0x10
FAN_UNLIMITED_MARKS = 0x20
FAN_MARK_ADD = 0x01
FAN_MARK_MOUNT = 0x10
FAN_MARK_IGNORED_MASK = 0x20
FAN_MARK_IGNORED_SURV_MODIFY = 0x40
FAN_MARK_FLUSH = 0x80
FAN_OPEN = 0x20
FAN_Q_OVERFLOW = 0x4000
AT_FDCWD = -100
_META = struct.Struct("IBBHQii")  # struct fanotify_event_metadata
METADATA_VERSION = 3
# Each event read carries a new fd: 4 KiB holds at most 170 events, well under
# any RLIMIT_NOFILE (a 64 KiB read could need 2,730 fds at once).
READ_BYTES = 4096

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
_libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int,
                                ctypes.c_char_p]


def _check(rc: int, what: str) -> int:
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return rc


class FanotifyOpens:
    """A thread turning FAN_OPEN events under ``mountpoint`` into ``on_open(relpath)`` calls.

    ``on_open`` returns True when the path needs no more events this epoch.
    Counters: ``events`` (read), ``overflows`` (the kernel dropped events:
    only with a bounded queue, which this never asks for).
    """

    def __init__(self, mountpoint: Path, on_open: Callable[[str], bool]) -> None:
        self.mountpoint = os.fspath(mountpoint)
        self.on_open = on_open
        self.events = 0
        self.overflows = 0
        self._fd = -1
        self._stop_r, self._stop_w = -1, -1
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # marks vs reset
        self._me = os.getpid()

    def start(self) -> None:
        """Mark the mount and start reading (OSError: fanotify is not usable here)."""
        self._fd = _check(_libc.fanotify_init(
            FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK | FAN_UNLIMITED_QUEUE
            | FAN_UNLIMITED_MARKS, os.O_RDONLY | os.O_LARGEFILE | os.O_CLOEXEC),
            "fanotify_init")
        try:
            _check(_libc.fanotify_mark(self._fd, FAN_MARK_ADD | FAN_MARK_MOUNT, FAN_OPEN,
                                       AT_FDCWD, os.fsencode(self.mountpoint)),
                   f"fanotify_mark {self.mountpoint}")
        except OSError:
            os.close(self._fd)
            self._fd = -1
            raise
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="casfs-fanotify", daemon=True)
        self._thread.start()

    def reset(self) -> None:
        """A new epoch: drop every ignore mark, so each file's next open is an event."""
        with self._lock:
            if self._fd >= 0:
                with contextlib.suppress(OSError):
                    _check(_libc.fanotify_mark(self._fd, FAN_MARK_FLUSH, 0, AT_FDCWD, None),
                           "fanotify flush")

    def stop(self) -> None:
        if self._thread is not None:
            os.write(self._stop_w, b"x")
            self._thread.join(timeout=10)
            self._thread = None
        with self._lock:
            for fd in (self._fd, self._stop_r, self._stop_w):
                if fd >= 0:
                    os.close(fd)
            self._fd = self._stop_r = self._stop_w = -1

    def _run(self) -> None:
        poll = select.poll()
        poll.register(self._fd, select.POLLIN)
        poll.register(self._stop_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poll.poll()}
            if self._stop_r in ready:
                return
            try:
                buf = os.read(self._fd, READ_BYTES)
            except BlockingIOError:
                continue
            except OSError as e:  # e.g. EMFILE for the event fds: events are lost
                log.warning("fanotify read on %s: %s", self.mountpoint, e)
                continue
            self._batch(buf)

    def _batch(self, buf: bytes) -> None:
        off = 0
        while off + _META.size <= len(buf):
            length, ver, _, _, mask, fd, pid = _META.unpack_from(buf, off)
            if ver != METADATA_VERSION or length < _META.size:
                log.error("fanotify: unexpected event format %d; stopping", ver)
                return
            off += length
            self.events += 1
            if mask & FAN_Q_OVERFLOW:
                self.overflows += 1
            if fd < 0:
                continue
            try:
                if pid != self._me:
                    self._one(fd)
            finally:
                os.close(fd)

    def _one(self, fd: int) -> None:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        rel = os.path.relpath(path, self.mountpoint)
        if rel.startswith("..") or rel == "." or path.endswith(" (deleted)"):
            return
        try:
            done = self.on_open(rel)
        except Exception:  # a recording bug must not stop the watcher
            log.exception("recording an open of %s failed", rel)
            return
        if done:
            with self._lock, contextlib.suppress(OSError):  # e.g. the file is gone
                _check(_libc.fanotify_mark(
                    self._fd, FAN_MARK_ADD | FAN_MARK_IGNORED_MASK
                    | FAN_MARK_IGNORED_SURV_MODIFY, FAN_OPEN, fd, None), "ignore mark")
