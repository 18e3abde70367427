"""The store benchmarks with the shared root on SeaweedFS (S3) beside a POSIX root, as ratios.

Usage: ``python -m bench.s3_store [--files 2000] [--repeat 1] [--workdir DIR]``

Prints one JSON document. One synthetic Triton-like tree (bench.store_figures:
IR text and random "cubins", median ~20 KB) is imported four ways: POSIX
root with loose objects, POSIX with packs, S3 with loose objects, S3 with
packs. For each: promotion (import) MB/s and objects/s, backend requests
per verb (counted on the Backend, so they are what the server sees),
publication latency of a 10-file delta, mount-ready (open the root, find the
newest generation, load its snapshot), first touch (fetch every file's
verified bytes from a fresh reader: the lazy-fetch path) and stored bytes.
Ratios are S3 over POSIX for the same layout. SeaweedFS runs on loopback on
the same (shared, loaded) machine, so absolute numbers are noisy: compare
within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from seaweed import seaweed

from bench.store_figures import synthetic_source
from casfs.families import rules
from casfs.promote.importer import import_tree
from casfs.store import maintenance
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot

VERBS = ("put_if_absent", "create_exclusive", "replace", "open", "read_range", "info", "list",
         "delete")


class CountingBackend:
    """Counts each verb the store asks of the real backend (one verb = one request on S3)."""

    def __init__(self, inner: Any, counts: Counter[str]) -> None:
        self._inner = inner
        self._counts = counts
        self.staging_dir = inner.staging_dir

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in VERBS:
            return attr

        def counted(*a: Any, **kw: Any) -> Any:
            self._counts[name] += 1
            return attr(*a, **kw)

        return counted


def _open(location: Any, counts: Counter[str]) -> SharedRoot:
    root = SharedRoot.open(location, create=True)
    root.backend = CountingBackend(root.backend, counts)  # type: ignore[assignment]
    root.objects.backend = root.backend
    return root


def run_case(location: Any, src: Path, nbytes: int, packs: bool, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    counts: Counter[str] = Counter()
    root = _open(location, counts)
    t0 = time.perf_counter()
    rep = import_tree(root, src, "bench", rules=rules("triton"), node="bench", packs=packs)
    dt = time.perf_counter() - t0
    out["promotion_mb_s"] = round(nbytes / dt / 1e6, 1)
    out["promotion_objects_s"] = round(rep.files / dt, 1)
    out["promotion_requests"] = dict(counts)
    out["promotion_requests_total"] = sum(counts.values())
    out["files"] = rep.files
    # publication latency: a 10-file delta on top
    adds = []
    for i in range(10):
        res = root.objects.put_bytes(f"late file {i} {time.time()}".encode())
        adds.append(Entry(f"late/{i}", res.digest, res.size, 0o644, 0))
    counts.clear()
    t0 = time.perf_counter()
    root.generations().publish("bench", adds, node="bench")
    out["publish_10_s"] = round(time.perf_counter() - t0, 4)
    out["publish_requests"] = sum(counts.values())
    # mount-ready: a fresh reader finds the newest generation and loads its snapshot
    counts.clear()
    t0 = time.perf_counter()
    reader = _open(location, counts)
    gens = reader.generations()
    snap = gens.entries("bench")
    out["ready_s"] = round(time.perf_counter() - t0, 4)
    out["ready_requests"] = sum(counts.values())
    # first touch: every file's verified bytes, one after the other (the lazy-fetch path)
    counts.clear()
    t0 = time.perf_counter()
    got = 0
    for e in snap.entries.values():
        got += len(reader.objects.get_bytes(e.digest, e.size))
    dt = time.perf_counter() - t0
    out["first_touch_files_s"] = round(len(snap.entries) / dt, 1)
    out["first_touch_mb_s"] = round(got / dt / 1e6, 1)
    out["first_touch_requests"] = sum(counts.values())
    du = maintenance.usage(SharedRoot.open(location))
    out["stored_bytes"] = du.stored_bytes
    out["stored_objects"] = du.objects
    out["packs"] = du.packs
    return out


def run_promotion(location: Any, src: Path, nbytes: int, packs: bool, work: Path,
                  name: str, profiler: Any = None) -> dict[str, Any]:
    """A mount's promotion and publication (casfs.promote: the code ``casfs publish`` runs
    in a mount process), over an upper holding the tree, with the node's real LMDB index."""
    from casfs.index.node_index import NodeIndex
    from casfs.promote.promoter import Promoter
    from casfs.promote.publisher import Publisher
    from casfs.promote.tracker import WriteTracker
    from casfs.util.counters import Counters

    upper = work / f"upper-{name}"
    shutil.copytree(src, upper)
    counts: Counter[str] = Counter()
    root = _open(location, counts)
    index = NodeIndex.open(work / f"state-{name}")
    counters, tracker, r = Counters(), WriteTracker(), rules("triton")
    try:
        promoter = Promoter(
            upper=upper, objects=root.objects, index=index, key="bench-promote", rules=r,
            tracker=tracker, counters=counters, lower=index.lower_tree("bench-promote", 0),
            stable_after=0.0, packs=packs, root_id=root.root_id, probe_loose=root.is_local)
        publisher = Publisher(
            generations=root.generations(), index=index, key="bench-promote",
            namespace="bench-promote", counters=counters, rules=r, fingerprint=None,
            max_bytes=None)
        promoter.scan_all()
        if profiler is not None:  # bench.promotion --profile: this part only
            profiler.enable()
        c0 = time.process_time()  # every thread of this process: robust to others' load
        t0 = time.perf_counter()
        res = promoter.run_once(final=True)
        promote_s = time.perf_counter() - t0
        promote_requests = sum(counts.values())
        t1 = time.perf_counter()
        out = publisher.publish()
        publish_s = time.perf_counter() - t1
        cpu_s = time.process_time() - c0
        if profiler is not None:
            profiler.disable()
    finally:
        index.close()
    assert out.ok and res.errors == 0, (out.message, res.last_error)
    total = promote_s + publish_s
    return {
        "files": res.promoted, "promote_s": round(promote_s, 3), "publish_s": round(publish_s, 3),
        "mb_s": round(nbytes / total / 1e6, 1), "objects_s": round(res.promoted / total, 1),
        "promote_only_mb_s": round(nbytes / promote_s / 1e6, 1),
        # MB per CPU-second of promotion + publication (all threads): what one idle core
        # would sustain, whatever else loads the machine (SeaweedFS's own CPU not counted)
        "cpu_s": round(cpu_s, 3), "mb_per_cpu_s": round(nbytes / cpu_s / 1e6, 1),
        "requests_promote": promote_requests,
        "requests_total": sum(counts.values()), "requests": dict(counts),
        "packs": counters.get("packs_promoted"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.s3_store", description=__doc__)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=1,
                    help="mount promotions per case (the best one is reported)")
    ap.add_argument("--workdir", type=Path)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="casfs-s3store-", dir=args.workdir))
    result: dict[str, Any] = {}
    try:
        src, nbytes = synthetic_source(work, args.files, result)
        with seaweed(work / "weed") as srv:
            os.environ.update(srv.env())
            srv.create_bucket("bench")
            cases = {
                "posix_loose": (work / "root-loose", False),
                "posix_packs": (work / "root-packs", True),
                "s3_loose": (f"s3://bench/loose?endpoint={srv.endpoint}", False),
                "s3_packs": (f"s3://bench/packs?endpoint={srv.endpoint}", True),
            }
            for name, (loc, packs) in cases.items():
                print(f"--- {name}", file=sys.stderr)
                result[name] = run_case(loc, src, nbytes, packs, work)
            # A mount's promotion (casfs publish in a mount process), each run on a fresh
            # root (nothing dedups against the imports above): the best of --repeat.
            promo = {
                "posix_loose": (lambda i: work / f"proot-loose{i}", False),
                "posix_packs": (lambda i: work / f"proot-packs{i}", True),
                "s3_loose": (lambda i: f"s3://bench/ploose{i}?endpoint={srv.endpoint}", False),
                "s3_packs": (lambda i: f"s3://bench/ppacks{i}?endpoint={srv.endpoint}", True),
            }
            result["mount_promotion"] = {}
            for name, (loc, packs) in promo.items():
                print(f"--- mount promotion {name}", file=sys.stderr)
                runs = [run_promotion(loc(i), src, nbytes, packs, work, f"{name}{i}")
                        for i in range(args.repeat)]
                result["mount_promotion"][name] = max(runs, key=lambda r: r["mb_s"])
            result["loadavg_end"] = round(os.getloadavg()[0], 2)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios: dict[str, dict[str, float]] = {}
    for layout in ("loose", "packs"):
        p, s = result[f"posix_{layout}"], result[f"s3_{layout}"]
        ratios[layout] = {k: round(s[k] / p[k], 2) for k in p
                          if isinstance(p[k], int | float) and p[k]}
    mp = result["mount_promotion"]
    for layout in ("loose", "packs"):
        p, s = mp[f"posix_{layout}"], mp[f"s3_{layout}"]
        ratios[f"mount_promotion_{layout}"] = {
            k: round(s[k] / p[k], 2) for k in ("mb_s", "objects_s", "requests_total") if p[k]}
    result["s3_over_posix"] = ratios
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
