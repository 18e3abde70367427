"""The fetch worker: fills the local object cache from the shared root, for a mount process.

``python -m casfs.node.fetchworker --fd N --dir <cache>``: started by
casfs.node.fetchproc, which owns the other end of the socket ``N`` (its
docstring has the protocol). Each fill runs in a thread: open the shared root
named by the request (cached per root and namespace), stream the verified
object into a temp file of the cache directory, rename it into place
(casfs.index.objcache.fill_file, the one way a cache file is written). The
worker never touches the node index or the FUSE mount: whatever goes wrong
here (a crash, an OOM kill, a root that never answers) ends at most this
process. It exits when its mount process goes away.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Generic, TypeVar

import blake3

from casfs.errors import CasfsError, CorruptObjectError, ObjectMissingError
from casfs.index.objcache import fill_file, install_file, object_path
from casfs.node import logfmt
from casfs.node.fetchproc import MessageTooLarge, recv_msg, send_msg
from casfs.util import diskroom
from casfs.util.crashpoint import crashpoint

log = logging.getLogger(__name__)

PROGRESS_EVERY = 0.2  # seconds between progress messages of one fill
STARTED_AFTER = 0.05  # a fill running this long tells the mount it started (see Worker)
MAX_SPAN = 4 << 20  # fill_many: pack members within this many bytes come from one read
ITEM_THREADS = 4  # fill_many: objects filled at once (all requests together)
OTHER_FILL_WAIT = 30.0  # a fill waits this long for another thread's fill of its object
MAX_PACK = 4 << 20  # fill_many's "packs": a pack is read whole only up to this size ...
MAX_PACK_BYTES = 16 << 20  # ... filling at most this many bytes of its members ...
MAX_PACK_MEMBER = 1 << 20  # ... none larger than this (packs hold objects up to 64 KiB)
# A pack casfs writes is closed at ~1 MiB (casfs.store.packs.PACK_TARGET). The members
# asked of one pack are read in one range from the lowest to the highest: a manifest
# placing two 9-byte members 1.5 GiB apart had that span read into memory. Members of
# a wider span are fetched one by one (each at most MAX_MEMBER_BYTES).
MAX_PACK_SPAN = 16 << 20
MAX_PACKS_DONE = 1 << 16  # packs read whole by this worker (each once; then no more)
# fill_packs (a whole-namespace prefetch's wave): pack reads in flight at once (object
# stores want tens of parallel GETs), threads installing the objects (decoding and
# creating files: 2 cores' worth), objects answered per message.
PACK_GETS = 32
INSTALL_THREADS = 2
INSTALL_BATCH = 64


V = TypeVar("V")


class OpenOnce(Generic[V]):
    """What a worker opens per key (a root spec and a namespace), made once: a request
    for a key still being opened (a ``prepare``, then the first fill or round) waits
    for that opening instead of making its own. ``keep``: at most this many, the least
    recently used dropped first (None: all)."""

    def __init__(self, keep: int | None = None) -> None:
        self._lock = threading.Lock()
        self._made: dict[str, V] = {}
        self._opening: dict[str, threading.Lock] = {}
        self._keep = keep

    def get(self, key: str, make: Callable[[], V]) -> V:
        with self._lock:
            got = self._made.pop(key, None)
            if got is not None:
                self._made[key] = got  # the most recently used last
                return got
            opening = self._opening.setdefault(key, threading.Lock())
        with opening:
            try:
                with self._lock:
                    got = self._made.get(key)
                if got is None:
                    got = make()
                with self._lock:
                    got = self._made.setdefault(key, got)
                    while self._keep is not None and len(self._made) > self._keep:
                        self._made.pop(next(iter(self._made)))
            finally:
                with self._lock:
                    self._opening.pop(key, None)
        return got


class _Roots:
    """Shared roots by (spec, namespace): a namespace's pack locations load once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roots: OpenOnce[Any] = OpenOnce()
        self._sent: dict[str, dict[str, int]] = {}

    def get(self, spec: dict[str, Any], namespace: str) -> tuple[str, Any]:
        import json

        key = json.dumps([spec, namespace], sort_keys=True)
        return key, self._roots.get(key, lambda: _open_root(spec, namespace))

    def counters_delta(self, key: str, root: Any) -> dict[str, int]:
        """Counters moved since the last reply for this root (the mount adds them to its own)."""
        now = root.objects.counters.snapshot()
        with self._lock:
            last = self._sent.get(key, {})
            self._sent[key] = now
        return {k: v - last.get(k, 0) for k, v in now.items() if v != last.get(k, 0)}


def _open_root(spec: dict[str, Any], namespace: str) -> Any:
    from casfs.store.root import SharedRoot
    from casfs.tenants import TenantPolicy
    from casfs.util.location import parse_location

    policy = TenantPolicy.from_dict(spec["tenants"]) if spec.get("tenant") else None
    root = SharedRoot.open(parse_location(spec["root"]), tenants=policy,
                           timeout=float(spec.get("timeout", 10.0)), marker=spec.get("marker"))

    def locate() -> None:  # a packed object with no location yet: read the newest generation
        try:
            root.generations().newest_snapshot(namespace)
        except (CasfsError, OSError) as e:
            log.warning("cannot read pack locations of %s: %s", namespace, e)

    root.objects.locator = locate
    return root


class ChildServer:
    """A worker child's request loop: each request runs in the pool; replies, progress
    and the process's exit when the mount process goes go through ``send``."""

    NAME = b"casfs-worker"  # the process name once it serves (a spare until then)

    def __init__(self, sock: socket.socket, threads: int, prefix: str) -> None:
        self.sock = sock
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix=prefix)
        self._send_lock = threading.Lock()

    def handler(self, op: Any) -> Callable[[dict[str, Any]], None] | None:
        raise NotImplementedError

    def cancel(self, rid: Any) -> None:
        """Request ``rid`` is not wanted any more (only fill_packs stops early)."""

    def send(self, msg: dict[str, Any]) -> None:
        with self._send_lock:
            try:
                try:
                    send_msg(self.sock, msg)
                except MessageTooLarge as e:  # a reply naming too much: that request fails
                    log.warning("request %s: %s", msg.get("id"), e)
                    send_msg(self.sock, {"id": msg.get("id"), "ok": False, "kind": "bug",
                                         "error": str(e)})
            except OSError:
                os._exit(0)  # the mount process is gone

    def serve(self) -> None:
        named = False
        while True:
            try:
                msg = recv_msg(self.sock)
            except ConnectionResetError:  # the mount process died (killed): its end reset
                log.info("the mount process is gone: exiting")
                msg = None
            except (OSError, ValueError) as e:
                log.error("bad request stream: %s", e)
                msg = None
            if msg is None:
                os._exit(0)  # the mount process closed its end: nothing left to do
            if not named:  # ps, top and the benches tell a spare from a serving worker
                named = _set_name(self.NAME)
            if msg.get("op") == "cancel":  # here, not in the pool: it may be full
                self.cancel(msg.get("cancel"))
                continue
            fn = self.handler(msg.get("op"))
            if fn is not None:
                self.pool.submit(fn, msg)


class Worker(ChildServer):
    NAME = b"casfs-fetch"

    def __init__(self, sock: socket.socket, directory: Path, threads: int) -> None:
        super().__init__(sock, threads, "fill")
        self.directory = directory
        self.roots = _Roots()
        # Fills running now: id -> [start, "started" sent]. A fill says "started" only
        # once it has run STARTED_AFTER (the mount's hang detection needs it then);
        # a quicker one only answers: one message per fill instead of three.
        self._active: dict[Any, list[Any]] = {}
        self._packs_lock = threading.Lock()
        self._inflight: dict[str, _InFlight] = {}  # digest -> its fill running here
        self._inflight_lock = threading.Lock()
        # fill_many's objects (its own pool: a request waiting on the shared one could
        # wait behind itself)
        self.items = ThreadPoolExecutor(ITEM_THREADS, thread_name_prefix="fill-item")
        self._packs_done: set[str] = set()
        self.gets = ThreadPoolExecutor(PACK_GETS, thread_name_prefix="pack-get")
        self.installers = ThreadPoolExecutor(INSTALL_THREADS, thread_name_prefix="install")
        self._active_cond = threading.Condition()
        self._cancelled: set[Any] = set()  # fill_packs requests told to install no more
        threading.Thread(target=self._announce, name="announce", daemon=True).start()

    def handler(self, op: Any) -> Callable[[dict[str, Any]], None] | None:
        return (self.fill if op == "fill" else self.fill_many if op == "fill_many"
                else self.fill_packs if op == "fill_packs"
                else self.prepare if op == "prepare" else None)

    def _announce(self) -> None:
        while True:
            with self._active_cond:
                while not self._active:
                    self._active_cond.wait()
            time.sleep(STARTED_AFTER / 2)
            now = time.monotonic()
            with self._active_cond:  # held while sending: a fill answers only after this
                for rid, state in self._active.items():
                    if not state[1] and now - state[0] >= STARTED_AFTER:
                        state[1] = True
                        self.send({"id": rid, "started": True})

    def fill(self, msg: dict[str, Any]) -> None:
        self._run(msg, self._fill)

    def fill_many(self, msg: dict[str, Any]) -> None:
        self._run(msg, self._fill_many)

    def fill_packs(self, msg: dict[str, Any]) -> None:
        self._run(msg, self._fill_packs)

    def prepare(self, msg: dict[str, Any]) -> None:
        self._run(msg, self._prepare)

    def _prepare(self, rid: Any, msg: dict[str, Any], t0: float) -> None:
        """Open a namespace's root now (its object store client), while the mount
        process builds and plans: a fresh node's first fill_packs waited 20-40 ms for
        it. No request: the marker comes with the spec."""
        try:
            key, root = self.roots.get(msg["root"], str(msg["ns"]))
            self._reply(rid, {"id": rid, "ok": True,
                              "counters": self.roots.counters_delta(key, root)})
        except Exception as e:  # the first fill opens it again, and says why
            kind, text = _failure(e, None)
            self._reply(rid, {"id": rid, "ok": False, "kind": kind, "error": text})

    def _run(self, msg: dict[str, Any], fn: Callable[[Any, dict[str, Any], float], None]
             ) -> None:
        rid = msg.get("id")
        t0 = time.monotonic()
        with self._active_cond:
            self._active[rid] = [t0, False]
            self._active_cond.notify()
        try:
            fn(rid, msg, t0)
        finally:
            with self._active_cond:
                self._active.pop(rid, None)

    def _progress(self, rid: Any, t0: float) -> Callable[[], None]:
        last = [t0]  # progress messages only for a fill still running after PROGRESS_EVERY

        def progressed() -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY:
                last[0] = now
                self.send({"id": rid, "progress": True})

        return progressed

    def _fill_many(self, rid: Any, msg: dict[str, Any], t0: float) -> None:
        """Several objects (read-ahead), one after another in this thread: a message
        ``{"id", "one": digest, "ident"}`` (or ``"kind", "error"``) as each is done, so
        a job waiting for one of them goes on, then ``ok``. Members of one pack come
        from one range read (``ObjectStore.read_members``)."""
        progressed = self._progress(rid, t0)
        key, root = "", None
        try:
            key, root = self.roots.get(msg["root"], str(msg["ns"]))
            items = [(str(d), int(n), p) for d, n, p in msg["objects"]]
            wanted = {}
            for digest, _, pack in items:
                if pack is not None:
                    root.objects.locate(digest, pack)
                    loc = root.objects.locations.get(digest)
                    if loc is not None:
                        wanted[digest] = loc
            stored = root.objects.read_members(wanted, MAX_SPAN) if len(wanted) > 1 else {}

            def one(item: tuple[str, int, Any]) -> None:
                digest, size, _ = item
                crashpoint("fetch-worker")
                try:
                    member = stored.get(digest)
                    src = root.objects if member is None else _Stored(root.objects, member)
                    self._once(digest, lambda: fill_file(self.directory, src, digest, size,
                                                         progressed))
                    st = os.lstat(object_path(self.directory, digest))
                    self.send({"id": rid, "one": digest,
                               "ident": [st.st_ino, st.st_mtime_ns, st.st_size]})
                except Exception as e:  # this object only: the others go on
                    kind, text = _failure(e, digest)
                    self.send({"id": rid, "one": digest, "kind": kind, "error": text})

            # A few at a time, in order: a cache file's creation waits on the disk more
            # than it computes, and the job opens them in this order.
            list(self.items.map(one, items))
            for pack in msg.get("packs") or []:
                self._whole_pack(rid, root, str(pack), {d for d, _, _ in items})
            self._reply(rid, {"id": rid, "ok": True,
                              "counters": self.roots.counters_delta(key, root)})
        except Exception as e:  # a bad request or root: every object not answered is a miss
            kind, text = _failure(e, None)
            self._reply(rid, {"id": rid, "ok": False, "kind": kind, "error": text,
                              "counters": self.roots.counters_delta(key, root) if root else {}})

    def _fill_packs(self, rid: Any, msg: dict[str, Any], t0: float) -> None:
        """A whole-namespace prefetch's wave: every pack holding some of its objects is
        read once, all at once (the span of the members asked, one GET each), while
        INSTALL_THREADS threads decode, verify (blake3 against each object's digest)
        and install the objects in the order asked, as their packs arrive; loose
        objects are fetched the ordinary way (fill_file through the object store),
        all at once beside the pack reads, and so are members whose pack read failed
        (forwards of repacked packs, loose copies of damaged ones), one by one.
        Answered in batches of INSTALL_BATCH: ``many`` (identities) and ``failed``;
        then ``ok``."""
        from casfs.store.objects import HEADER_SIZE
        from casfs.store.packloc import MAX_MEMBER_BYTES, pack_key, parse_location

        key, root = "", None
        try:
            key, root = self.roots.get(msg["root"], str(msg["ns"]))
            items = [(str(d), int(n), parse_location(p)) for d, n, p in msg["objects"]]
            spans: dict[str, list[int]] = {}
            loose: list[tuple[str, int, Any]] = []  # fetched one by one, all at once
            for item in items:
                _, size, loc = item
                if loc is None or size > MAX_PACK_MEMBER or loc[2] > MAX_MEMBER_BYTES:
                    loose.append(item)
                    continue
                span = spans.get(loc[0])
                if span is None:
                    spans[loc[0]] = [loc[1], loc[1] + loc[2]]
                else:
                    span[0] = min(span[0], loc[1])
                    span[1] = max(span[1], loc[1] + loc[2])
            for pack, (lo, hi) in list(spans.items()):
                if hi - lo > MAX_PACK_SPAN:  # not a pack casfs wrote: no read that wide
                    del spans[pack]
                    loose += [it for it in items if it[2] is not None and it[2][0] == pack]
            if rid in self._cancelled:
                items, spans, loose = [], {}, []
            diskroom.check_room(self.directory, sum(n for _, n, _ in items))
            objects = root.objects

            def get(pack: str, lo: int, hi: int) -> bytes:
                if rid in self._cancelled:  # queued reads of a cancelled wave end at once
                    raise CasfsError("cancelled")
                raw = objects.backend.read_range(pack_key(pack), lo, hi - lo)
                if len(raw) != hi - lo:
                    raise CorruptObjectError(f"pack {pack} is truncated")
                objects.counters.inc("pack_bulk_reads")
                return bytes(raw)

            got = {pack: self.gets.submit(get, pack, lo, hi)
                   for pack, (lo, hi) in spans.items()}
            directory = str(self.directory)

            def fetch(digest: str, size: int, loc: Any) -> None:
                """The ordinary way: one object through the object store."""
                if rid in self._cancelled:
                    raise CasfsError("cancelled")
                if loc is not None:
                    objects.locate(digest, list(loc))

                def stream() -> int:
                    return fill_file(self.directory, objects, digest, size)

                self._once(digest, stream)

            # Loose objects in parallel with the packs (at 20 ms RTT, 600 of them one
            # after another were 15 s); the installers answer them in order.
            fetching = {d: self.gets.submit(fetch, d, n, loc) for d, n, loc in loose}

            def install(chunk: list[tuple[str, int, Any]]) -> None:
                ok: list[list[Any]] = []
                bad: list[list[Any]] = []
                for digest, size, loc in chunk:
                    if rid in self._cancelled:  # left unanswered: the mount fills none
                        break
                    crashpoint("fetch-worker")
                    try:
                        if digest in fetching:
                            fetching[digest].result()
                            st = os.lstat(object_path(directory, digest))
                            ok.append([digest, st.st_ino, st.st_mtime_ns, st.st_size])
                            continue
                        fut = got.get(loc[0]) if loc is not None else None
                        raw = None
                        if fut is not None:
                            try:
                                raw = fut.result()
                            except (CasfsError, OSError) as e:  # gone or damaged: one by one
                                log.debug("pack %s: %s", loc[0], e)
                        if raw is not None:
                            lo = spans[loc[0]][0]
                            stored = raw[loc[1] - lo:loc[1] - lo + loc[2]]
                            if len(stored) < HEADER_SIZE:
                                raise CorruptObjectError(f"object {digest}: truncated")
                            try:
                                data = objects.decode_member(digest, size, stored)
                            except CorruptObjectError:
                                data = None  # a damaged member: its loose copy, if any
                            if data is not None:
                                box: list[os.stat_result] = []

                                def put(data: bytes = data, digest: str = digest,
                                        box: list[os.stat_result] = box) -> int:
                                    box.append(install_file(directory, digest, data))
                                    return len(data)

                                if not self._once(digest, put, wait=False):
                                    raise CasfsError(f"object {digest} is being filled")
                                st = box[0]
                                ok.append([digest, st.st_ino, st.st_mtime_ns, st.st_size])
                                continue
                        fetch(digest, size, loc)  # its pack read or member failed
                        st = os.lstat(object_path(directory, digest))
                        ok.append([digest, st.st_ino, st.st_mtime_ns, st.st_size])
                    except Exception as e:  # this object only: the others go on
                        if rid in self._cancelled:
                            break  # (its read was cancelled): unanswered, as the rest
                        kind, text = _failure(e, digest)
                        bad.append([digest, kind, text])
                self.send({"id": rid, "many": ok, "failed": bad})

            chunks = [items[i:i + INSTALL_BATCH] for i in range(0, len(items), INSTALL_BATCH)]
            list(self.installers.map(install, chunks))
            self._reply(rid, {"id": rid, "ok": True,
                              "counters": self.roots.counters_delta(key, root)})
        except Exception as e:  # a bad request or root: every object not answered is a miss
            kind, text = _failure(e, None)
            self._reply(rid, {"id": rid, "ok": False, "kind": kind, "error": text,
                              "counters": self.roots.counters_delta(key, root) if root else {}})

    def _reply(self, rid: Any, msg: dict[str, Any]) -> None:
        with self._active_cond:  # never before a "started" being sent for it
            self._active.pop(rid, None)
            self._cancelled.discard(rid)
        self.send(msg)

    def cancel(self, rid: Any) -> None:
        with self._active_cond:  # (maybe before a pool thread took it: it stops at once)
            self._cancelled.add(rid)

    def _fill(self, rid: Any, msg: dict[str, Any], t0: float) -> None:
        progressed = self._progress(rid, t0)
        key, root = "", None
        try:
            digest, size = str(msg["digest"]), int(msg["size"])
            key, root = self.roots.get(msg["root"], str(msg["ns"]))
            if msg.get("pack") is not None:
                root.objects.locate(digest, msg["pack"])
            crashpoint("fetch-worker")
            self._once(digest, lambda: fill_file(self.directory, root.objects, digest, size,
                                                 progressed))
            n = size
            st = os.lstat(object_path(self.directory, digest))
            self._reply(rid, {"id": rid, "ok": True, "n": n,
                              "ident": [st.st_ino, st.st_mtime_ns, st.st_size],
                              "counters": self.roots.counters_delta(key, root)})
        except Exception as e:  # every failure is an answer: the mount turns it into a miss
            kind, text = _failure(e, msg.get("digest"))
            self._reply(rid, {"id": rid, "ok": False, "kind": kind, "error": text,
                              "counters": self.roots.counters_delta(key, root) if root else {}})


    def _once(self, digest: str, fill: Callable[[], int], wait: bool = True) -> bool:
        """Run ``fill`` (a fill_file of ``digest``) unless a thread of this worker is
        filling that object already (a job's open racing a read-ahead): then wait
        for it and use its file if it succeeded (``wait=False``: return False at
        once). Raises what ``fill`` raises."""
        with self._inflight_lock:
            other = self._inflight.get(digest)
            mine = None
            if other is None:
                mine = self._inflight[digest] = _InFlight()
        if other is not None:
            if not wait:
                return False
            if other.done.wait(OTHER_FILL_WAIT) and other.ok:
                return True  # its file is in place, verified
            fill()  # it failed (or is slow): our own
            return True
        assert mine is not None
        try:
            fill()
            mine.ok = True
        finally:
            with self._inflight_lock:
                if self._inflight.get(digest) is mine:
                    del self._inflight[digest]
            mine.done.set()
        return True

    def _whole_pack(self, rid: Any, root: Any, pack: str, asked: set[str]) -> None:
        """Read-ahead of a pack a job read a member of: its other members are usually
        read together (promoted together), so the whole pack is read once (one GET,
        at most MAX_PACK bytes, checked against its name) and every member not in the
        cache yet is filled, each verified by its own digest. Each is announced as
        ``{"id", "one": digest, "ident", "size"}``; a failure is only logged."""
        from casfs.store.objects import HEADER_SIZE, parse_header
        from casfs.store.packs import pack_key, parse_index

        with self._packs_lock:
            if pack in self._packs_done or len(self._packs_done) > MAX_PACKS_DONE:
                return
            self._packs_done.add(pack)
        try:
            info = root.objects.backend.info(pack_key(pack))
            if info is None or info.size > MAX_PACK:
                return
            raw = root.objects.backend.read_range(pack_key(pack), 0, info.size)
            if blake3.blake3(raw).hexdigest() != pack:
                raise CorruptObjectError(f"pack {pack}: content does not match its name")
            members = parse_index(raw, pack).members
        except (CasfsError, OSError) as e:
            log.info("read-ahead of pack %s: %s", pack, e)
            return
        root.objects.counters.inc("pack_whole_reads")
        todo: list[tuple[str, bytes, int]] = []
        total = 0
        for digest, (off, length) in sorted(members.items(), key=lambda kv: kv[1][0]):
            if digest in asked or os.path.lexists(object_path(self.directory, digest)):
                continue
            stored = raw[off:off + length]
            try:
                size = parse_header(stored[:HEADER_SIZE], digest).size
            except CasfsError as e:  # that member only
                log.info("read-ahead of %s from pack %s: %s", digest, pack, e)
                continue
            if size <= MAX_PACK_MEMBER and total + size <= MAX_PACK_BYTES:
                total += size
                todo.append((digest, stored, size))

        def one(item: tuple[str, bytes, int]) -> None:
            digest, stored, size = item
            path = object_path(self.directory, digest)
            wrote = False

            def fill() -> int:
                nonlocal wrote
                if os.path.lexists(path):  # a job's own fill ended since the listing
                    return 0
                wrote = True
                return fill_file(self.directory, _Stored(root.objects, stored), digest, size)

            try:
                if not self._once(digest, fill, wait=False) or not wrote:
                    return  # a job's own fill of it runs or ran: that one answers
                st = os.lstat(path)
            except (CasfsError, OSError) as e:  # that member only (rejected: counted)
                log.info("read-ahead of %s from pack %s: %s", digest, pack, e)
                return
            self.send({"id": rid, "one": digest, "size": size,
                       "ident": [st.st_ino, st.st_mtime_ns, st.st_size]})

        list(self.items.map(one, todo))


class _InFlight:
    """A fill running in this worker: others of the same object wait for it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False


class _Stored:
    """An object source for one object whose stored bytes were read already."""

    def __init__(self, objects: Any, stored: bytes) -> None:
        self.objects = objects
        self.stored = stored

    def get_into(self, digest: str, expected_size: int | None, out: Any) -> int:
        return int(self.objects.get_stored_into(digest, expected_size, self.stored, out))


def _failure(e: Exception, digest: object) -> tuple[str, str]:
    """(kind, text) of a failed fill, as the mount process reads them."""
    kind = ("corrupt" if isinstance(e, CorruptObjectError) else
            "missing" if isinstance(e, ObjectMissingError) else "error")
    if not isinstance(e, CasfsError | OSError):
        log.exception("fetch of %s failed", digest)
    return kind, e.message if isinstance(e, CasfsError) else str(e)


def _set_name(name: bytes) -> bool:
    """The process name in /proc/<pid>/comm (at most 15 bytes)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name[:15]))  # PR_SET_NAME
    return True


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the mount process dies, even if every thread is stuck."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(0)  # it died before prctl took effect


def start_child(prog: str, dir_flag: str, threads: int, tag: str, name: bytes,
                argv: list[str] | None) -> argparse.Namespace:
    """The common start of a mount process's worker child: its arguments (``--fd``,
    ``dir_flag``, ``--threads``, ``--parent``, ``--log-level``), death with the
    parent, ^C left to the mount process, logging and the process name."""
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument(dir_flag, type=Path, required=True)
    ap.add_argument("--threads", type=int, default=threads)
    ap.add_argument("--parent", type=int, default=0)
    ap.add_argument("--log-level", choices=sorted(logfmt.LEVELS), default="info")
    args = ap.parse_args(argv)
    if args.parent:
        _die_with_parent(args.parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the mount process
    logfmt.setup(logfmt.LEVELS[args.log_level], tag=tag)
    _set_name(name)
    return args


def main(argv: list[str] | None = None) -> int:
    args = start_child("casfs-fetch-worker", "--dir", 16, "[fetch] ", b"casfs-spare", argv)
    for mod in ("casfs.store.root", "casfs.tenants"):  # now, not while a job waits on us
        importlib.import_module(mod)
    sock = socket.socket(fileno=args.fd)
    Worker(sock, args.dir, args.threads).serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
