"""The README's main job: the same torch.compile workload twice through ``casfs run``.

Run 1 compiles into a casfs mount and publishes to the shared root. Run 2
plays a brand-new node: a fresh node state dir (empty index, empty object
cache, empty upper), the same shared root. Everything it finds comes from the
generation run 1 published, fetched lazily and verified on first open.
Uses the zero-config default shared root unless CASFS_ROOT is set.

    python -m casfs.demo.run_twice [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from casfs.util.defaults import default_root, default_state_dir


def run_once(state_dir: str) -> dict[str, Any]:
    env = dict(os.environ, CASFS_STATE_DIR=state_dir)
    cmd = [sys.executable, "-m", "casfs.cli.main", "run", "--family", "triton,inductor",
           "--stable-after", "0.5", "--",
           sys.executable, "-m", "casfs.demo.inductor_workload", "--json"]
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"demo: casfs run failed with exit status {out.returncode}")
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1]
    return dict(json.loads(line))


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m casfs.demo.run_twice")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    print(f"demo: shared root {default_root()}", file=sys.stderr)
    print("demo: run 1 (this node)...", file=sys.stderr)
    first = run_once(str(default_state_dir()))
    with tempfile.TemporaryDirectory(prefix="casfs-demo-node2-") as fresh:
        print(f"demo: run 2 (a fresh node: state dir {fresh})...", file=sys.stderr)
        second = run_once(fresh)
    c1, c2 = first["counters"], second["counters"]
    result = {
        "run1_seconds": first["total_seconds"], "run2_seconds": second["total_seconds"],
        "speedup": round(first["total_seconds"] / max(second["total_seconds"], 1e-9), 2),
        "run1": c1, "run2": c2, "same_output": first["checksum"] == second["checksum"],
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"run 1: {first['total_seconds']:.1f} s, FX graph cache {c1['fxgraph_cache_hit']}"
              f" hits / {c1['fxgraph_cache_miss']} misses")
        print(f"run 2 (fresh node): {second['total_seconds']:.1f} s, FX graph cache"
              f" {c2['fxgraph_cache_hit']} hits / {c2['fxgraph_cache_miss']} misses;"
              f" AOTAutograd {c2['autograd_cache_hit']} hits / {c2['autograd_cache_miss']} misses")
        print(f"same outputs: {result['same_output']}; speed-up x{result['speedup']}")
    warm = c2["fxgraph_cache_miss"] == 0 and c2["fxgraph_cache_hit"] > 0
    return 0 if warm and result["same_output"] else 1


if __name__ == "__main__":
    sys.exit(main())
