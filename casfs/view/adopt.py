"""Serving a FUSE connection that another (crashed) process initialised.

The kernel keeps a FUSE connection alive while any process holds its
``/dev/fuse`` file, and queues every request for whoever reads next. A
supervisor that holds a dup of the fd (``hold``) therefore keeps a crashed
mount process's connection, its jobs' open files, mappings and cwds; a new
process can serve it if two things are dealt with:

- **INIT.** The kernel sends FUSE_INIT once per connection, and libfuse answers
  every other request EIO until it has seen one. So the adopter hands pyfuse3 a
  pipe holding a synthetic INIT (``/dev/fd/N`` as the mount point: libfuse then
  mounts nothing) and, when pyfuse3's ``init`` callback runs, ``dup2``s the held
  connection over the pipe's fd. libfuse's INIT reply then goes to the real
  connection under a request id the kernel does not know (ENOENT, which libfuse
  ignores), and every later read is the kernel's.
- **Requests the dead process had read.** The kernel waits for their answers
  forever. Since Linux 6.9 the server can ask the kernel to queue them again
  (``FUSE_NOTIFY_RESEND``): ``recover_lost`` does, and the adopter serves
  them as if they were new (their ids carry bit 63); the job sees nothing.
  On an older kernel (the notification is refused, EINVAL): request ids
  ("unique") are handed out in steps of 2 per connection,
  so everything lost lies below the first id the adopter reads: it answers that
  request and every id below it (``window``) with EINTR. A reply for an id the
  kernel is not waiting on fails ENOENT and costs nothing; a job whose request
  was lost sees one EINTR, which Python's I/O retries itself (PEP 475): the
  retry reaches the new process.

What the kernel holds besides the connection (node ids and their lookup
counts, open file handles) is the adopter's to resolve: see docs/reliability.md
"Crashes: what a job sees".
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import select
import struct
import threading
import time

FUSE_INIT = 26
log = logging.getLogger(__name__)
FUSE_INTERRUPT = 36
FUSE_NOTIFY_RESEND = 7  # fuse_kernel.h 7.40 (Linux 6.9): requeue what was read, unanswered
_NO_REPLY = {2, 42}  # FORGET, BATCH_FORGET: nothing waits on their answer
_IN_HEADER = struct.Struct("<IIQQIIIHH")  # len opcode unique nodeid uid gid pid extlen pad
_OUT_HEADER = struct.Struct("<IiQ")  # len error unique
_INIT_IN = struct.Struct("<IIIII44x")  # major minor max_readahead flags flags2, unused
# The synthetic INIT's request id: far above any id a connection hands out,
# even, so the kernel reads its reply as one for an unknown request.
_SYNTHETIC_UNIQUE = 1 << 62
# What a kernel offers (fuse_kernel.h FUSE_*): what pyfuse3 requires
# (DO_READDIRPLUS) and what libfuse turns on by default when offered, so the
# adopter's libfuse behaves as the crashed process's did.
_OFFERED = (
    (1 << 0) | (1 << 1) | (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 10)
    | (1 << 11) | (1 << 12) | (1 << 13) | (1 << 14) | (1 << 15) | (1 << 18)
    | (1 << 22)
)
_PROTOCOL = (7, 38)  # libfuse 3.14's own minor; the kernel's is newer
# A read of /dev/fuse must fit the largest request (max_write + headers), or EINVAL.
_READ_SIZE = 2 << 20
DEFAULT_WINDOW = 200_000  # lost requests are looked for this many ids below the first read


def synthetic_init() -> bytes:
    body = _INIT_IN.pack(*_PROTOCOL, 128 * 1024, _OFFERED, 0)
    return _IN_HEADER.pack(_IN_HEADER.size + len(body), FUSE_INIT, _SYNTHETIC_UNIQUE,
                           0, 0, 0, 0, 0, 0) + body


def is_fuse_device(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "/dev/fuse"
    except OSError:
        return False


class Adoption:
    """One adoption of the held connection ``real_fd`` by this process.

    ``mountpoint()`` goes to ``pyfuse3.init`` in place of a path; the ops'
    ``init`` calls ``take_over()``; ``answer_lost()`` runs before the FUSE loop
    reads (it reads the first request itself).
    """

    def __init__(self, real_fd: int) -> None:
        if not is_fuse_device(real_fd):
            raise ValueError(f"fd {real_fd} is not a /dev/fuse connection")
        self.real_fd = real_fd
        self._pipe: int | None = None
        self.lost_answered = 0
        self.sweep: threading.Thread | None = None

    def mountpoint(self) -> str:
        r, w = os.pipe()
        try:
            os.write(w, synthetic_init())
        finally:
            os.close(w)
        self._pipe = r
        return f"/dev/fd/{r}"

    def take_over(self) -> None:
        """Called from pyfuse3's init callback: the pipe's fd becomes the connection."""
        if self._pipe is None:
            raise RuntimeError("take_over before mountpoint")
        os.dup2(self.real_fd, self._pipe, inheritable=False)
        os.close(self.real_fd)
        self.real_fd = self._pipe

    def recover_lost(self, timeout: float) -> str:
        """What the dead process had read is served again (``resent``), or, on a kernel
        without FUSE_NOTIFY_RESEND, answered EINTR (``answer_lost``); how, in a word."""
        if resend(self.real_fd):
            log.info("adopted connection: the requests the dead process had read are"
                     " queued again (FUSE_NOTIFY_RESEND)")
            return "resent"
        self.answer_lost(timeout)
        return "interrupted"

    def answer_lost(self, timeout: float, window: int = DEFAULT_WINDOW) -> int | None:
        """Answer EINTR to what the dead process had read; the first id read, or None.

        Waits at most ``timeout`` for a request (none: nothing was lost that a
        job waits on, or no job is there to notice). The request read here is
        answered EINTR too: its caller retries into the new process. The ids
        below it are answered by a thread (``sweep``), nearest first, while this
        process serves: everything it reads has a higher id.
        """
        fd = self.real_fd
        interrupted: list[int] = []
        deadline = time.monotonic() + timeout
        while True:  # the first request that is answered: FORGETs and INTERRUPTs are not
            ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                _answer_each(fd, interrupted)
                return None
            try:
                msg = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                continue
            if len(msg) < _IN_HEADER.size:
                continue
            _, opcode, unique, *_ = _IN_HEADER.unpack_from(msg)
            if opcode == FUSE_INTERRUPT:  # its request (id with bit 0 cleared) was read
                interrupted.append(unique & ~1)  # by the dead process: answer it
            elif opcode not in _NO_REPLY:
                break
        _answer_each(fd, interrupted)
        self.sweep = threading.Thread(target=self._sweep, args=(fd, unique, window),
                                      name="adopt-sweep", daemon=True)
        self.sweep.start()
        return unique

    def _sweep(self, fd: int, first: int, window: int) -> None:
        t0 = time.monotonic()
        try:
            self.lost_answered = _answer(fd, first, window)
        except OSError as e:  # the connection ended meanwhile: nothing waits any more
            log.info("adopted connection: answering lost requests stopped: %s", e)
            return
        log.info("adopted connection: %d request(s) the dead process had read answered "
                 "EINTR (ids %d..%d, %.2f s)", self.lost_answered,
                 max(first - 2 * window, 0), first, time.monotonic() - t0)

    def probe(self, mountpoint: str) -> threading.Thread:
        """Make sure a request arrives for ``answer_lost`` to read.

        A lookup of a name that never exists (a fresh one: a negative entry may
        be cached), from a thread: it waits until this process serves, retries
        the EINTR it may get, and ends with ENOENT.
        """
        path = os.path.join(mountpoint, f".casfs-adopt-{secrets.token_hex(8)}")

        def lookup() -> None:
            with contextlib.suppress(OSError):
                os.stat(path)

        t = threading.Thread(target=lookup, name="adopt-probe", daemon=True)
        t.start()
        return t


def resend(fd: int) -> bool:
    """Ask the kernel to queue again every request read on connection ``fd`` and not
    answered; False if this kernel cannot (before 6.9)."""
    try:
        os.write(fd, _OUT_HEADER.pack(_OUT_HEADER.size, FUSE_NOTIFY_RESEND, 0))
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.ENOSYS):
            return False
        raise
    return True


def _interrupted(fd: int, unique: int) -> bool:
    """Answer request ``unique`` EINTR; False if the kernel waits on no such request."""
    try:
        os.write(fd, _OUT_HEADER.pack(_OUT_HEADER.size, -errno.EINTR, unique))
    except FileNotFoundError:
        return False
    return True


def _answer_each(fd: int, ids: list[int]) -> None:
    for unique in ids:
        _interrupted(fd, unique)


def _answer(fd: int, first: int, window: int) -> int:
    """EINTR to ``first`` and every even id below it, down to ``first - 2*window``."""
    return sum(_interrupted(fd, u) for u in range(first, max(first - 2 * window, 0), -2))
