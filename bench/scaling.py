"""How casfs's costs grow with the namespace: 1,000 -> 100,000 files.

    python -m bench.scaling [--sizes 1000,10000,100000] [--json F] [--plot F.png]

Per size, one generation of N small files (dirs of 7, 1-4 KB; the first 2,100
files unique, the rest sharing a pool of contents: entry counts, not bytes,
drive these costs) and, on a fresh node each time:

* ready: ``fuse`` mount spawn to READY (reads and indexes the manifest);
  ``overlay`` mount spawn to READY on a fresh node (builds the links layer);
* first touch / warm: one reader over the same 2,100-file sample (300 dirs),
  so the per-file cost is comparable across sizes;
* memory: the mount process's RSS at ready and after the sample was read;
* publication: 10 new files on top of the N entries, by a long-running
  daemon (parsed manifests cached) and by a new process.

Prints one JSON document; ``--plot`` draws the figures against N (matplotlib,
a bench extra: ``pip install matplotlib``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import PY, log, rmtree, run_proc
from bench.mounts import config, mounted
from casfs.store.entry import Entry
from casfs.store.generations import GenerationStore
from casfs.store.root import SharedRoot
from casfs.view import overlay

SAMPLE_DIRS = 300
POOL = 2000


def publish_tree(root: SharedRoot, ns: str, files: int) -> None:
    rng = random.Random(files)
    objs = root.objects
    pool: list[tuple[str, int]] = []
    entries: list[Entry] = []
    for i in range(files):
        d, f = divmod(i, 7)
        if i < SAMPLE_DIRS * 7 or len(pool) < POOL:
            data = rng.randbytes(rng.randrange(1000, 4000))
            put = objs.put_bytes(data)
            if i >= SAMPLE_DIRS * 7:
                pool.append((put.digest, len(data)))
            digest, size = put.digest, len(data)
        else:
            digest, size = pool[i % POOL]
        entries.append(Entry(f"d{d:06d}/f{f}", digest, size, 0o644, 1_700_000_000_000_000_000))
    root.generations().publish(ns, entries, node="bench")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def read_sample(top: Path) -> dict[str, Any]:
    dirs = [str(top / f"d{d:06d}") for d in range(SAMPLE_DIRS)]
    p = run_proc([PY, "-m", "bench.clients", "read", *dirs])
    if p.rc != 0:
        raise RuntimeError("reader failed")
    out: dict[str, Any] = json.loads(p.stdout)
    return out


def publication(root_path: Path, ns: str) -> dict[str, float]:
    proto = Entry("x", "0" * 64, 0, 0o644, 0)
    kept = GenerationStore(SharedRoot.open(root_path))
    kept.snapshot(kept.latest(ns))
    out: dict[str, float] = {}
    for label, gens in (("fresh_process", GenerationStore(SharedRoot.open(root_path))),
                        ("daemon", kept)):
        data = os.urandom(100)
        put = gens.root.objects.put_bytes(data)
        batch = [Entry(f"new-{label}/f{j}", put.digest, len(data), 0o644, proto.mtime_ns)
                 for j in range(10)]
        t0 = time.perf_counter()
        gens.publish(ns, batch, node="bench")
        out[f"publish10_{label}_s"] = round(time.perf_counter() - t0, 4)
    return out


def measure(work: Path, files: int) -> dict[str, Any]:
    root_path = work / "root"
    ns = f"scale-{files}"
    log(f"scaling: publishing {files} entries")
    publish_tree(SharedRoot.open(root_path, create=True), ns, files)
    res: dict[str, Any] = {"files": files}
    state = work / f"state-{files}"
    with mounted(config(root_path, state, work / "mnt", ns)) as m:
        res["ready_s"] = round(m.ready_seconds, 3)
        res["rss_ready_mb"] = rss_mb(m.pid)
        first = read_sample(m.path)
        warm = read_sample(m.path)
        res["first_touch_files_per_s"] = first["files_per_s"]
        res["warm_files_per_s"] = warm["files_per_s"]
        res["rss_after_sample_mb"] = rss_mb(m.pid)
    rmtree(state)
    if overlay.unavailable_reason() is None:
        with mounted(config(root_path, state, work / "mnt", ns, mode="overlay")) as m:
            res["overlay_ready_fresh_s"] = round(m.ready_seconds, 3)
        rmtree(state)
    res.update(publication(root_path, ns))
    return res


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["files"] for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    ax = axes[0]
    for key, label in (("ready_s", "fuse mount ready"), ("overlay_ready_fresh_s",
                                                         "overlay mount ready (fresh node)"),
                       ("publish10_fresh_process_s", "publish 10 files, new process"),
                       ("publish10_daemon_s", "publish 10 files, daemon")):
        if all(key in r for r in results):
            ax.plot(xs, [r[key] for r in results], marker="o", label=label)
    ax.set(xscale="log", xlabel="files in the namespace", ylabel="seconds", title="latency")
    ax.legend(fontsize=8)
    ax = axes[1]
    for key, label in (("first_touch_files_per_s", "first touch"),
                       ("warm_files_per_s", "warm")):
        ax.plot(xs, [r[key] for r in results], marker="o", label=label)
    ax.set(xscale="log", xlabel="files in the namespace", ylabel="files/s",
           title="reads of a fixed 2,100-file sample")
    ax.legend(fontsize=8)
    ax = axes[2]
    for key, label in (("rss_ready_mb", "at ready"), ("rss_after_sample_mb", "after the sample")):
        ax.plot(xs, [r[key] for r in results], marker="o", label=label)
    ax.set(xscale="log", xlabel="files in the namespace", ylabel="MB", title="mount RSS")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__)
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="casfs-scaling-") as d:
        for n in sizes:
            results.append(measure(Path(d), n))
            log(f"scaling: {results[-1]}")
    doc = {"loadavg": os.getloadavg(), "cpus": os.cpu_count(), "results": results}
    text = json.dumps(doc, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
