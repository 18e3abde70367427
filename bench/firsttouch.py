"""First touch through a FUSE mount on a fresh node: where the time of a cold open goes.

    python -m bench.firsttouch [--kernels 600] [--rounds 2] [--packs] [--work DIR]
    python -m bench.firsttouch --latency [--packs]   per-open times, first file of a dir apart

Builds the Triton-like tree of bench.readpath (600 kernel dirs: 4,200 files,
81 MB), imports it into a shared root on local disk (small objects in packs),
(``--packs``: small objects in packs, as a node's promotion
stores them), then per round: a fresh node (its own state dir) mounts the namespace, the
page cache is dropped, and one reader process reads every file once. Prints
one JSON line: wall files/s, plain cold files/s (the source directory after
drop_caches), and the CPU microseconds per file of the mount process, of its
fetch worker and of the reader, with the load average and the mount's
counters (objects fetched, prefetched neighbours). CPU figures survive the
machine's load; wall figures do not.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench import tree
from bench.common import drop_caches, median, proc_cpu, rmtree
from bench.mounts import config, mounted
from bench.readpath import reader
from casfs.families import rules as family_rules
from casfs.promote.importer import import_tree
from casfs.store.root import SharedRoot


def _children(pid: int) -> list[int]:
    """Every child of ``pid``, whichever of its threads started it."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            out += [int(x) for x in (task / "children").read_text().split()]
    return out


def _fetch_worker_cpu(pid: int) -> float:
    """CPU seconds of the mount process's serving fetch worker(s) (not the idle spare)."""
    total = 0.0
    for c in _children(pid):
        try:
            comm = Path(f"/proc/{c}/comm").read_text().strip()
            if comm == "casfs-fetch":
                total += proc_cpu(c)
        except OSError:
            pass
    return total


def _sys_cpu(pid: int) -> float:
    """System-time seconds of a live process (the kernel's share of proc_cpu)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[12]) / os.sysconf("SC_CLK_TCK")


def _fetch_workers(pid: int) -> list[int]:
    out = []
    for c in _children(pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{c}/comm").read_text().strip() in ("casfs-fetch", "casfs-spare"):
                out.append(c)
    return out


def one_round(src: Path, root: Path, work: Path, ns: str, i: int,
              perf: Path | None = None, warm_index: bool = False) -> dict[str, Any]:
    state = work / f"node{i}"
    rmtree(state)
    with mounted(config(root, state, work / "mnt", ns)) as m:
        drop_caches()
        if warm_index:  # the node index back in the page cache (as right after a mount)
            (state / "index" / "data.mdb").read_bytes()
        load = os.getloadavg()[0]
        c0, w0, s0 = m.cpu(), _fetch_worker_cpu(m.pid), _sys_cpu(m.pid)
        rec = None
        if perf is not None:  # where the CPU goes: the mount process and its fetch workers
            pids = ",".join(map(str, [m.pid, *_fetch_workers(m.pid)]))
            rec = subprocess.Popen(["perf", "record", "-q", "-g", "-p", pids, "-o",
                                    str(perf)], stdout=subprocess.DEVNULL)
            time.sleep(0.5)
        r = reader(m.path)
        if rec is not None:
            rec.send_signal(signal.SIGINT)
            rec.wait(60)
        c1, w1, s1 = m.cpu(), _fetch_worker_cpu(m.pid), _sys_cpu(m.pid)
        counters = m.ask("stats")["counters"]
    rmtree(state)
    drop_caches()
    plain = reader(src)
    n = r["files"]
    return {"files": n, "seconds": r["seconds"], "files_per_s": r["files_per_s"],
            "plain_cold_files_per_s": plain["files_per_s"],
            "over_plain_cold": round(r["seconds"] / plain["seconds"], 2),
            "mount_cpu_us_per_file": round((c1 - c0) / n * 1e6, 1),
            "mount_sys_cpu_us_per_file": round((s1 - s0) / n * 1e6, 1),
            "worker_cpu_us_per_file": round((w1 - w0) / n * 1e6, 1),
            "reader_cpu_us_per_file": round(r["cpu_s"] / n * 1e6, 1),
            "load_1m": round(load, 2), "load_1m_after": round(os.getloadavg()[0], 2),
            "counters": {k: v for k, v in counters.items() if k.startswith(
                ("objects_fetched", "packed_reads", "readahead_", "cache_verified",
                 "rejections", "fetch_"))}}


def latencies(root: Path, work: Path, ns: str) -> dict[str, Any]:
    """One pass timing each file's open + read in this process: a directory's first
    file (a cold fetch) apart from the others (read ahead while it was read)."""
    state = work / "node-lat"
    rmtree(state)
    first: list[float] = []
    rest: list[float] = []
    with mounted(config(root, state, work / "mnt", ns)) as m:
        drop_caches()
        load = os.getloadavg()[0]
        t00 = time.perf_counter()
        for dirpath, _, names in os.walk(m.path):
            for i, n in enumerate(sorted(names)):
                t0 = time.perf_counter()
                with open(os.path.join(dirpath, n), "rb") as f:
                    f.read()
                (first if i == 0 else rest).append(time.perf_counter() - t0)
        total = time.perf_counter() - t00
        waits = m.ask("stats")["counters"].get("readahead_waits", 0)
    rmtree(state)

    def ms(xs: list[float], p: float) -> float:
        return round(sorted(xs)[int(p * (len(xs) - 1))] * 1e3, 3)

    return {"files": len(first) + len(rest), "seconds": round(total, 2), "load_1m": load,
            "first_in_dir": {"n": len(first), "sum_s": round(sum(first), 2),
                             "p50_ms": ms(first, .5), "p90_ms": ms(first, .9)},
            "others": {"n": len(rest), "sum_s": round(sum(rest), 2), "p50_ms": ms(rest, .5),
                       "p90_ms": ms(rest, .9), "p99_ms": ms(rest, .99)},
            "readahead_waits": waits}


def main() -> None:
    ap = argparse.ArgumentParser(prog="bench.firsttouch")
    ap.add_argument("--kernels", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/casfs-firsttouch"))
    ap.add_argument("--latency", action="store_true",
                    help="one pass timing each open: a directory's first file vs the others")
    ap.add_argument("--perf", type=Path, help="perf record the first round into this file")
    ap.add_argument("--warm-index", action="store_true",
                    help="read the node index back into the page cache after drop_caches")
    ap.add_argument("--packs", action="store_true",
                    help="small objects in packs, as a node's promotion stores them")
    args = ap.parse_args()
    work = args.work / ("packed" if args.packs else "loose")
    src, root = work / "src", work / "root"
    ns = f"bench-first-{args.kernels}"
    if not (work / "built").exists():
        rmtree(work)
        tree.build(src, args.kernels, seed=f"read{args.kernels}")
        import_tree(SharedRoot.open(root, create=True), src, ns, rules=family_rules("triton"),
                    node="bench", packs=args.packs)
        (work / "built").write_text(str(time.time()))
    if args.latency:
        print(json.dumps(latencies(root, work, ns)))
        return
    rounds = [one_round(src, root, work, ns, i, args.perf if i == 0 else None, args.warm_index)
              for i in range(args.rounds)]
    out = {"packs": args.packs, "warm_index": args.warm_index, "rounds": rounds,
           "median_files_per_s": median([r["files_per_s"] for r in rounds]),
           "median_over_plain_cold": median([r["over_plain_cold"] for r in rounds])}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
