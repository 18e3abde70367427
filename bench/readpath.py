"""3. Read path: open and read every file of a Triton-like tree, through casfs and natively.

The tree (600 kernel dirs of 7 files; also 6,000 in the full run) is imported
into a shared root. casfs: a mount on a fresh node, then one process reads every
file (first touch: lookup, fetch from the shared root, verify, decompress into
the local object cache) and a second process reads them again (warm: the
kernel's entry/attr and page caches plus the local object cache). Plain: the
same reader over the source directory with its pages cached, and (where the
page cache may be dropped) a cold read after ``drop_caches``. The casfs first
touch also starts after ``drop_caches`` when permitted, so both cold reads
begin with the same empty page cache.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import tree
from bench.common import PY, Result, Settings, Target, drop_caches, log, median, ratio, rmtree
from bench.common import run_proc as _run
from bench.mounts import config, mounted
from casfs.promote.importer import import_tree
from casfs.scratch import ScratchRules
from casfs.store.root import SharedRoot


def reader(path: Path) -> dict[str, Any]:
    p = _run([PY, "-m", "bench.clients", "read", str(path)])
    if p.rc != 0:
        raise RuntimeError(f"reader failed on {path}")
    out: dict[str, Any] = json.loads(p.stdout)
    out["cpu_s"] = p.cpu
    return out


def bench_tree(s: Settings, kernels: int, reps: int) -> Result:
    work = s.workdir / f"read-{kernels}"
    src, root = work / "src", work / "root"
    files, nbytes = tree.build(src, kernels, seed=f"read{kernels}")
    ns = f"bench-read-{kernels}"
    import_tree(SharedRoot.open(root, create=True), src, ns, rules=ScratchRules("triton"),
                node="bench")
    can_drop = drop_caches()
    runs: dict[str, list[dict[str, Any]]] = {"first": [], "warm": [], "plain_warm": [],
                                             "plain_cold": []}
    for i in range(reps):
        log(f"readpath: {files} files, round {i + 1}")
        runs["plain_warm"].append(reader(src))
        if can_drop:
            drop_caches()
            runs["plain_cold"].append(reader(src))
        state = work / f"node{i}"
        with mounted(config(root, state, work / "mnt", ns)) as m:
            if can_drop:
                drop_caches()
            runs["first"].append(reader(m.path))
            runs["warm"].append(reader(m.path))
            st = m.ask("stats")["counters"]
        rmtree(state)
    rmtree(work)
    fps = {k: median([r["files_per_s"] for r in v]) if v else None for k, v in runs.items()}
    sec = {k: median([r["seconds"] for r in v]) if v else None for k, v in runs.items()}
    figures: dict[str, Any] = {"files": files, "mb": round(nbytes / 1e6, 1)}
    figures.update({f"{k}_files_per_s": round(v) for k, v in fps.items() if v})
    ratios = {
        "warm_over_plain_warm": ratio(sec["warm"], sec["plain_warm"], 2),
        "first_over_plain_cold": ratio(sec["first"], sec["plain_cold"], 2),
        "first_over_plain_warm": ratio(sec["first"], sec["plain_warm"], 2),
    }
    notes = [] if can_drop else ["drop_caches not permitted: no cold plain read"]
    return Result("readpath", f"{kernels} kernel dirs", figures, ratios,
                  [Target("warm_over_plain_warm", 2.0), Target("first_over_plain_cold", 3.0)],
                  raw={**runs, "last_counters": st}, notes=notes)


def run(s: Settings) -> list[Result]:
    if s.quick:
        return [bench_tree(s, 600, 1)]
    return [bench_tree(s, 600, 3), bench_tree(s, 6000, 1)]  # 42,000 files: one round
