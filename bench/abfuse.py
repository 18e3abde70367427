"""Two versions of casfs's FUSE mount side by side, in the same minutes.

    python -m bench.abfuse write ROUNDS KERNELS OLD_TREE [NEW_TREE] [--floor-tasks MIN,MAX]
                                [--c-floor]
    python -m bench.abfuse read ROUNDS KERNELS OLD_TREE [NEW_TREE]

OLD_TREE and NEW_TREE are checkouts of casfs (``git archive REV | tar -x -C DIR``):
each mount process runs with that tree first on PYTHONPATH; with one tree only,
the one version is measured. Per round, in an order rotated from round to round:
``write`` runs the Triton put pattern (bench.clients write) into a plain directory,
through a fresh mount of each version and through the pyfuse3 write floor
(bench.floorwfs: a plain passthrough facing the kernel as casfs does), and with
``--floor-tasks`` through the write floor again with those pyfuse3.main task
limits (``floor_t``), and with ``--c-floor`` through bench/floorwc.c (``cfloor``:
the same passthrough on libfuse's C loop, built here with cc); ``read`` reads a
Triton-like tree warm from a plain directory, from each version's mount (one pass
to warm it, the second timed) and from the pyfuse3 floor (bench.floorfs).
Prints a JSON line per round and a summary: each version (and the write floor)
against plain (write) or the floor (read) by round, each version against the
write floor, and the mount process's CPU microseconds per file.
On a shared machine a single round's ratio swings; the per-round pairs do not drift
apart as much, since both versions ran within the same minute.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import tree
from bench.common import rmtree
from bench.mounts import build_c_floor, config, floor_mounted, mounted
from bench.readpath import _with_cpu, reader
from bench.writepath import writer
from casfs.families import rules as family_rules
from casfs.promote.importer import import_tree
from casfs.store.root import SharedRoot


def measure(mode: str, rounds: int, kernels: int, trees: dict[str, str],
            floor_tasks: tuple[int, int] | None = None, c_floor: bool = False
            ) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="casfs-abfuse-"))
    try:
        root = work / "root"
        SharedRoot.open(root, create=True)
        versions = [v for v in ("old", "new") if v in trees]
        floors = ["floor"]
        cprog = None
        if mode == "write":
            floors += ["floor_t"] if floor_tasks is not None else []
            cprog = build_c_floor(work / "floorwc") if c_floor else None
            if c_floor and cprog is None:
                print(json.dumps({"cfloor": "not built (cc, pkg-config or fuse3 headers)"}))
            floors += ["cfloor"] if cprog is not None else []
        secs: dict[str, list[float]] = {k: [] for k in ["plain", *versions, *floors]}
        cpu: dict[str, list[float]] = {k: [] for k in [*versions, *floors]}
        loads: list[float] = []
        src = work / "src"
        if mode == "read":
            tree.build(src, kernels, seed="ab")
            import_tree(SharedRoot.open(root), src, "ab-read", rules=family_rules("triton"),
                        node="bench")
        kinds = ["plain", *versions, *floors]
        for r in range(rounds):
            order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
            loads.append(round(os.getloadavg()[0], 2))
            for v in order:
                if v == "plain":
                    if mode == "write":
                        out = writer(work / f"plain{r}", kernels, f"s{r}")
                        rmtree(work / f"plain{r}")
                    else:
                        reader(src)
                        out = reader(src)
                elif v in ("floor", "floor_t", "cfloor") and mode == "write":
                    dest = work / f"{v}-src{r}"
                    dest.mkdir()
                    with floor_mounted(dest, work / "floor", writable=True,
                                       tasks=floor_tasks if v == "floor_t" else None,
                                       program=cprog if v == "cfloor" else None) as fm:
                        c0 = fm.cpu()
                        out = writer(fm.path, kernels, f"s{r}{v}")
                        cpu[v].append(round((fm.cpu() - c0) / out["files"] * 1e6, 1))
                    rmtree(dest)
                elif v == "floor":
                    with floor_mounted(src, work / "floor") as fm:
                        reader(fm.path)
                        out = _with_cpu(fm.cpu, lambda fm=fm: reader(fm.path))
                    cpu[v].append(out["server_cpu_us_per_file"])
                else:
                    # The mount process's casfs: ``python -m`` puts its working
                    # directory ahead of PYTHONPATH, so it starts in the tree too (from
                    # a checkout, both versions ran the checkout's code before).
                    os.environ["PYTHONPATH"] = trees[v]
                    state = work / f"node-{v}-{r}"
                    ns = f"ab-{v}-{r}" if mode == "write" else "ab-read"
                    here = os.getcwd()
                    with contextlib.ExitStack() as stack:
                        os.chdir(trees[v])
                        try:
                            m = stack.enter_context(mounted(config(root, state,
                                                                   work / "mnt", ns)))
                        finally:
                            os.chdir(here)
                        if mode == "write":
                            c0 = m.cpu()
                            out = writer(m.path, kernels, f"s{r}{v}")
                            cpu[v].append(round((m.cpu() - c0) / out["files"] * 1e6, 1))
                        else:
                            reader(m.path)
                            out = _with_cpu(m.cpu, lambda m=m: reader(m.path))
                            cpu[v].append(out["server_cpu_us_per_file"])
                    rmtree(state)
                secs[v].append(out["seconds"])
            print(json.dumps({"round": r, "load": loads[-1], "order": order,
                              **{k: v[-1] for k, v in secs.items() if v},
                              "cpu_us_per_file": {k: v[-1] for k, v in cpu.items() if v}}),
                  flush=True)
        ref = "plain" if mode == "write" else "floor"
        out_: dict[str, Any] = {"mode": mode, "kernels": kernels, "loads": loads}

        def ratios(v: str, over: str) -> None:
            per = [round(a / b, 2) for a, b in zip(secs[v], secs[over], strict=True)]
            out_[f"{v}_over_{over}_by_round"] = per
            out_[f"{v}_over_{over}_median"] = round(statistics.median(per), 2)

        for v in versions:
            ratios(v, ref)
            if mode == "write":
                ratios(v, "floor")
            out_[f"{v}_cpu_us_per_file"] = cpu[v]
        if mode == "write":
            for f in floors:
                ratios(f, "plain")
            if "floor_t" in floors:
                ratios("floor_t", "floor")
                out_["floor_tasks"] = list(floor_tasks or ())
            if "cfloor" in floors:
                ratios("cfloor", "floor")
        for f in floors:
            out_[f"{f}_cpu_us_per_file"] = cpu[f]
        if len(versions) == 2:
            ratios("new", "old")
        return out_
    finally:
        rmtree(work)


def main(argv: list[str]) -> int:
    floor_tasks = None
    if "--floor-tasks" in argv[:-1]:
        i = argv.index("--floor-tasks")
        lo, hi = argv[i + 1].split(",")
        floor_tasks = (int(lo), int(hi))
        del argv[i:i + 2]
    c_floor = "--c-floor" in argv
    argv = [a for a in argv if a != "--c-floor"]
    if len(argv) not in (4, 5) or argv[0] not in ("write", "read"):
        print(__doc__, file=sys.stderr)
        return 2
    trees = {v: str(Path(t).resolve()) for v, t in zip(("old", "new"), argv[3:], strict=False)}
    print(json.dumps(measure(argv[0], int(argv[1]), int(argv[2]), trees, floor_tasks, c_floor)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
