"""4. Write and promotion.

* Client writes: a process writing a Triton-like tree the way Triton's
  FileCacheManager.put does (bench.clients), through a casfs mount and into a
  plain directory; ratio of the two. Beside them, the same writes through the
  pyfuse3 write floor (bench.floorwfs): ``floor_over_plain``, ``casfs_over_floor``;
  and the overlay mode beside a bare overlayfs (an empty lower, no casfs: the kernel's
  own bound for that mode, in the same round): ``overlay_over_bare_overlay``.
* Promotion: after the write, ``casfs publish`` (the control socket's publish:
  promote every file, then publish): promotion (hash + compress + store of what
  was written, the reply's ``promote_s``) and the whole request with publication
  (``publish_now``); the mount's stable_after is an hour, so nothing was promoted
  before.
  Also the store alone: ObjectStore.put_file over the same files in-process.
* Publication latency: 10 new files on top of the 100,000-entry namespace
  (10,000 with --quick) with GenerationStore.publish; a fresh GenerationStore
  per publication (a new process: parses the base manifest) and a reused one
  (a long-running daemon: parsed parts cached).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from bench import overlaywarm
from bench.common import PY, Result, Settings, Target, log, median, ratio, rmtree, run_proc
from bench.fixture import Fixture
from bench.mounts import config, floor_mounted, mounted
from casfs.store.entry import Entry
from casfs.store.generations import GenerationStore
from casfs.store.root import SharedRoot
from casfs.view import overlay


def writer(dest: Path, kernels: int, seed: str) -> dict[str, Any]:
    p = run_proc([PY, "-m", "bench.clients", "write", str(dest), str(kernels), seed])
    if p.rc != 0:
        raise RuntimeError(f"writer failed on {dest}")
    out: dict[str, Any] = json.loads(p.stdout)
    return out


def client_writes(s: Settings, kernels: int) -> Result:
    work = s.workdir / "write"
    root = work / "root"
    SharedRoot.open(root, create=True)
    runs: dict[str, list[Any]] = {"plain": [], "casfs": [], "publish_s": [], "promote_s": [],
                                  "store_s": [], "overlay": [], "bare_overlay": [],
                                  "floor": []}
    use_overlay = overlay.unavailable_reason() is None
    for i in range(s.reps(3, 1)):
        log(f"write: {kernels} kernel dirs, round {i + 1}")
        seed = f"w{i}"
        if i % 2 == 0:  # alternate which side writes first: load drifts within a round
            runs["plain"].append(writer(work / f"plain{i}", kernels, seed))
        with mounted(config(root, work / f"node{i}", work / "mnt", f"bench-write-{i}")) as m:
            runs["casfs"].append(writer(m.path, kernels, seed + "m"))
            t0 = time.perf_counter()
            reply = m.ask("publish")
            runs["publish_s"].append(round(time.perf_counter() - t0, 3))
            if not reply.get("ok"):
                raise RuntimeError(f"casfs publish failed: {reply}")
            runs["promote_s"].append(reply["promote_s"])
        # The pyfuse3 write floor (bench.floorwfs): what any pyfuse3 filesystem pays.
        (work / f"floorsrc{i}").mkdir()
        with floor_mounted(work / f"floorsrc{i}", work / "floormnt", writable=True) as fm:
            runs["floor"].append(writer(fm.path, kernels, seed + "f"))
        rmtree(work / f"floorsrc{i}")
        if use_overlay:
            with mounted(config(root, work / f"onode{i}", work / "mnt", f"bench-owrite-{i}",
                                mode="overlay")) as m:
                runs["overlay"].append(writer(m.path, kernels, seed + "o"))
            rmtree(work / f"onode{i}")
            # Its floor: a bare overlayfs over an empty lower, on the same disk, now.
            (work / f"empty{i}").mkdir()
            with overlaywarm.hand_overlay(str(work / f"empty{i}"), work / f"bare{i}", "") as bm:
                runs["bare_overlay"].append(writer(bm, kernels, seed + "b"))
            rmtree(work / f"empty{i}")
        if i % 2 == 1:
            runs["plain"].append(writer(work / f"plain{i}", kernels, seed))
        # The store alone, same bytes, fresh objects (a new shared root each round).
        store = SharedRoot.open(work / f"root-store{i}", create=True).objects
        files = [Path(d) / f for d, _, fs in os.walk(work / f"plain{i}") for f in fs]
        t0 = time.perf_counter()
        for f in files:
            store.put_file(f)
        runs["store_s"].append(round(time.perf_counter() - t0, 3))
        rmtree(work / f"plain{i}")
        rmtree(work / f"node{i}")
        rmtree(work / f"root-store{i}")
    rmtree(work)
    runs["casfs_over_plain_per_round"] = [ratio(c["seconds"], p["seconds"], 2)
                                          for c, p in zip(runs["casfs"], runs["plain"],
                                                          strict=True)]
    nfiles = runs["plain"][0]["files"]
    mb = runs["plain"][0]["bytes"] / 1e6
    plain_s = median([r["seconds"] for r in runs["plain"]])
    casfs_s = median([r["seconds"] for r in runs["casfs"]])
    pub_s, store_s = median(runs["publish_s"]), median(runs["store_s"])
    promote_s = median(runs["promote_s"])
    ov_s = median([r["seconds"] for r in runs["overlay"]]) if runs["overlay"] else None
    bare_s = (median([r["seconds"] for r in runs["bare_overlay"]])
              if runs["bare_overlay"] else None)
    floor_s = median([r["seconds"] for r in runs["floor"]])
    figures = {
        "files": nfiles, "mb": round(mb, 1),
        "plain_files_per_s": round(nfiles / plain_s), "casfs_files_per_s": round(nfiles / casfs_s),
        "floor_files_per_s": round(nfiles / floor_s),
        "publish_now_s": round(pub_s, 3),
        # Issue 11 states promotion and publication apart: the target is promotion's.
        "promotion_mb_per_s": round(mb / promote_s, 1),
        "promotion_files_per_s": round(nfiles / promote_s),
        "publish_now_mb_per_s": round(mb / pub_s, 1),
        "store_only_mb_per_s": round(mb / store_s, 1),
        "store_only_files_per_s": round(nfiles / store_s),
    }
    return Result("write", f"{kernels} kernel dirs, Triton put pattern", figures,
                  {"casfs_over_plain": ratio(casfs_s, plain_s, 2),
                   "overlay_over_plain": ratio(ov_s, plain_s, 2),
                   "bare_overlay_over_plain": ratio(bare_s, plain_s, 2),
                   "overlay_over_bare_overlay": ratio(ov_s, bare_s, 2),
                   # the pyfuse3 floor: what the FUSE mode could at best reach
                   "floor_over_plain": ratio(floor_s, plain_s, 2),
                   "casfs_over_floor": ratio(casfs_s, floor_s, 2)},
                  # Restated against the mechanism's floor (issue 23): the minimal pyfuse3
                  # passthrough writes at ~14.7x plain on tmpfs, 1.5x on ext4, so "2x plain"
                  # was below what any pyfuse3 filesystem reaches; casfs is held to 1.3x it.
                  # The overlay mode likewise against a bare overlayfs written the same
                  # round: a plain dir on a churned ext4 varies 2x between passes (inode
                  # allocation), so "1.1x plain" measured the disk's moment, not casfs.
                  [Target("casfs_over_floor", 1.3), Target("overlay_over_bare_overlay", 1.1),
                   Target("promotion_mb_per_s", 200, "ge")],
                  raw=runs)


def publication(fx: Fixture, s: Settings) -> Result:
    root = fx.root()
    ns = "bench-pub"
    base = root.generations().entries(fx.namespace).entries
    root.generations().publish(ns, base.values(), node="bench")
    proto = next(iter(base.values()))
    fresh: list[float] = []
    reused: list[float] = []
    kept = GenerationStore(root)
    kept.latest(ns)
    kept.snapshot(kept.latest(ns))  # a daemon has the parts parsed already
    for i in range(s.reps(5, 3)):
        for label, gens in (("fresh", GenerationStore(SharedRoot.open(fx.root_path))),
                            ("reused", kept)):
            batch = [Entry(f"delta-{label}-{i}/f{j}", proto.digest, proto.size, 0o644,
                           proto.mtime_ns) for j in range(10)]
            t0 = time.perf_counter()
            res = gens.publish(ns, batch, node="bench")
            dt = time.perf_counter() - t0
            assert res.added == 10, res
            (fresh if label == "fresh" else reused).append(round(dt, 4))
    rec = root.generations().latest(ns)
    assert rec is not None
    return Result("write", f"publish 10 files on {len(base):,} entries",
                  {"fresh_process_s": round(median(fresh), 4),
                   "daemon_s": round(median(reused), 4),
                   "deltas_in_record": len(rec.deltas)},
                  {}, [Target("fresh_process_s", 0.2), Target("daemon_s", 0.2)],
                  raw={"fresh_s": fresh, "daemon_s": reused})


def run(fx: Fixture, s: Settings) -> list[Result]:
    return [client_writes(s, 300 if s.quick else 600), publication(fx, s)]
