"""``bench/run [--quick] [--json FILE] [--only NAME,...] [--keep]``: every benchmark, one run.

Prints a markdown table (one row per benchmark case: raw figures, ratios, the
target and whether it was met) and writes a JSON list (one object per case, with
the raw timings and the environment). See docs/performance.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from bench import dedup, env, fixture, footprint, network, readpath, ready, realclient, writepath
from bench.common import Result, Settings, log, rmtree
from bench.report import table, write_json

BENCHES: dict[str, Callable[..., list[Result]]] = {
    "realclient": realclient.run,  # 1
    "ready": ready.run,  # 2
    "readpath": readpath.run,  # 3
    "write": writepath.run,  # 4
    "dedup": dedup.run,  # 5
    "footprint": footprint.run,  # 6
    "network": network.run,  # 7: opt-in (--only network): SeaweedFS behind a 20 ms RTT, ~10 min
}
OPT_IN = {"network"}  # slow: not in the default set, so `bench/run --quick` keeps its budget
NEEDS_FIXTURE = {"ready", "write", "footprint"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/run", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats (<5 min)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--only", help=f"comma list of: {', '.join(BENCHES)}"
                    f" ({', '.join(sorted(OPT_IN))}: only when named)")
    ap.add_argument("--workdir", type=Path, help="parent of the temp dir (default: $TMPDIR)")
    args = ap.parse_args(argv)
    names = ([n.strip() for n in args.only.split(",")] if args.only
             else [n for n in BENCHES if n not in OPT_IN])
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        ap.error(f"unknown benchmark(s): {', '.join(unknown)}")
    environment = env.describe()
    t_start = time.perf_counter()
    results: list[Result] = []
    failed: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="casfs-bench-", dir=args.workdir))
    s = Settings(quick=args.quick, workdir=work, repeats=1 if args.quick else 3)
    try:
        fx = None
        if NEEDS_FIXTURE & set(names):
            fx = fixture.build(work / "fixture", 10_000 if args.quick else 100_000)
        for name in names:
            log(f"--- {name}")
            t0 = time.perf_counter()
            try:
                fn = BENCHES[name]
                out = fn(fx, s) if name in NEEDS_FIXTURE else fn(s)
            except Exception:
                traceback.print_exc()
                failed.append(name)
                continue
            for r in out:
                r.raw["bench_seconds"] = round(time.perf_counter() - t0, 1)
            results.extend(out)
    finally:
        rmtree(work)
    environment["loadavg_end"] = env.loadavg()
    environment["run_seconds"] = round(time.perf_counter() - t_start, 1)
    if fx is not None:
        environment["fixture"] = {"files": fx.files, "bytes": fx.nbytes,
                                  "import_seconds": fx.import_seconds}
    print(table(results))
    print(f"\n{len(results)} cases in {environment['run_seconds']} s on"
          f" {environment['cpu_count']} CPUs (load {environment['loadavg_start']} ->"
          f" {environment['loadavg_end']}), casfs {environment['casfs_rev']}")
    if args.json:
        write_json(args.json, environment, results)
    if failed:
        print(f"bench: FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
