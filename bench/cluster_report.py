"""``casfs report`` on a large POSIX root (issue 24): <= 5 s at 100k entries and a year
of daily records.

Usage: ``python -m bench.cluster_report [--entries 100000] [--namespaces 4]
[--nodes 4] [--days 365] [--merged] [--dir DIR] [--runs 3] [--s3-rtt-ms 20]``

(``bench/report.py`` is the bench runner's own table writer, hence this name.)

Builds a root with ``--entries`` distinct small files (loose objects, 4-40 KB
pseudo-random content, 8 files per entry as a Triton kernel has, one `cs`
figure per entry) spread over ``--namespaces`` namespaces, each published as
one generation and a few later ones (growth), and one outcome record per
namespace, node and day over ``--days`` days, as mounts write them
(``--merged``: as gc leaves them, one record per month). Then times ``casfs
report --json --since 7d`` and ``--since 365d`` as a CLI process (interpreter
start included), each best and median of ``--runs``, and prints one JSON
document.

``--s3-rtt-ms MS``: the root on a real S3 server instead (SeaweedFS, tests/seaweed.py)
behind tests/netem.py's NetProxy; the root is built at no delay, then the report
runs with ``MS`` ms of round-trip time. The small files go into packs, as
promotion writes them (a loose object would cost a HEAD each in the store
section), so it is the root a mount-published S3 root is. The JSON then also
counts the requests the report made, by kind.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from casfs.store import outcomes
from casfs.store.entry import Entry
from casfs.store.packs import PackWriter
from casfs.store.root import SharedRoot

REPO = Path(__file__).resolve().parent.parent

DAY = 86400.0


def build(path: Path | str, entries: int, namespaces: int, nodes: int, days: int,
          merged: bool, packed: bool = False) -> dict[str, Any]:
    t0 = time.monotonic()
    root = SharedRoot.open(path, create=True)
    packer = PackWriter(root.objects) if packed else None
    gens = root.generations()
    rnd = random.Random(7)
    now = time.time()
    per_ns = entries // namespaces
    for n in range(namespaces):
        ns = f"triton-{n:04x}bench"
        rows = []
        for i in range(per_ns):
            key = f"K{n:02d}{i:07d}"
            data = rnd.randbytes(rnd.randrange(64, 640)) * 8  # compressible like IR
            extras = {"cs": round(rnd.uniform(0.5, 40), 3)} if i % 8 == 7 else None
            if packer is not None:
                digest = packer.add(data)
                rows.append(Entry(f"{key[:-3]}/{key}", digest, len(data), 0o644, 1, extras))
                continue
            put = root.objects.put_bytes(data)
            rows.append(Entry(f"{key[:-3]}/{key}", put.digest, put.size, 0o644, 1, extras))
        if packer is not None:  # each row names its pack member, as promotion's do
            locs = packer.flush()
            rows = [Entry(e.path, e.digest, e.size, e.mode, e.mtime_ns,
                          {**(e.extras or {}), "pack": list(locs[e.digest])}) for e in rows]
        # A base and 3 deltas (growth over the window).
        q = len(rows) // 4
        for part in range(4):
            gens.publish(ns, rows[part * q:(part + 1) * q if part < 3 else None], node="bench")
        for node in range(nodes):
            for d in range(days):
                t = now - d * DAY
                outcomes.record(root.backend, ns, family="triton", node=f"node-{node:02d}",
                                now=t, hits=rnd.randrange(0, 500), misses=rnd.randrange(0, 50),
                                saved_ms=rnd.randrange(0, 10**7),
                                missed=[(f"K{n:02d}{rnd.randrange(per_ns):07d}"[:-3], 3)])
    records = sum(len(list(root.backend.list(f"namespaces/{ns}/outcomes")))
                  for ns in gens.namespaces())
    if merged:
        for ns in gens.namespaces():
            outcomes.compact(root.backend, ns, now=now, keep_days=days + 1)
    after = sum(len(list(root.backend.list(f"namespaces/{ns}/outcomes")))
                for ns in gens.namespaces())
    return {"entries": per_ns * namespaces, "namespaces": namespaces, "nodes": nodes,
            "days": days, "outcome_records_written": records, "outcome_records": after,
            "build_s": round(time.monotonic() - t0, 1)}


def time_report(root: Path | str, since: str, runs: int, env: dict[str, str] | None = None,
                net: Any = None) -> dict[str, Any]:
    times = []
    doc: dict[str, Any] = {}
    requests: dict[str, int] = {}
    for _ in range(runs):
        if net is not None:
            net.reset_counts()
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(root),
                            "report", "--json", "--since", since],
                           capture_output=True, text=True, check=False, timeout=600, env=env)
        if r.returncode != 0:
            raise SystemExit(f"casfs report failed ({r.returncode}): {r.stderr[-2000:]}")
        times.append(time.monotonic() - t0)
        doc = json.loads(r.stdout)
        if net is not None:
            requests = net.counts()
    out = {"since": since, "best_s": round(min(times), 3),
           "median_s": round(statistics.median(times), 3), "runs": [round(t, 3) for t in times],
           "files_counted": doc["store"]["files"], "days_shown": len(doc["days"]),
           "saved_s": doc["totals"]["saved_s"]}
    if net is not None:
        out["requests"] = requests
    return out


def s3_main(a: argparse.Namespace, base: Path) -> dict[str, Any]:
    """The same root on SeaweedFS behind a proxy with ``a.s3_rtt_ms`` of round trip."""
    sys.path.insert(0, str(REPO / "tests"))
    from netem import NetProxy
    from seaweed import SeaweedServer

    srv = SeaweedServer(base / "weed")
    srv.start()
    net = None
    done = base / "built.json"  # a root built in this --dir before: timed again as is
    try:
        if not done.exists():
            srv.create_bucket("casfs")
        net = NetProxy(srv.port, delay=0.0).start()
        env = dict(os.environ, **{**srv.env(), "AWS_ENDPOINT_URL": net.endpoint},
                   AWS_CONFIG_FILE=str(base / "no-aws-config"),
                   AWS_SHARED_CREDENTIALS_FILE=str(base / "no-aws-credentials"),
                   CASFS_STATE_DIR=str(base / "state"), PYTHONPATH=str(REPO))
        url = f"s3://casfs/root?endpoint={net.endpoint}"
        os.environ.update({k: env[k] for k in srv.env()} | {"AWS_ENDPOINT_URL": net.endpoint})
        if done.exists():
            built = {"reused": str(base), **json.loads(done.read_text())}
        else:
            built = build(url, a.entries, a.namespaces, a.nodes, a.days, a.merged, packed=True)
            done.write_text(json.dumps(built))
        net.delay = a.s3_rtt_ms / 2000
        return {"bench": "cluster_report", "root": "s3 (SeaweedFS, NetProxy)",
                "rtt_ms": a.s3_rtt_ms, "built": built, "load": os.getloadavg()[0],
                "report": [time_report(url, s, a.runs, env, net) for s in ("7d", "365d")]}
    finally:
        if net is not None:
            net.stop()
        srv.kill()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster_report")
    p.add_argument("--entries", type=int, default=100_000)
    p.add_argument("--namespaces", type=int, default=4)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--days", type=int, default=365)
    p.add_argument("--merged", action="store_true", help="outcome records as gc leaves them")
    p.add_argument("--dir", help="where to build the root (default: a temp dir)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--s3-rtt-ms", type=float, metavar="MS",
                   help="the root on SeaweedFS behind a proxy with MS ms round trip")
    p.add_argument("--out", help="also write the JSON document to this file")
    a = p.parse_args(argv)
    base = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="casfs-report-bench-"))
    if a.s3_rtt_ms is not None:
        out = s3_main(a, base)
    else:
        root = base / "root"
        built = (build(root, a.entries, a.namespaces, a.nodes, a.days, a.merged)
                 if not (root / "casfs.json").exists() else {"reused": str(root)})
        out = {"bench": "cluster_report", "root": str(root), "built": built,
               "load": os.getloadavg()[0],
               "report": [time_report(root, s, a.runs) for s in ("7d", "365d")]}
    out["target_s"] = 5.0
    out["met"] = all(r["best_s"] <= 5.0 for r in out["report"])
    print(json.dumps(out, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
