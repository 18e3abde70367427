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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from casfs.errors import CasfsError, CorruptObjectError, ObjectMissingError
from casfs.index.objcache import fill_file, object_path
from casfs.node import logfmt
from casfs.node.fetchproc import recv_msg, send_msg
from casfs.util.crashpoint import crashpoint

log = logging.getLogger(__name__)

PROGRESS_EVERY = 0.2  # seconds between progress messages of one fill


class _Roots:
    """Shared roots by (spec, namespace): a namespace's pack locations load once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roots: dict[str, Any] = {}
        self._sent: dict[str, dict[str, int]] = {}

    def get(self, spec: dict[str, Any], namespace: str) -> tuple[str, Any]:
        import json

        key = json.dumps([spec, namespace], sort_keys=True)
        with self._lock:
            root = self._roots.get(key)
        if root is None:
            root = _open_root(spec, namespace)
            with self._lock:
                root = self._roots.setdefault(key, root)
        return key, root

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
                           timeout=float(spec.get("timeout", 10.0)))

    def locate() -> None:  # a packed object with no location yet: read the newest generation
        try:
            gens = root.generations()
            if gens.latest(namespace) is not None:
                gens.entries(namespace)
        except (CasfsError, OSError) as e:
            log.warning("cannot read pack locations of %s: %s", namespace, e)

    root.objects.locator = locate
    return root


class Worker:
    def __init__(self, sock: socket.socket, directory: Path, threads: int) -> None:
        self.sock = sock
        self.directory = directory
        self.roots = _Roots()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="fill")
        self._send_lock = threading.Lock()

    def send(self, msg: dict[str, Any]) -> None:
        with self._send_lock:
            try:
                send_msg(self.sock, msg)
            except OSError:
                os._exit(0)  # the mount process is gone

    def serve(self) -> None:
        named = False
        while True:
            try:
                msg = recv_msg(self.sock)
            except (OSError, ValueError) as e:
                log.error("bad request stream: %s", e)
                msg = None
            if msg is None:
                os._exit(0)  # the mount process closed its end: nothing left to do
            if not named:  # a spare until its first request (ps, top and the benches see it)
                named = _set_name(b"casfs-fetch")
            if msg.get("op") == "fill":
                self.pool.submit(self.fill, msg)

    def fill(self, msg: dict[str, Any]) -> None:
        rid = msg.get("id")
        self.send({"id": rid, "started": True})
        last = [0.0]

        def progressed() -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY:
                last[0] = now
                self.send({"id": rid, "progress": True})

        key, root = "", None
        try:
            digest, size = str(msg["digest"]), int(msg["size"])
            key, root = self.roots.get(msg["root"], str(msg["ns"]))
            if msg.get("pack") is not None:
                root.objects.locate(digest, msg["pack"])
            crashpoint("fetch-worker")
            n = fill_file(self.directory, root.objects, digest, size, progressed)
            st = os.lstat(object_path(self.directory, digest))
            self.send({"id": rid, "ok": True, "n": n,
                       "ident": [st.st_ino, st.st_mtime_ns, st.st_size],
                       "counters": self.roots.counters_delta(key, root)})
        except Exception as e:  # every failure is an answer: the mount turns it into a miss
            kind = ("corrupt" if isinstance(e, CorruptObjectError) else
                    "missing" if isinstance(e, ObjectMissingError) else "error")
            if not isinstance(e, CasfsError | OSError):
                log.exception("fetch of %s failed", msg.get("digest"))
            self.send({"id": rid, "ok": False, "kind": kind,
                       "error": e.message if isinstance(e, CasfsError) else str(e),
                       "counters": self.roots.counters_delta(key, root) if root else {}})


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="casfs-fetch-worker")
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--parent", type=int, default=0)
    ap.add_argument("--log-level", choices=sorted(logfmt.LEVELS), default="info")
    args = ap.parse_args(argv)
    if args.parent:
        _die_with_parent(args.parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the mount process
    logfmt.setup(logfmt.LEVELS[args.log_level], tag="[fetch] ")
    _set_name(b"casfs-spare")
    for mod in ("casfs.store.root", "casfs.tenants"):  # now, not while a job waits on us
        importlib.import_module(mod)
    sock = socket.socket(fileno=args.fd)
    Worker(sock, args.dir, args.threads).serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
