"""1. Real client: the torch.compile CPU workload (casfs.demo.inductor_workload).

Three ways to give a job its TORCHINDUCTOR_CACHE_DIR, run side by side:

* local: a plain local directory (cold = empty, warm = a second run on it);
* casfs: a mount on a fresh node (new state dir: empty index and object cache)
  restored from the shared root; cold publishes what it compiled (full run), or
  the local cold cache is imported with casfs's importer (--quick);
* copy-restore: ``cp -a`` of the warm cache into a new directory, then a native run.

Warm runs are interleaved (local, casfs, copy, local, ...) so a change in machine
load hits all three alike; medians are reported. Per run: the workload's own
compile time, its whole-process wall time, and its CPU time (user+sys of the
process and its children: g++ included), which is what load noise moves least.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from bench.common import (
    PY,
    Result,
    Settings,
    Target,
    log,
    median,
    ratio,
    rmtree,
    run_proc,
    timed,
)
from bench.mounts import config, mounted
from casfs.families import rules as family_rules
from casfs.promote.importer import import_tree
from casfs.store.root import SharedRoot

NS = "bench-inductor"


def workload(cache_dir: Path) -> dict[str, Any]:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir))
    env.pop("TRITON_CACHE_DIR", None)
    p = run_proc([PY, "-m", "casfs.demo.inductor_workload", "--json"], env=env)
    if p.rc != 0:
        raise RuntimeError(f"inductor workload failed in {cache_dir} (exit {p.rc})")
    out = json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])
    c = out["counters"]
    return {"compile_s": out["compile_seconds"], "import_s": out["import_seconds"],
            "process_s": p.wall, "cpu_s": p.cpu, "checksum": out["checksum"],
            "fx_hits": c["fxgraph_cache_hit"], "fx_misses": c["fxgraph_cache_miss"],
            "aot_hits": c["autograd_cache_hit"], "aot_misses": c["autograd_cache_miss"]}


def casfs_run(root: Path, state: Path, mnt: Path) -> dict[str, Any]:
    cfg = config(root, state, mnt, NS, family="inductor", stable_after=2.0,
                 publish_interval=10.0)
    with mounted(cfg) as m:
        cpu0 = m.cpu()
        r = workload(m.path)
        r["daemon_cpu_s"] = round(m.cpu() - cpu0, 3)
        r["mount_ready_s"] = round(m.ready_seconds, 3)
        st = m.ask("stats")
        t0 = time.perf_counter()
    r["unmount_s"] = round(time.perf_counter() - t0, 3)  # final promotion + publication
    r["counters"] = {k: v for k, v in st.get("counters", {}).items() if v}
    return r


def _summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("compile_s", "process_s", "cpu_s", "daemon_cpu_s", "mount_ready_s", "unmount_s")
    return {k: round(median([r[k] for r in runs]), 3) for k in keys if runs and k in runs[0]}


def run(s: Settings) -> list[Result]:
    work = s.workdir / "realclient"
    local, root, mnt = work / "local", work / "root", work / "mnt"
    local.mkdir(parents=True)
    SharedRoot.open(root, create=True)
    log("realclient: local cold")
    local_cold = workload(local)
    casfs_cold: dict[str, Any] | None = None
    if s.quick:
        log("realclient: importing the local cold cache (--quick)")
        import_tree(SharedRoot.open(root), local, NS, rules=family_rules("inductor"),
                    node="bench")
    else:
        log("realclient: casfs cold (node A)")
        casfs_cold = casfs_run(root, work / "node-a", mnt)
    runs: dict[str, list[dict[str, Any]]] = {"local": [], "casfs": [], "copy": []}
    for i in range(s.reps(3, 1)):
        log(f"realclient: warm round {i + 1}: local, casfs (fresh node), copy-restore")
        runs["local"].append(workload(local))
        runs["casfs"].append(casfs_run(root, work / f"node-b{i}", mnt))
        rmtree(work / f"node-b{i}")
        dst = work / f"copy{i}"
        copy_s = timed(lambda: os.system(f"cp -a '{local}' '{dst}'"))  # noqa: B023
        r = workload(dst)
        r["copy_s"] = round(copy_s, 3)
        runs["copy"].append(r)
        rmtree(dst)
    rmtree(work)
    warm = {k: _summary(v) for k, v in runs.items()}
    warm["copy"]["copy_s"] = round(median([r["copy_s"] for r in runs["copy"]]), 3)
    allhit = all(r["fx_misses"] == 0 and r["fx_hits"] > 0 for v in runs.values() for r in v)
    same = len({r["checksum"] for v in runs.values() for r in v} | {local_cold["checksum"]}) == 1
    lw, cw = warm["local"], warm["casfs"]
    figures: dict[str, Any] = {
        "local_cold_compile_s": local_cold["compile_s"],
        "local_cold_process_s": local_cold["process_s"],
        "local_warm_compile_s": lw["compile_s"], "local_warm_process_s": lw["process_s"],
        "casfs_warm_compile_s": cw["compile_s"], "casfs_warm_process_s": cw["process_s"],
        "casfs_mount_ready_s": cw["mount_ready_s"], "casfs_unmount_s": cw["unmount_s"],
        "copy_warm_process_s": warm["copy"]["process_s"], "copy_s": warm["copy"]["copy_s"],
        "all_warm_runs_hit": allhit, "same_output": same,
    }
    if casfs_cold is not None:
        figures["casfs_cold_compile_s"] = casfs_cold["compile_s"]
        figures["casfs_cold_process_s"] = casfs_cold["process_s"]
    ratios = {
        "casfs_warm_over_local_warm_process": ratio(cw["process_s"], lw["process_s"]),
        "casfs_warm_over_local_warm_compile": ratio(cw["compile_s"], lw["compile_s"]),
        "casfs_warm_over_local_warm_cpu": ratio(cw["cpu_s"], lw["cpu_s"]),
        "copy_warm_over_local_warm_process": ratio(warm["copy"]["process_s"], lw["process_s"]),
        "casfs_warm_with_mount_over_local_warm": ratio(
            cw["process_s"] + cw["mount_ready_s"] + cw["unmount_s"], lw["process_s"]),
    }
    if casfs_cold is not None:
        ratios["casfs_cold_over_local_cold_process"] = ratio(casfs_cold["process_s"],
                                                             local_cold["process_s"])
        ratios["casfs_cold_over_local_cold_cpu"] = ratio(casfs_cold["cpu_s"],
                                                         local_cold["cpu_s"])
    notes = [] if allhit and same else ["NOT ALL WARM RUNS HIT OR OUTPUTS DIFFER"]
    return [Result("realclient", "torch.compile CPU, 3 graphs", figures, ratios,
                   [Target("casfs_warm_over_local_warm_process", 1.10)],
                   raw={"local_cold": local_cold, "casfs_cold": casfs_cold, "warm_runs": runs,
                        "warm_medians": warm}, notes=notes)]
