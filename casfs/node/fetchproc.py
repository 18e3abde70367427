"""The mount process's side of its fetch worker: shared-root reads in another process.

Filling the local object cache reads shared storage (a hung NFS server, a
hostile store, a decompression bomb, a stuck S3 client): that work runs in a
child process (casfs.node.fetchworker), so a crash, an OOM kill or a hang
there costs the mount process a miss, never its FUSE connection.

Protocol (a Unix socketpair, one message = 4-byte big-endian length + JSON):

    mount -> worker  {"op": "fill", "id": n, "digest", "size", "root": {spec}, "ns", "pack"}
                     {"op": "fill_many", "id": n, "objects": [[digest, size, pack], ...],
                      "root", "ns", "packs": [pack digest, ...]}
                                                    read-ahead: several objects, then the
                                                    other members of whole packs
    worker -> mount  {"id": n, "started": true}     a worker thread took it (sent only by a
                                                    fill still running after 0.05 s)
                     {"id": n, "progress": true}    bytes arrived (at most every 0.2 s)
                     {"id": n, "one": digest, "ident": [...]} or {..., "kind", "error"}
                                                    fill_many: one of its objects is done
                     {"id": n, "one": digest, "ident": [...], "size": n}
                                                    fill_many: a pack member it added
    mount -> worker  {"op": "fill_packs", "id": n, "objects": [[digest, size, pack], ...],
                      "root", "ns"}                 a whole-namespace prefetch's wave: each
                                                    pack read once (all at once), objects
                                                    installed in this order
    mount -> worker  {"op": "cancel", "cancel": n}  fill_packs n: install no more of its
                                                    objects (the namespace goes); its
                                                    reply comes at once
    worker -> mount  {"id": n, "many": [[digest, ino, mtime_ns, size], ...],
                      "failed": [[digest, kind, error], ...]}
                                                    fill_packs: a batch of its objects done
                     {"id": n, "ok": true, "n": bytes, "ident": [ino, mtime_ns, size],
                      "counters": {...}}            (fill_many: "counters" only)
                     {"id": n, "ok": false, "kind": "corrupt"|"missing"|"error", "error": text}

A fill's result is the object's file in the cache directory (verified by the
worker while streaming it; the mount process checks its size and records
it). The mount process never waits on the worker without a bound:

* the worker dies (kill -9, OOM, a crash): every request in flight is sent
  once more to a fresh worker (one retry; the second loss is a miss);
* the worker hangs: a request a worker thread started that has received no
  bytes for ``hang_after`` seconds means a stuck root or client; the worker is
  killed and replaced (stalled requests fail: a miss, never retried), so
  blocked threads never pile up and reads hit again once the root recovers;
* a spare worker is started in advance, so a replacement serves at once
  (no interpreter start and imports while a job waits); a worker that dies
  within ``QUICK_DEATH`` seconds of starting without completing a fill (a
  crash loop) is restarted after a back-off (1, 2, 4 ... 10 s); requests wait
  meanwhile, and the view's fetch timeout bounds what a job waits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from casfs.errors import CasfsError, CorruptObjectError, ObjectMissingError, WorkerBugError
from casfs.util.child import CHILD_CWD, child_env, python_module
from casfs.util.counters import Counters

log = logging.getLogger(__name__)

HEADER = struct.Struct(">I")
MAX_MESSAGE = 64 << 20  # the promotion worker's replies name paths (lost, conflicts)
QUICK_DEATH = 10.0  # a worker dying this soon after its start, having done nothing: back-off
SPARE = True  # keep one worker started in advance, so a restart does not wait for imports
# ... once the worker has had nothing to do this long (or runs this long): a fresh node's
# first seconds are its busiest, and a spare's start (an interpreter, its imports) would
# take CPU from them, for a death that rarely comes
SPARE_AFTER_QUIET = 2.0
SPARE_AFTER_AT_MOST = 30.0
MAX_BACKOFF = 10.0
TICK = 0.1  # watchdog period: how soon a dead worker is noticed
SEND_TIMEOUT = 5.0
CANCEL_POLL = 0.05  # how soon a request's ``cancel`` event is noticed


class FetchWorkerError(CasfsError):
    """The fetch worker died or hung during this fetch: a miss for this open only."""


class MessageTooLarge(ValueError):
    """A message over MAX_MESSAGE: refused before a byte is sent, the stream intact."""


def send_msg(sock: socket.socket, msg: dict[str, Any]) -> None:
    data = json.dumps(msg, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        # The reader would drop the stream, and a worker every tenant's mount shares
        # with it (a review: a 68 MB request, the worker replaced in a loop)
        raise MessageTooLarge(f"a {msg.get('op', 'reply')} message of {len(data)} bytes"
                              f" (the bound is {MAX_MESSAGE})")
    sock.sendall(HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv_msg(sock: socket.socket) -> dict[str, Any] | None:
    """The next message, or None at end of stream (the other side is gone)."""
    head = _recv_exact(sock, HEADER.size)
    if head is None:
        return None
    (n,) = HEADER.unpack(head)
    if n > MAX_MESSAGE:
        raise OSError(f"fetch worker message of {n} bytes")
    body = _recv_exact(sock, n)
    if body is None:
        return None
    msg = json.loads(body)
    if not isinstance(msg, dict):
        raise OSError("fetch worker message is not an object")
    return msg


@dataclass
class _Request:
    msg: dict[str, Any]
    progressed_cb: Callable[[], None]
    counters: Counters
    done: threading.Event = field(default_factory=threading.Event)
    reply: dict[str, Any] | None = None
    error: BaseException | None = None
    sent_to: int = 0  # worker generation it was last sent to (0: not sent)
    tries: int = 0
    started: bool = False
    sent_at: float = 0.0
    progressed: float = 0.0
    stalled: bool = False
    on_part: Callable[[dict[str, Any]], None] | None = None  # fill_many's "one" messages


class FetchWorker:
    """One fetch worker process for a cache directory, restarted when it dies or hangs.

    The machinery (spawn, watchdog, one retry, hang detection) is the same for
    casfs.node.promoteproc's promotion worker: ``module`` is the child's module,
    ``args`` its arguments after ``--fd``, ``label`` how logs and errors name it,
    ``spare`` whether a replacement is kept started in advance.
    """

    def __init__(self, directory: Path, *, hang_after: float = 20.0, threads: int = 16,
                 module: str = "casfs.node.fetchworker", args: list[str] | None = None,
                 label: str = "fetch worker", spare: bool | None = None) -> None:
        self.directory = Path(directory)
        self.hang_after = hang_after
        self.threads = threads
        self.module = module
        self.args = args if args is not None else ["--dir", str(self.directory)]
        self.label = label
        self.keep_spare = spare
        self.counters = Counters()  # worker_starts, worker_deaths, worker_hangs
        self._lock = threading.Lock()
        self._pending: dict[int, _Request] = {}
        self._next_id = 1
        self._gen = 0  # generation of the current worker; bumps on each start
        self._proc: subprocess.Popen[bytes] | None = None
        self._wsock: socket.socket | None = None
        self._started_at = 0.0
        self._last_heard = 0.0  # when the worker last sent anything
        self._next_start = 0.0
        self._backoff = 0.0
        self._answered = 0  # fills the current worker completed
        self._spare: tuple[subprocess.Popen[bytes], socket.socket] | None = None
        self._dead: list[subprocess.Popen[bytes]] = []  # killed, not reaped yet
        self._busy_at = 0.0  # when a request was last seen pending (the spare waits)
        self._spare_gen = 0  # the worker generation a spare was last started for
        self._closed = False
        self._watchdog = threading.Thread(target=self._watch, name=f"{label}-watchdog", daemon=True)
        self._watchdog.start()

    # --- the caller's side --------------------------------------------------
    def fill(self, digest: str, size: int, root: dict[str, Any], namespace: str,
             pack: Any, progressed: Callable[[], None], counters: Counters) -> dict[str, Any]:
        """Have the worker put ``digest`` into the cache; its reply ({"n", "ident"}).

        What the worker counted for this root (rejections, packed reads ...) is
        added to ``counters``, on success and failure alike.

        Raises CorruptObjectError, ObjectMissingError, CasfsError (as the
        worker saw it) or FetchWorkerError (the worker died twice or hung).
        """
        msg = {"op": "fill", "digest": digest, "size": size, "root": root, "ns": namespace,
               "pack": pack}
        return self.call(msg, progressed, counters)

    def fill_many(self, objects: list[tuple[str, int, Any]], root: dict[str, Any],
                  namespace: str, progressed: Callable[[], None], counters: Counters,
                  on_one: Callable[[dict[str, Any]], None], packs: list[str] | None = None
                  ) -> dict[str, Any]:
        """Have the worker put several objects ((digest, size, pack location)) into the
        cache, then every member of ``packs`` (read whole, see fetchworker); ``on_one``
        gets each object's ``one`` message as it is done (from the reader thread; maybe
        twice for one digest if the request was sent again to a new worker). Raises
        like ``fill`` when the request as a whole fails."""
        msg = {"op": "fill_many", "objects": [list(o) for o in objects], "root": root,
               "ns": namespace, "packs": packs or []}
        return self.call(msg, progressed, counters, on_one)

    def call(self, msg: dict[str, Any], progressed: Callable[[], None],
             counters: Counters, on_part: Callable[[dict[str, Any]], None] | None = None,
             cancel: threading.Event | None = None) -> dict[str, Any]:
        """Send one request (``op`` and its fields) and wait for its reply (see fill).
        ``cancel`` set while it runs: the worker is told to stop it (fill_packs: no more
        objects installed) and answers with what it did."""
        req = _Request(msg, progressed, counters, on_part=on_part)
        with self._lock:
            if self._closed:
                raise FetchWorkerError(f"the {self.label} is shut down")
            msg["id"] = rid = self._next_id
            self._next_id += 1
            self._pending[rid] = req
            self._send_locked(req)
        # bounded: the watchdog fails or retries every request of a dead worker
        if cancel is None:
            req.done.wait()
        else:
            told = -1  # the worker (generation) told to cancel: again if it is re-sent
            while not req.done.wait(CANCEL_POLL):
                if cancel.is_set() and req.sent_to != told:
                    told = req.sent_to
                    self._cancel(rid)
        if req.error is not None:
            raise req.error
        assert req.reply is not None
        return req.reply

    def close(self) -> None:
        with self._lock:
            self._closed = True
            proc, self._proc = self._proc, None
            spare, self._spare = self._spare, None
            if spare is not None:
                with contextlib.suppress(OSError):
                    spare[0].kill()
                spare[1].close()
            self._fail_all_locked(FetchWorkerError(f"the {self.label} is shut down"))
            if self._wsock is not None:
                with contextlib.suppress(OSError):
                    self._wsock.shutdown(socket.SHUT_RDWR)
                self._wsock = None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    @property
    def pid(self) -> int | None:
        with self._lock:
            return self._proc.pid if self._proc is not None else None

    # --- sending and receiving -------------------------------------------------
    def _cancel(self, rid: int) -> None:
        with self._lock:
            req = self._pending.get(rid)
            if req is None:
                return  # answered
            if self._wsock is None or req.sent_to != self._gen:
                # Not sent to a worker yet (one starting), or to one that died: never now.
                del self._pending[rid]
                req.error = CasfsError("cancelled")
                req.done.set()
                return
            try:
                send_msg(self._wsock, {"op": "cancel", "cancel": rid})
            except OSError as e:  # the watchdog deals with the worker; the reply comes
                log.debug("cannot cancel request %d: %s", rid, e)

    def _send_locked(self, req: _Request) -> None:
        if self._wsock is None or req.sent_to == self._gen:
            return  # no worker now: sent when the next one starts
        req.sent_to = self._gen
        req.tries += 1
        req.started = False
        req.sent_at = time.monotonic()
        try:
            send_msg(self._wsock, req.msg)
        except MessageTooLarge as e:  # this request's own fault: the worker serves on
            self._pending.pop(int(req.msg["id"]), None)
            req.error = WorkerBugError(str(e))
            req.done.set()
        except OSError as e:  # dead or wedged worker: the watchdog replaces it
            log.warning("cannot send to the %s: %s", self.label, e)
            self._kill_locked("it does not read its requests")

    def _read(self, sock: socket.socket, gen: int) -> None:
        try:
            while True:
                msg = recv_msg(sock)
                if msg is None:
                    break
                self._on_message(msg)
        except (OSError, ValueError) as e:
            log.warning("%s connection: %s", self.label, e)
        finally:
            sock.close()
            with self._lock:
                if gen == self._gen and self._proc is not None:
                    self._kill_locked("its connection closed")

    def _on_message(self, msg: dict[str, Any]) -> None:
        rid = msg.get("id")
        if not isinstance(rid, int):
            return
        with self._lock:
            self._last_heard = time.monotonic()
            req = self._pending.get(rid)
            if req is None:
                return  # answered already (a retried request's first worker)
            if "ok" not in msg:
                req.started = True
                req.progressed = time.monotonic()
                progress = "progress" in msg or "one" in msg or "many" in msg
            else:
                del self._pending[rid]
                progress = False
        if progress:
            req.progressed_cb()
        if "ok" not in msg:
            if ("one" in msg or "many" in msg) and req.on_part is not None:
                try:
                    req.on_part(msg)
                except Exception:  # the reader must outlive any bug: every request waits on it
                    log.exception("%s: handling a partial reply", self.label)
            return
        counted = msg.get("counters")
        if isinstance(counted, dict):
            req.counters.merge({k: v for k, v in counted.items() if isinstance(v, int)})
        if msg["ok"]:
            self._answered += 1
            req.reply = msg
        else:
            kind = msg.get("kind")
            cls = (CorruptObjectError if kind == "corrupt" else
                   ObjectMissingError if kind == "missing" else
                   WorkerBugError if kind == "bug" else CasfsError)
            req.error = cls(str(msg.get("error", "fetch failed")))
        req.done.set()

    # --- the watchdog ---------------------------------------------------------------
    def _watch(self) -> None:
        """Every start of a worker happens here: their PR_SET_PDEATHSIG (fetchworker)
        fires when the *thread* that spawned them ends, and this one lives as long as
        we do. The first runs at once: a first fetch waits for its imports."""
        while True:
            try:
                if not self._watch_once():
                    return
            except Exception:  # the watchdog must outlive any bug: requests wait on it
                log.exception("%s watchdog", self.label)
            time.sleep(TICK)

    def _watch_once(self) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._reap_locked()
            proc = self._proc
            if proc is not None and proc.poll() is not None:
                self._worker_died_locked(f"exit status {proc.returncode}")
            elif proc is not None:
                self._check_hung_locked()
            if self._proc is None and time.monotonic() >= self._next_start:
                self._start_locked()
            self._spare_locked()
        return True

    def _spare_locked(self) -> None:
        """Start the spare once the worker is quiet (SPARE_AFTER_QUIET) or has run for
        SPARE_AFTER_AT_MOST."""
        if not (SPARE if self.keep_spare is None else self.keep_spare) or \
                self._spare is not None or self._proc is None or self._spare_gen == self._gen:
            return
        now = time.monotonic()
        if self._pending:
            self._busy_at = now
        if (now - max(self._busy_at, self._started_at) >= SPARE_AFTER_QUIET
                or now - self._started_at >= SPARE_AFTER_AT_MOST):
            self._spare_gen = self._gen  # one try a worker: a failed spawn is not repeated
            self._spare = self._spawn_locked()

    def _check_hung_locked(self) -> None:
        """A fill a worker thread started that got no bytes for hang_after, or a request
        not even started while the worker said nothing at all for that long (every
        thread stuck, or the process stopped): the worker is hung."""
        now = time.monotonic()
        quiet = now - max(self._last_heard, self._started_at)
        stalled = [r for r in self._pending.values() if r.sent_to == self._gen and (
            now - r.progressed > self.hang_after if r.started
            else min(quiet, now - r.sent_at) > self.hang_after)]
        if stalled:
            for r in stalled:
                r.stalled = True
            self.counters.inc("worker_hangs")
            self._kill_locked(f"{len(stalled)} requests got nothing for"
                              f" {self.hang_after:.0f}s (a stuck shared root?)")

    def _kill_locked(self, why: str) -> None:
        proc = self._proc
        if proc is None:
            return
        log.warning("%s %d: %s: replacing it", self.label, proc.pid, why)
        with contextlib.suppress(OSError):
            proc.kill()
        self._worker_died_locked("killed")

    def _worker_died_locked(self, how: str) -> None:
        proc = self._proc
        assert proc is not None
        self._proc = None
        self._dead.append(proc)
        if self._wsock is not None:
            with contextlib.suppress(OSError):
                self._wsock.shutdown(socket.SHUT_RDWR)  # ends its reader, which closes it
            self._wsock = None
        self.counters.inc("worker_deaths")
        lived = time.monotonic() - self._started_at
        if lived < QUICK_DEATH and not self._answered:  # a crash loop, not a killed worker
            self._backoff = min(MAX_BACKOFF, max(1.0, self._backoff * 2))
        else:
            self._backoff = 0.0
        self._next_start = time.monotonic() + self._backoff
        if how != "killed":
            log.warning("%s %d died (%s) after %.1fs; restarting%s", self.label, proc.pid, how,
                        lived, f" in {self._backoff:.0f}s" if self._backoff else "")
        for rid, req in list(self._pending.items()):
            if req.sent_to and (req.stalled or req.tries >= 2):
                del self._pending[rid]
                what = (f"object {req.msg['digest']}" if "digest" in req.msg
                        else str(req.msg.get("op")))
                req.error = FetchWorkerError(
                    f"{what}: the {self.label} "
                    + ("hung" if req.stalled else "died twice") + " during the request")
                req.done.set()

    def _fail_all_locked(self, error: BaseException) -> None:
        for req in self._pending.values():
            req.error = error
            req.done.set()
        self._pending.clear()

    def _reap_locked(self) -> None:
        self._dead = [p for p in self._dead if p.poll() is None]

    def _spawn_locked(self) -> tuple[subprocess.Popen[bytes], socket.socket] | None:
        try:
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as e:  # out of fds: said in one line, tried again at the next need
            log.error("cannot start the %s: %s", self.label, e)
            return None
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
        cmd = [*python_module(self.module), "--fd", str(child.fileno()), *self.args,
               "--threads", str(self.threads), "--parent", str(os.getpid())]
        if level in ("debug", "info", "warning", "error"):
            cmd += ["--log-level", level]
        try:
            proc = subprocess.Popen(cmd, pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                                    restore_signals=True, cwd=CHILD_CWD, env=child_env())
        except OSError as e:
            parent.close()
            log.error("cannot start the %s: %s", self.label, e)
            return None
        finally:
            child.close()
        # A send that cannot finish in SEND_TIMEOUT (a wedged worker) fails instead of
        # blocking; settimeout would make the reader's recv non-blocking too.
        parent.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                          struct.pack("ll", int(SEND_TIMEOUT), 0))
        return proc, parent

    def _start_locked(self) -> None:
        """Make the spare the worker (started earlier: no import wait), then a new spare."""
        spare, self._spare = self._spare, None
        if spare is not None and spare[0].poll() is not None:
            spare[1].close()
            self._dead.append(spare[0])
            spare = None
        started = spare or self._spawn_locked()
        if started is None:
            self._backoff = min(MAX_BACKOFF, max(1.0, self._backoff * 2))
            self._next_start = time.monotonic() + self._backoff
            return
        proc, parent = started
        self._gen += 1
        self._proc = proc
        self._started_at = time.monotonic()
        self._answered = 0
        self.counters.inc("worker_starts")
        self._wsock = parent
        threading.Thread(target=self._read, args=(parent, self._gen), daemon=True,
                         name=f"{self.label}-reader-{self._gen}").start()
        log.debug("%s %d serving", self.label, proc.pid)
        for req in list(self._pending.values()):  # what the dead worker left: once more
            self._send_locked(req)

    def stop_worker(self, sig: int = signal.SIGKILL) -> None:
        """Signal the current worker (tests)."""
        pid = self.pid
        if pid is not None:
            os.kill(pid, sig)


_workers: dict[str, FetchWorker] = {}
_workers_lock = threading.Lock()


def shared(directory: Path, *, hang_after: float) -> FetchWorker:
    """This process's fetch worker for a cache directory (one for all its namespaces)."""
    key = os.path.realpath(directory)
    with _workers_lock:
        w = _workers.get(key)
        if w is None:
            w = _workers[key] = FetchWorker(Path(key), hang_after=hang_after)
        return w


def status_of(directory: Path) -> dict[str, Any] | None:
    """What this process's fetch worker for ``directory`` did (casfs status), if it has one."""
    with _workers_lock:
        w = _workers.get(os.path.realpath(directory))
    if w is None:
        return None
    return {"pid": w.pid, **w.counters.snapshot()}


def enabled() -> bool:
    """CASFS_FETCH_WORKER=0 fetches in the mount process itself (debugging only)."""
    return os.environ.get("CASFS_FETCH_WORKER", "1") != "0"
