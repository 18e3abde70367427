"""Two versions of casfs's FUSE mount side by side, in the same minutes.

    python -m bench.abfuse write ROUNDS KERNELS OLD_TREE NEW_TREE
    python -m bench.abfuse read ROUNDS KERNELS OLD_TREE NEW_TREE

OLD_TREE and NEW_TREE are checkouts of casfs (``git archive REV | tar -x -C DIR``):
each mount process runs with that tree first on PYTHONPATH. Per round, in an order
rotated from round to round: ``write`` runs the Triton put pattern (bench.clients
write) into a plain directory and through a fresh mount of each version; ``read``
reads a Triton-like tree warm from a plain directory, from each version's mount
(one pass to warm it, the second timed) and from the pyfuse3 floor (bench.floorfs).
Prints a JSON line per round and a summary: each version against plain (write) or
the floor (read) by round, and the mount process's CPU microseconds per file.
On a shared machine a single round's ratio swings; the per-round pairs do not drift
apart as much, since both versions ran within the same minute.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import tree
from bench.common import rmtree
from bench.mounts import config, floor_mounted, mounted
from bench.readpath import _with_cpu, reader
from bench.writepath import writer
from casfs.families import rules as family_rules
from casfs.promote.importer import import_tree
from casfs.store.root import SharedRoot


def measure(mode: str, rounds: int, kernels: int, trees: dict[str, str]) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="casfs-abfuse-"))
    try:
        root = work / "root"
        SharedRoot.open(root, create=True)
        secs: dict[str, list[float]] = {k: [] for k in ("plain", "old", "new", "floor")}
        cpu: dict[str, list[float]] = {k: [] for k in ("old", "new", "floor")}
        loads: list[float] = []
        src = work / "src"
        if mode == "read":
            tree.build(src, kernels, seed="ab")
            import_tree(SharedRoot.open(root), src, "ab-read", rules=family_rules("triton"),
                        node="bench")
        kinds = ["plain", "old", "new"] + (["floor"] if mode == "read" else [])
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
                elif v == "floor":
                    with floor_mounted(src, work / "floor") as fm:
                        reader(fm.path)
                        out = _with_cpu(fm.cpu, lambda fm=fm: reader(fm.path))
                    cpu[v].append(out["server_cpu_us_per_file"])
                else:
                    os.environ["PYTHONPATH"] = trees[v]  # the mount process's casfs
                    state = work / f"node-{v}-{r}"
                    ns = f"ab-{v}-{r}" if mode == "write" else "ab-read"
                    with mounted(config(root, state, work / "mnt", ns)) as m:
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
        for v in ("old", "new"):
            per = [round(a / b, 2) for a, b in zip(secs[v], secs[ref], strict=True)]
            out_[f"{v}_over_{ref}_by_round"] = per
            out_[f"{v}_over_{ref}_median"] = round(statistics.median(per), 2)
            out_[f"{v}_cpu_us_per_file"] = cpu[v]
        if mode == "read":
            out_["floor_cpu_us_per_file"] = cpu["floor"]
        out_["new_over_old_by_round"] = [round(a / b, 2)
                                         for a, b in zip(secs["new"], secs["old"], strict=True)]
        return out_
    finally:
        rmtree(work)


def main(argv: list[str]) -> int:
    if len(argv) != 5 or argv[0] not in ("write", "read"):
        print(__doc__, file=sys.stderr)
        return 2
    trees = {"old": str(Path(argv[3]).resolve()), "new": str(Path(argv[4]).resolve())}
    print(json.dumps(measure(argv[0], int(argv[1]), int(argv[2]), trees)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
