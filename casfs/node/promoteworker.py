"""The promotion worker: promotion and publication of a mount process's namespaces.

``python -m casfs.node.promoteworker --fd N --state-dir <state>``: started by
casfs.node.promoteproc (through casfs.node.fetchproc's machinery, which owns
the other end of socket ``N``). Hashing, compressing, pack and object writes,
manifests and generation records (blake3, zstd, a POSIX or S3 client: native
code and shared storage) run here, so a crash, an OOM kill or a hang costs the
mount process a retried round, never its FUSE connection.

Requests (one thread each; the mount process sends one at a time per namespace):

    {"op": "promote", "id", "root": {spec}, "ns", "upper", "family", "scratch",
     "packs", "max_seq", "paths": [rel, ...], "newest": [seq, when] | null,
     "record": the max_seq record as the mount read it | null}
        -> {"ok": true, "promoted", "bytes", "deferred", "errors", "last_error",
            "events": [["f", rel, seen_at] | ["m", rel], ...], "counters": {...}}
    {"op": "publish", "id", "root", "ns", "family", "scratch", "fingerprint",
     "max_bytes", "opened": [path, ...], "newest": [seq, when] | null}
        ("newest": the newest generation the mount found, at CLOCK_MONOTONIC ``when``)
        -> {"ok": true, "published": bool, "message", "result": {...} | null,
            "lost": [path, ...], "profiled": bool, "counters": {...}}
    {"op": "reads", "id", "root", "ns", "node", "paths", "time", "until"}
        -> {"ok": true, "key": name | null}   a read record (casfs.store.reads)

The mount process's WriteTracker stays there: a promote request carries the
paths it found quiet, and the reply the tracker events the round made
(``f``: forget the path unless it changed after ``seen_at``, a
CLOCK_MONOTONIC time, the same clock in both processes; ``m``: the path is
dirty). The node index is this process's own LMDB environment (never one
inherited: the process is exec'ed, not forked); promoted rows are written
here, after the packs they name are complete, as in-process promotion does.
Signs of life (``progress``, at most every 0.2 s) follow each step of each
path and each shared-root call, so a round that moves is never taken for a
hung one.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

from casfs import families
from casfs.errors import CasfsError
from casfs.index.node_index import NodeIndex
from casfs.node.fetchworker import ChildServer, OpenOnce, start_child
from casfs.promote.promoter import Promoter
from casfs.promote.publisher import Publisher, profile_options
from casfs.store.backend import Backend
from casfs.util.counters import Counters

log = logging.getLogger(__name__)

PROGRESS_EVERY = 0.2  # seconds between progress messages of one request
CPU_SIGN_OF_LIFE = 0.01  # CPU seconds per PROGRESS_EVERY that count as work going on
MAX_SPACES = 32  # (root, namespace) handles kept between requests (a host serves many)


class _Activity:
    """A counter every step of every request bumps; requests in flight report it moving."""

    def __init__(self) -> None:
        self.n = 0

    def tick(self) -> None:
        self.n += 1  # racy increments only lose a tick, never the sign of life


class _Progressed:
    """A backend whose every call is a sign of life (a hung root makes none)."""

    def __init__(self, inner: Backend, activity: _Activity) -> None:
        self._inner = inner
        self._activity = activity

    def __getattr__(self, name: str) -> Any:
        v = getattr(self._inner, name)
        if not callable(v):
            return v

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return v(*args, **kwargs)
            finally:
                self._activity.tick()

        return call


class _RoundTracker:
    """The WriteTracker side of one promote request: the mount's quiet paths in, the
    tracker events of the round out (applied to the real tracker by the mount)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        self.events: list[list[Any]] = []

    def quiet(self, stable_after: float, *, with_writers: bool = False) -> list[str]:
        return list(self.paths)

    def has_writers(self, path: str) -> bool:
        return False  # the mount's tracker keeps a path opened meanwhile dirty (seen_at)

    def forget(self, path: str, seen_at: float | None = None) -> None:
        self.events.append(["f", path, seen_at])

    def modified(self, path: str) -> None:
        self.events.append(["m", path])


class _Namespace:
    """One (root, namespace): its SharedRoot, generations and counters, kept between
    requests (the objects a round remembers and the manifests publication read)."""

    def __init__(self, spec: dict[str, Any], ns: str, activity: _Activity) -> None:
        from casfs.store.root import SharedRoot
        from casfs.tenants import TenantPolicy
        from casfs.util.location import parse_location

        self.lock = threading.Lock()
        self.counters = Counters()
        self._sent: dict[str, int] = {}
        policy = TenantPolicy.from_dict(spec["tenants"]) if spec.get("tenant") else None
        # Reads the marker itself (not spec["marker"]): a root that cannot answer it
        # fails the round at once, in one line ("cannot reach the shared root").
        root = SharedRoot.open(parse_location(spec["root"]), tenants=policy,
                               counters=self.counters, timeout=float(spec.get("timeout", 10.0)))
        root.backend = root.objects.backend = cast(Backend, _Progressed(root.backend, activity))
        self.root = root
        self.gens = root.generations()
        self.ns = ns
        self.located = -1  # the generation whose pack locations this process read

    def locate(self, seq: int, record: str | None = None) -> None:
        """Learn where packs hold the served generation's objects (the mount process
        knows from the manifests it ingested; this process reads them once per new
        generation): a round then reuses those packs instead of writing the bytes again.
        ``record``: that generation's record as the mount read it (no GET of it)."""
        if seq <= self.located:
            return
        try:
            if record is not None and seq > 0:
                try:
                    self.gens.note_record(self.ns, seq, record.encode())
                except (CasfsError, ValueError):
                    record = None  # read from the root, as without it
            if seq > 0:  # that generation's record and parts: no LIST, no probing for it
                rec = self.gens.record(self.ns, seq, cached=record is not None)
                self._fetch_profile(rec.options.get("profile"))
                self.gens.snapshot(rec)  # registers pack locations
            self.located = seq
        except (CasfsError, OSError) as e:
            log.warning("cannot read pack locations of %s: %s", self.ns, e)

    def _fetch_profile(self, digest: object) -> None:
        """The served record's access profile, read beside its parts and the round's
        writes (ObjectStore.read_ahead): the publication that follows merges onto it
        (profile_options), and it was a round trip of its own after the pack's PUT."""
        if isinstance(digest, str):
            self.root.objects.read_ahead(digest)

    def counters_delta(self) -> dict[str, int]:
        with self.lock:
            now = self.counters.snapshot()
            last, self._sent = self._sent, now
        return {k: v - last.get(k, 0) for k, v in now.items() if v != last.get(k, 0)}


class Worker(ChildServer):
    NAME = b"casfs-promote"

    def __init__(self, sock: socket.socket, state_dir: Path, threads: int) -> None:
        super().__init__(sock, threads, "promote")
        self.state_dir = state_dir
        self._lock = threading.Lock()
        self._busy = threading.Condition(self._lock)  # a request is in flight
        self._index: NodeIndex | None = None
        # One opening per namespace: requests that come together (a release's two
        # records, beside a prepare still reading the marker) wait for it, not each
        # read the marker again; released namespaces' caches go past MAX_SPACES.
        self._spaces: OpenOnce[_Namespace] = OpenOnce(keep=MAX_SPACES)
        self.activity = _Activity()
        self._inflight: dict[int, int] = {}  # request id -> activity count last reported

    def handler(self, op: Any) -> Callable[[dict[str, Any]], None] | None:
        return self.run if op in ("prepare", "promote", "publish", "reads", "outcomes") else None

    def serve(self) -> None:
        threading.Thread(target=self._report, name="progress", daemon=True).start()
        super().serve()

    def _report(self) -> None:
        """Progress for each request in flight whose work moved since the last report:
        a step or a shared-root call finished, or the process burnt CPU (hashing or
        compressing one large file is one step; a hung root or a stopped process
        burns none)."""
        cpu = time.process_time()
        while True:
            with self._busy:
                while not self._inflight:  # idle: no wake-ups between rounds
                    self._busy.wait()
            time.sleep(PROGRESS_EVERY)
            now_cpu = time.process_time()
            if now_cpu - cpu >= CPU_SIGN_OF_LIFE:
                self.activity.tick()
            cpu = now_cpu
            now = self.activity.n
            with self._lock:
                moved = [rid for rid, seen in self._inflight.items() if seen != now]
                for rid in moved:
                    self._inflight[rid] = now
            for rid in moved:
                self.send({"id": rid, "progress": True})

    def index(self) -> NodeIndex:
        with self._lock:
            if self._index is None:
                self._index = NodeIndex.open(self.state_dir)
            return self._index

    def space(self, spec: dict[str, Any], ns: str) -> _Namespace:
        return self._spaces.get(json.dumps([spec, ns], sort_keys=True),
                                lambda: _Namespace(spec, ns, self.activity))

    def run(self, msg: dict[str, Any]) -> None:
        rid = msg.get("id")
        if not isinstance(rid, int):
            return
        with self._busy:
            self._inflight[rid] = self.activity.n
            self._busy.notify()
        self.send({"id": rid, "started": True})
        sp: _Namespace | None = None
        try:
            sp = self.space(msg["root"], str(msg["ns"]))
            newest = msg.get("newest")
            if isinstance(newest, list) and len(newest) == 2:
                sp.gens.note_newest(sp.ns, int(newest[0]), float(newest[1]))
            op = msg["op"]
            out = (self.prepare(sp, msg) if op == "prepare" else
                   self.promote(sp, msg) if op == "promote" else
                   self.publish(sp, msg) if op == "publish" else
                   self.outcomes(sp, msg) if op == "outcomes" else self.reads(sp, msg))
            reply = {"id": rid, "ok": True, **out}
        except Exception as e:  # every failure is an answer: the mount retries next round
            if not isinstance(e, CasfsError | OSError):
                log.exception("%s of %s failed", msg.get("op"), msg.get("ns"))
            # "bug": not the environment (a root down, a full disk) but this input:
            # the mount then isolates the file it cannot promote (WorkerBugError).
            reply = {"id": rid, "ok": False,
                     "kind": "error" if isinstance(e, CasfsError | OSError) else "bug",
                     "error": e.message if isinstance(e, CasfsError) else
                     str(e) or type(e).__name__}
        with self._lock:
            self._inflight.pop(rid, None)
        reply["counters"] = sp.counters_delta() if sp is not None else {}
        self.send(reply)

    def prepare(self, sp: _Namespace, msg: dict[str, Any]) -> dict[str, Any]:
        """The namespace's root is open now (``space``, its marker read) and the node
        index too: a release's records need not wait for them after a short job. Pack
        locations are read at the first round, if one comes (every node of a fleet
        reading the served record twice is what the request budget rules out)."""
        self.index()
        return {}

    def promote(self, sp: _Namespace, msg: dict[str, Any]) -> dict[str, Any]:
        ns, idx = sp.ns, self.index()
        record = msg.get("record")
        sp.locate(int(msg["max_seq"]), record if isinstance(record, str) else None)
        tracker = _RoundTracker([str(p) for p in msg["paths"]])
        p = Promoter(
            upper=Path(msg["upper"]), objects=sp.root.objects, index=idx, key=ns,
            rules=families.rules(str(msg["family"]), msg.get("scratch") or ()),
            tracker=tracker,  # type: ignore[arg-type]  # the WriteTracker calls a round makes
            counters=sp.counters, lower=idx.lower_tree(ns, int(msg["max_seq"])),
            stable_after=0.0, packs=bool(msg.get("packs", True)), root_id=sp.root.root_id,
            probe_loose=sp.root.is_local, progress=self.activity.tick)
        res = p.run_once(final=True)  # the mount chose the quiet paths
        return {"promoted": res.promoted, "bytes": res.bytes, "deferred": res.deferred,
                "errors": res.errors, "last_error": res.last_error, "linked": res.linked,
                "ctimes": p.ctimes, "events": tracker.events}

    def publish(self, sp: _Namespace, msg: dict[str, Any]) -> dict[str, Any]:
        lost: list[str] = []
        pub = Publisher(
            generations=sp.gens, index=self.index(), key=sp.ns, namespace=sp.ns,
            counters=sp.counters,
            rules=families.rules(str(msg["family"]), msg.get("scratch") or ()),
            fingerprint=msg.get("fingerprint"), max_bytes=msg.get("max_bytes"),
            on_lost=lost.append)
        opened = [str(p) for p in msg.get("opened") or []]
        profiled = [False]

        def options(published: list[Any], base: Any) -> dict[str, Any]:
            out = profile_options(sp.gens, sp.ns, opened, published, sp.counters, base)
            profiled[0] = bool(out)
            return out

        pub.options_for = options
        first = msg.get("first_miss")
        if isinstance(first, dict):
            pub.first_miss = {str(k): int(v) for k, v in first.items()}
        out = pub.publish()
        return {"published": out.ok, "message": out.message,
                "result": asdict(out.result) if out.result is not None else None,
                "lost": lost, "profiled": profiled[0], "timed": list(out.timed)}

    def outcomes(self, sp: _Namespace, msg: dict[str, Any]) -> dict[str, Any]:
        """An outcome record of the mount's jobs (casfs.store.outcomes)."""
        from casfs.store import outcomes

        doc = dict(msg["outcome"])
        doc["missed"] = [(str(e), int(n)) for e, n in doc.get("missed") or []]
        return {"key": outcomes.record(sp.root.backend, sp.ns, **doc)}

    def reads(self, sp: _Namespace, msg: dict[str, Any]) -> dict[str, Any]:
        """A read record of what the mount's jobs opened (casfs.store.reads)."""
        from casfs.store import reads

        until = msg.get("until")
        key = reads.record(sp.root.backend, sp.ns, str(msg["node"]),
                           [str(p) for p in msg["paths"]], float(msg["time"]),
                           until=float(until) if until is not None else None)
        return {"key": key}


def main(argv: list[str] | None = None) -> int:
    args = start_child("casfs-promote-worker", "--state-dir", 8, "[promote] ",
                       b"casfs-promote", argv)
    families.names()  # the registry, loaded before requests come in threads
    sock = socket.socket(fileno=args.fd)
    Worker(sock, args.state_dir, args.threads).serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
