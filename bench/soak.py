"""``python -m bench.soak``: writers and readers over several mounts, with faults, for M minutes.

Several nodes (one state dir and one real FUSE mount each) share one root and
one namespace. Writer threads create files through the mounts; reader threads
read random known paths through random mounts; a chaos thread kills mount
workers (kill -9, then restarts them), their fetch and promotion workers (kill
-9: the mount replaces them itself), corrupts objects in the root in every
way the fault suite knows, and runs gc racing the readers. Every file's bytes
are a function of its path, so any reader can tell a wrong byte.

Prints one JSON object: the invariants' violation counts (I1 wrong bytes, I2
errors other than ENOENT, I4 reads over 10 s), what the job saw, the faults
injected, and the store's state at the end. ``--storm N`` instead times N
processes publishing to one namespace at once (issue 8 item 10).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import multiprocessing as mp
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import blake3

from casfs.errors import CasfsError
from casfs.node.config import MountConfig
from casfs.node.worker import Worker, spawn
from casfs.store.entry import Entry
from casfs.store.objects import object_key
from casfs.store.packs import pack_key, parse_location
from casfs.store.root import SharedRoot

NS = "soak"
NO_HANG = 10.0


def content(path: str) -> bytes:
    """The bytes of ``path``: derived from the path, so any reader can check them."""
    size = 1 + int.from_bytes(blake3.blake3(path.encode()).digest()[:2], "little") % 48_000
    return blake3.blake3(path.encode()).digest(length=size)


class Soak:
    def __init__(self, work: Path, mounts: int, fetch_timeout: float) -> None:
        self.work = work
        self.root = work / "root"
        self.lock = threading.Lock()
        self.known: list[str] = []
        self.seen: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.read_times: list[float] = []
        self.examples: list[str] = []
        self.stop = threading.Event()
        self.cfgs = [MountConfig(
            name=f"n{i}", family="generic", namespace=NS, mountpoint=work / f"mnt{i}",
            root=self.root, state_dir=work / f"state{i}", stable_after=0.3,
            publish_interval=2.0, refresh_interval=2.0, shutdown_timeout=60.0,
            fetch_timeout=fetch_timeout) for i in range(mounts)]
        self.workers: list[Worker | None] = [spawn(c) for c in self.cfgs]
        self.down: set[int] = set()
        self.epoch = [0] * mounts  # bumped when a kill of that mount starts and ends

    # --- the job's side ------------------------------------------------------------------
    def writer(self, wid: int) -> None:
        n = 0
        while not self.stop.is_set():
            i = random.randrange(len(self.cfgs))
            rel = f"w{wid}/{n // 50:03d}/k{n:06d}.bin"
            if i in self.down:
                time.sleep(0.05)
                continue
            p = self.cfgs[i].mountpoint / rel
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
                tmp = p.with_name(p.name + ".tmp")
                tmp.write_bytes(content(rel))
                os.rename(tmp, p)  # the compilers' atomic-write pattern
                with self.lock:
                    self.known.append(rel)
                    self.seen["writes_ok"] += 1
                n += 1
            except OSError as e:
                with self.lock:
                    self.seen[f"write_{errno.errorcode.get(e.errno or 0, e.errno)}"] += 1
            time.sleep(random.uniform(0.0, 0.05))

    def reader(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                rel = random.choice(self.known) if self.known else None
            i = random.randrange(len(self.cfgs))
            if rel is None or i in self.down:
                time.sleep(0.05)
                continue
            t, epoch = time.monotonic(), self.epoch[i]
            try:
                # In a subprocess: a read that hangs is measured, not inherited.
                r = subprocess.run(["cat", str(self.cfgs[i].mountpoint / rel)],
                                   capture_output=True, timeout=60, check=False)
                outcome = ("ok" if r.stdout == content(rel) else "I1_wrong_bytes") \
                    if r.returncode == 0 else (
                    "miss" if b"No such file" in r.stderr else "I2_error")
                if outcome == "I2_error" and self.epoch[i] != epoch:
                    # In flight while its worker was killed: issue 8 item 6's window.
                    outcome = "error_during_worker_kill"
                if outcome.startswith("I"):
                    self.examples.append(f"{outcome} {rel}: {r.stderr[:120]!r}")
            except subprocess.TimeoutExpired:
                outcome = "I4_hang"
            dt = time.monotonic() - t
            with self.lock:
                self.seen[outcome] += 1
                self.read_times.append(dt)
                if dt > NO_HANG:
                    self.seen["I4_over_10s"] += 1

    # --- faults ----------------------------------------------------------------------------
    def chaos(self, interval: float, kills: bool) -> None:
        actions = ["corrupt", "gc", "publish"] + (
            ["kill", "kill_fetch", "kill_promote"] if kills else [])
        while not self.stop.wait(random.uniform(0.5, 1.5) * interval):
            action = random.choice(actions)
            try:
                getattr(self, f"_{action}")()
                self.faults[action] += 1
            except (CasfsError, OSError, subprocess.SubprocessError) as e:
                self.faults[f"{action}_failed"] += 1
                self.examples.append(f"chaos {action}: {e}")

    def _kill(self) -> None:
        i = random.randrange(len(self.cfgs))
        w = self.workers[i]
        if w is None or i in self.down:
            return
        self.down.add(i)  # the job's threads stay away while no worker serves it
        self.epoch[i] += 1
        try:
            os.kill(w.proc.pid, 9)
            w.proc.wait(30)
            w.release()
            subprocess.run(["fusermount3", "-u", "-z", str(self.cfgs[i].mountpoint)],
                           capture_output=True, check=False)
            self.workers[i] = spawn(self.cfgs[i])
        finally:
            self.epoch[i] += 1
            self.down.discard(i)

    def _kill_fetch(self) -> None:
        """kill -9 of a mount's fetch worker: its reads must not notice (retried)."""
        i = random.randrange(len(self.cfgs))
        if self.workers[i] is None or i in self.down:
            return
        from casfs.node import control

        st = control.request(self.cfgs[i].socket_path, "status", timeout=30)
        pid = (st.get("fetch_worker") or {}).get("pid")
        if pid:
            os.kill(int(pid), 9)

    def _kill_promote(self) -> None:
        """kill -9 of a mount's promotion worker: nothing written may be lost (retried)."""
        i = random.randrange(len(self.cfgs))
        if self.workers[i] is None or i in self.down:
            return
        from casfs.node import control

        st = control.request(self.cfgs[i].socket_path, "status", timeout=30)
        pid = (st.get("promote_worker") or {}).get("pid")
        if pid:
            os.kill(int(pid), 9)

    def _corrupt(self) -> None:
        root = SharedRoot.open(self.root)
        gens = root.generations()
        if gens.latest_seq(NS) is None:
            return
        entries = list(gens.entries(NS).entries.values())
        e = random.choice(entries)
        pack = parse_location((e.extras or {}).get("pack"))
        if pack is not None:  # a packed object: damage its range of the pack
            digest, off, length = pack
            with open(self.root / pack_key(digest), "r+b") as f:
                f.seek(off + length - 1)
                b = f.read(1)
                f.seek(off + length - 1)
                f.write(bytes([b[0] ^ 1]))
            self.faults["corrupt_pack_bitflip"] += 1
            return
        path = self.root / object_key(e.digest)
        kind = random.choice(["bitflip", "truncate", "zero", "symlink", "fifo", "directory"])
        data = path.read_bytes()
        path.unlink()
        if kind == "bitflip":
            path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        elif kind == "truncate":
            path.write_bytes(data[: len(data) // 2])
        elif kind == "zero":
            path.write_bytes(b"")
        elif kind == "symlink":
            path.symlink_to("/etc/passwd")
        elif kind == "fifo":
            os.mkfifo(path)
        else:
            path.mkdir()
        self.faults[f"corrupt_{kind}"] += 1

    def _gc(self) -> None:
        subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(self.root),
                        "--state-dir", str(self.work / "gc-state"), "gc", "--keep", "2",
                        "--grace", "5"], capture_output=True, timeout=120, check=False)

    def _publish(self) -> None:
        i = random.randrange(len(self.cfgs))
        w = self.workers[i]
        if w is not None and i not in self.down:
            from casfs.node import control

            control.request(self.cfgs[i].socket_path, "publish", timeout=60)

    def finish(self) -> dict[str, Any]:
        for w in self.workers:
            if w is not None:
                with contextlib.suppress(Exception):
                    w.stop()
        root = SharedRoot.open(self.root)
        gens = root.generations()
        out: dict[str, Any] = {"generations": len(gens.seqs(NS))}
        try:
            snap = gens.entries(NS)
            out["newest_complete"] = True
            out["published_files"] = len(snap.entries)
            # A temp file left by a write that a worker kill interrupted (its rename
            # failed) holds whatever the job wrote: the job's bytes, not checkable here.
            tmps = [rel for rel in snap.entries if rel.endswith(".tmp")]
            wrong = sum(1 for rel, e in snap.entries.items()
                        if not rel.endswith(".tmp") and e.digest != blake3.blake3(
                            content(rel)).hexdigest())
            out["published_wrong_entries"] = wrong
            # Every file a writer created is published by the final publications, however
            # often its mount or its promotion worker was killed (nothing lost).
            out["written_not_published"] = len(set(self.known) - set(snap.entries))
            out["published_leftover_tmp_files"] = len(tmps)
        except CasfsError as e:
            out["newest_complete"] = False
            out["newest_error"] = str(e)
        return out


def soak(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="casfs-soak-", dir=args.workdir))
    s = Soak(work, args.mounts, args.fetch_timeout)
    threads = [threading.Thread(target=s.writer, args=(i,), daemon=True)
               for i in range(args.writers)]
    threads += [threading.Thread(target=s.reader, daemon=True) for _ in range(args.readers)]
    threads.append(threading.Thread(target=s.chaos, args=(args.fault_interval, not args.no_kills),
                                    daemon=True))
    t0 = time.monotonic()
    try:
        for t in threads:
            t.start()
        s.stop.wait(args.minutes * 60)
        s.stop.set()
        for t in threads:
            t.join(120)
        store = s.finish()
    finally:
        for w in s.workers:
            if w is not None:
                subprocess.run(["fusermount3", "-u", "-z", str(w.cfg.mountpoint)],
                               capture_output=True, check=False)
    times = sorted(s.read_times) or [0.0]
    reads = sum(v for k, v in s.seen.items()
                if k in ("ok", "miss", "error_during_worker_kill") or k.startswith("I"))
    result = {
        "bench": "soak", "minutes": args.minutes, "mounts": args.mounts,
        "writers": args.writers, "readers": args.readers,
        "elapsed_s": round(time.monotonic() - t0, 1),
        "reads": reads, "seen": dict(s.seen), "faults": dict(s.faults),
        "I1_wrong_bytes": s.seen["I1_wrong_bytes"], "I2_errors": s.seen["I2_error"],
        "errors_in_flight_at_worker_kill": s.seen["error_during_worker_kill"],
        "I4_reads_over_10s": s.seen["I4_over_10s"] + s.seen["I4_hang"],
        "read_p50_ms": round(statistics.median(times) * 1000, 1),
        "read_p99_ms": round(times[int(len(times) * 0.99) - 1 if len(times) > 1 else 0] * 1000, 1),
        "read_max_s": round(times[-1], 2),
        "store": store, "examples": s.examples[:10],
    }
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _storm_one(root: str, i: int, files: int, barrier: Any, out: Any) -> None:
    sroot = SharedRoot.open(Path(root))
    entries = []
    for k in range(files):
        put = sroot.objects.put_bytes(f"storm {i} {k}".encode())
        entries.append(Entry(f"n{i}/f{k}", put.digest, put.size, 0o644, 1))
    barrier.wait()
    t = time.monotonic()
    try:
        res = sroot.generations().publish(NS, entries, node=f"node{i}")
        out.put((i, res.seq, res.attempts, time.monotonic() - t, None))
    except CasfsError as e:
        out.put((i, None, 0, time.monotonic() - t, str(e)))


def storm(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="casfs-storm-", dir=args.workdir))
    root = SharedRoot.open(work / "root", create=True)
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(args.storm), ctx.Queue()
    procs = [ctx.Process(target=_storm_one, args=(str(root.path), i, args.storm_files, barrier,
                                                  out)) for i in range(args.storm)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results = [out.get(timeout=1800) for _ in procs]
    wall = time.monotonic() - t0
    for p in procs:
        p.join(60)
    gens = root.generations()
    snap = gens.entries(NS)
    attempts = sorted(r[2] for r in results)
    lat = sorted(r[3] for r in results)
    res = {
        "bench": "storm", "publishers": args.storm, "files_each": args.storm_files,
        "landed": sum(1 for r in results if r[1] is not None),
        "failed": [r[4] for r in results if r[1] is None][:5],
        "entries_published": len(snap.entries), "entries_expected": args.storm * args.storm_files,
        "generations": len(gens.seqs(NS)), "wall_s": round(wall, 1),
        "attempts_median": statistics.median(attempts), "attempts_max": attempts[-1],
        "publish_latency_p50_s": round(statistics.median(lat), 2),
        "publish_latency_max_s": round(lat[-1], 2),
    }
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--mounts", type=int, default=3)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--readers", type=int, default=6)
    ap.add_argument("--fault-interval", type=float, default=3.0, metavar="S",
                    help="mean seconds between injected faults")
    ap.add_argument("--fetch-timeout", type=float, default=10.0)
    ap.add_argument("--no-kills", action="store_true", help="no worker kills")
    ap.add_argument("--storm", type=int, metavar="N",
                    help="instead: N processes publishing to one namespace at once")
    ap.add_argument("--storm-files", type=int, default=4)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    res = storm(args) if args.storm else soak(args)
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    ok = (res.get("landed") == args.storm) if args.storm else (
        res["I1_wrong_bytes"] == 0 and res["store"].get("newest_complete"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
