"""How a process on this node ended: the kernel's process connector, for lease holders.

A ``casfs env`` lease is held by the job's shell (or ``--pid``), no child of casfs:
its exit status cannot be reaped, and a holder found gone may have exited cleanly
or been killed mid-write (SIGKILL, an OOM kill). The Linux process connector
(netlink ``NETLINK_CONNECTOR``, ``CN_IDX_PROC``; ``linux/cn_proc.h``) tells root of
every exit with its wait status. One socket, subscribed once
(``PROC_CN_MCAST_LISTEN``), with a classic BPF filter (``SO_ATTACH_FILTER``) that
passes only the exits of the thread-group leaders being watched, so the node's
other exits (a compile spawns thousands of processes) never wake the reader. A
thread reads it (never the FUSE loop) into a bounded map ``pid -> Exit`` of recent
exits.

Unknown is a verdict of its own: not root (the kernel refuses the subscription),
no connector (a kernel without it, a network namespace), events lost (ENOBUFS:
the socket's queue overflowed), a pid that was not watched (a holder that died
while no mount process ran). The caller treats it as killed: a torn file is never
published, a good one is only compiled again.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import signal
import socket
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import trio

log = logging.getLogger(__name__)

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_CN_MCAST_IGNORE = 2
PROC_EVENT_NONE = 0  # the subscription's acknowledgement (event_data.ack.err)
PROC_EVENT_EXIT = 0x80000000
NLMSG_DONE = 3
SO_ATTACH_FILTER = 26
SO_RCVBUFFORCE = 33

# struct nlmsghdr (16 bytes), struct cn_msg (20: id.idx, id.val, seq, ack, len, flags),
# struct proc_event (what, cpu, timestamp_ns, event_data), at these offsets in a message:
NLMSG = struct.Struct("=IHHII")
CN_MSG = struct.Struct("=IIIIHH")
OFF_WHAT = NLMSG.size + CN_MSG.size  # 36
OFF_TIME = OFF_WHAT + 8  # u64, aligned within proc_event: CLOCK_MONOTONIC ns
OFF_DATA = OFF_WHAT + 16  # event_data
# exit: process_pid, process_tgid, exit_code (the wait status), exit_signal (the
# signal sent to the parent, SIGCHLD: not how it died), parent_pid, parent_tgid.
EXIT = struct.Struct("=iiII")
ACK = struct.Struct("=I")

MAX_FILTERED = 240  # pids compared in the filter (its jumps are 8-bit); past that, all exits
RCVBUF = 4 << 20  # the socket's queue: a burst of exits the reader has not read yet
KEEP = 8192  # exits remembered
KEEP_FOR = 3600.0  # seconds an exit is remembered
WAIT_FOR_EVENT = 2.0  # the holder is a zombie before its event is sent: how long to wait


@dataclass(frozen=True)
class Exit:
    """One process's end, from the kernel: ``status`` is its wait status."""

    pid: int
    status: int
    at: float  # time.monotonic() of the exit

    @property
    def signal(self) -> int | None:
        """The signal that ended it, or None for an exit()."""
        sig = self.status & 0x7F
        return sig if sig not in (0, 0x7F) else None

    @property
    def code(self) -> int | None:
        """Its exit status (0-255), or None if a signal ended it."""
        return (self.status >> 8) & 0xFF if self.signal is None else None

    @property
    def killed(self) -> bool:
        """A signal ended it, or it is a shell whose job a signal ended (128+N, as
        ``casfs.node.jobrun.killed``): what it was writing may be half-written."""
        return self.signal is not None or 128 < (self.code or 0) <= 128 + 64

    def describe(self) -> str:
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            return f"killed by {name}"
        return f"exited {self.code}"


def decode(msg: bytes) -> tuple[str, Any] | None:
    """One netlink message from the connector: ("exit", Exit), ("ack", (errno, ack)) (the
    ack field of the subscription it answers, plus one), or None."""
    if len(msg) < OFF_DATA:
        return None
    length, kind = NLMSG.unpack_from(msg)[:2]
    if kind != NLMSG_DONE or length > len(msg):
        return None
    idx, val, _seq, ack = CN_MSG.unpack_from(msg, NLMSG.size)[:4]
    if (idx, val) != (CN_IDX_PROC, CN_VAL_PROC):
        return None
    what = ACK.unpack_from(msg, OFF_WHAT)[0]
    if what == PROC_EVENT_NONE and len(msg) >= OFF_DATA + ACK.size:
        return ("ack", (ACK.unpack_from(msg, OFF_DATA)[0], ack))
    if what == PROC_EVENT_EXIT and len(msg) >= OFF_DATA + EXIT.size:
        pid, tgid, status, _to_parent = EXIT.unpack_from(msg, OFF_DATA)
        if pid != tgid:
            return None  # a thread, not the process
        ns = struct.unpack_from("=Q", msg, OFF_TIME)[0]
        return ("exit", Exit(pid, status, ns / 1e9))
    return None


def _subscribe_msg(op: int, token: int = 0) -> bytes:
    """The kernel answers with ``token`` + 1 in its ack field (cn_proc_ack)."""
    body = CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, token, 4, 0) + struct.pack("=I", op)
    return NLMSG.pack(NLMSG.size + len(body), NLMSG_DONE, 0, 0, os.getpid()) + body


# --- the filter ------------------------------------------------------------------------
_LD_W_ABS, _ST, _LDX_MEM, _JEQ_K, _JEQ_X, _RET_K = 0x20, 0x02, 0x61, 0x15, 0x1D, 0x06
_ACCEPT = 0xFFFFFFFF


def _be(v: int) -> int:
    """``v`` as BPF's absolute loads read it: the message's (native) bytes, big-endian."""
    return int(struct.unpack(">I", struct.pack("=I", v & 0xFFFFFFFF))[0])


def program(pids: Iterable[int] | None) -> list[tuple[int, int, int, int]]:
    """The classic BPF program: the subscription's acks, and the exits of thread-group
    leaders among ``pids`` (all of them for None). (code, jt, jf, k) each."""
    want = None if pids is None else sorted(set(pids))
    if want is not None and len(want) > MAX_FILTERED:
        want = None
    prog = [
        (_LD_W_ABS, 0, 0, OFF_WHAT),  # 0: A = what
        (_JEQ_K, 3, 0, _be(PROC_EVENT_EXIT)),  # 1: -> 5
        (_JEQ_K, 0, 1, _be(PROC_EVENT_NONE)),  # 2: -> 3 (ack), else 4
        (_RET_K, 0, 0, _ACCEPT),  # 3
        (_RET_K, 0, 0, 0),  # 4: drop
        (_LD_W_ABS, 0, 0, OFF_DATA + 4),  # 5: A = tgid
        (_ST, 0, 0, 0),  # 6: M[0] = A
        (_LDX_MEM, 0, 0, 0),  # 7: X = M[0]
        (_LD_W_ABS, 0, 0, OFF_DATA),  # 8: A = pid
    ]
    if want is None:
        prog += [(_JEQ_X, 0, 1, 0), (_RET_K, 0, 0, _ACCEPT), (_RET_K, 0, 0, 0)]
        return prog
    n = len(want)
    prog.append((_JEQ_X, 0, n, 0))  # 9: a thread's exit -> drop
    prog += [(_JEQ_K, n - i, 0, _be(pid)) for i, pid in enumerate(want)]
    prog += [(_RET_K, 0, 0, 0), (_RET_K, 0, 0, _ACCEPT)]
    return prog


def attach_filter(sock: socket.socket, prog: list[tuple[int, int, int, int]]) -> None:
    code = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HP", len(prog), ctypes.addressof(buf))  # struct sock_fprog
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


def open_connector(pids: Iterable[int] | None = (), rcvbuf: int = RCVBUF) -> socket.socket:
    """A socket subscribed to the process connector, filtered to ``pids``' exits.
    OSError if the kernel refuses (not root: EPERM, no connector)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
    try:
        attach_filter(sock, program(pids))
        for opt in (SO_RCVBUFFORCE, socket.SO_RCVBUF):  # FORCE: root, past rmem_max
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, rcvbuf)
                break
            except OSError:
                continue
        sock.bind((0, CN_IDX_PROC))
        seq = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
        sock.send(_subscribe_msg(PROC_CN_MCAST_LISTEN, seq))
        # The acknowledgement says whether the kernel took it (EPERM: not allowed).
        # None comes to a process outside the first pid or user namespace (a
        # container's): the kernel ignores it, its events would name other pids.
        # Acknowledgements go to every listener: ours carries our token, plus one.
        sock.settimeout(2.0)
        try:
            while True:
                got = decode(sock.recv(65536))
                if got is not None and got[0] == "ack" and got[1][1] == seq + 1:
                    if got[1][0]:
                        raise OSError(got[1][0], os.strerror(got[1][0]))
                    break
        except TimeoutError:
            raise OSError(errno.ETIMEDOUT, "no answer: a pid or user namespace of its own?"
                          ) from None
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class ExitWatch:
    """The exits of the watched pids, read in a thread: ``start``, ``watch``, ``exit_of``."""

    def __init__(self, keep: int = KEEP, keep_for: float = KEEP_FOR,
                 rcvbuf: int = RCVBUF) -> None:
        self.keep, self.keep_for, self.rcvbuf = keep, keep_for, rcvbuf
        self._cond = threading.Condition()
        self._exits: OrderedDict[int, Exit] = OrderedDict()
        self._watched: dict[int, float] = {}  # pid -> when it was first watched
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = -1, -1
        self._stopping = False
        self.unavailable: str | None = "not started"  # why nothing can be known
        self.lost_at: float | None = None  # the last time events were lost (ENOBUFS)
        self.lost = 0  # how many times
        self._told: set[str] = set()

    # --- lifetime ------------------------------------------------------------------------
    def start(self) -> bool:
        """Subscribe and start the reader; False (and why, in ``unavailable``) if the
        kernel refuses."""
        try:
            with self._cond:
                self._sock = open_connector(self._watched, self.rcvbuf)
        except OSError as e:
            self.unavailable = (f"the kernel's process connector is unavailable"
                                f" ({e.strerror or e})")
            return False
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.unavailable = None
        self._thread = threading.Thread(target=self._read, name="casfs-procexit", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stopping = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._thread.join(5.0)
        self._thread = None
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.send(_subscribe_msg(PROC_CN_MCAST_IGNORE))
            sock.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self.unavailable = "stopped"

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """As a trio task: started, then stopped when cancelled. Runs without the
        connector too (every verdict is then unknown)."""
        if not await trio.to_thread.run_sync(self.start):  # up to 2 s in a container
            why = self.unavailable or ""
            self._tell(why, f"{why}: every casfs env job that ends counts as killed (what"
                            f" it wrote last is not published)")
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            self.stop()

    # --- the reader thread -------------------------------------------------------------------
    def _read(self) -> None:
        sock = self._sock
        assert sock is not None
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._stopping:
            try:
                ready = poller.poll()
            except InterruptedError:
                continue
            if any(fd == self._wake_r for fd, _ in ready):
                return
            while True:
                try:
                    msg = sock.recv(65536)
                except BlockingIOError:
                    break
                except OSError as e:
                    if e.errno == errno.ENOBUFS:  # the queue overflowed: exits were lost
                        with self._cond:
                            self.lost_at = time.monotonic()
                            self.lost += 1
                            self._cond.notify_all()
                        continue
                    log.info("the process connector failed: %s", e)
                    with self._cond:
                        self.unavailable = f"the process connector failed ({e.strerror})"
                        self._cond.notify_all()
                    return
                got = decode(msg)
                if got is not None and got[0] == "exit":
                    self._record(got[1])

    def _record(self, ex: Exit) -> None:
        with self._cond:
            self._exits.pop(ex.pid, None)
            self._exits[ex.pid] = ex
            while len(self._exits) > self.keep:
                self._exits.popitem(last=False)
            self._cond.notify_all()

    # --- what the host asks ------------------------------------------------------------------
    def watch(self, pids: Iterable[int]) -> None:
        """Watch exactly ``pids`` from now on. A pid newly watched is alive now (a lease
        holder just checked): an exit recorded for it before is of an earlier process."""
        want = set(pids)
        with self._cond:
            if want == set(self._watched):
                return
            now = time.monotonic()
            for pid in want - set(self._watched):
                self._watched[pid] = now
                self._exits.pop(pid, None)
            for pid in set(self._watched) - want:
                del self._watched[pid]
            if self._sock is not None:
                try:
                    attach_filter(self._sock, program(self._watched))
                except OSError as e:  # never seen; then every exit is let through
                    log.info("cannot filter the process connector: %s", e)
                    with contextlib.suppress(OSError):
                        self._sock.setsockopt(socket.SOL_SOCKET, 27, 0)  # SO_DETACH_FILTER

    def exit_of(self, pid: int, wait: float = 0.0) -> Exit | None:
        """How ``pid`` ended, or None if that is unknown. ``wait``: a watched pid just
        found gone may be seen before its event is read: wait that long for it."""
        deadline = time.monotonic() + wait
        with self._cond:
            while True:
                ex = self._exits.get(pid)
                if ex is not None and time.monotonic() - ex.at > self.keep_for:
                    ex = None
                if ex is not None or self.unavailable or pid not in self._watched:
                    return ex
                if self.lost_at is not None and self.lost_at >= self._watched[pid]:
                    return None  # lost with the overflow, or still to come: not waited for
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def why_unknown(self, pid: int) -> str:
        with self._cond:
            if self.unavailable:
                return self.unavailable
            if pid not in self._watched:
                return "it ended while no mount process watched it"
            if self.lost_at is not None and self.lost_at >= self._watched[pid]:
                return "exit events were lost (the process connector's queue overflowed)"
            return "no exit event came for it"

    def verdict(self, pid: int, wait: float = WAIT_FOR_EVENT) -> tuple[bool, Exit | None]:
        """(killed?, its Exit): killed by a signal, or unknown (told once a reason, at
        info). Blocks up to ``wait``: call it from a thread."""
        ex = self.exit_of(pid, wait)
        if ex is not None:
            return ex.killed, ex
        why = self.why_unknown(pid)
        self._tell(why, f"how a casfs env job's process ended is unknown ({why}): it counts"
                        f" as killed, what it wrote last is not published")
        return True, None

    def _tell(self, why: str, line: str) -> None:
        """Log ``line`` at info, once per kind of reason (``why`` before any '(')."""
        key = why.split(" (")[0]
        with self._cond:
            if key in self._told:
                return
            self._told.add(key)
        log.info("%s", line)
