"""A shared root with what ``casfs report`` reads: namespaces with generations, daily
outcome records of two nodes over ten days, read records (tests/cli, tests/system)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from casfs.store import outcomes, reads
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot

DAY = 86400.0
ELSEWHERE = "a" * 64  # a Triton kernel triton-aa11's jobs missed that triton-dd44 holds
NOWHERE = "b" * 64  # one no namespace holds


def build(path: Path) -> SharedRoot:
    root = SharedRoot.open(path, create=True)
    now = time.time()
    gens = root.generations()
    for ns, n in (("triton-aa11", 6), ("inductor-bb22", 4), ("vllm-cc33", 2)):
        a = root.objects.put_bytes(ns.encode() * 100)
        b = root.objects.put_bytes(b"shared bytes" * 50)  # in every namespace: dedup
        rows = [Entry(f"K{i}/f", a.digest, a.size, 0o644, 1, {"cs": 10.5 + i})
                for i in range(n)] + [Entry("common", b.digest, b.size, 0o644, 1)]
        gens.publish(ns, rows, node="seed",
                     fingerprint={"torch": "2.13.0", "triton": "3.4.0"}
                     if ns == "triton-aa11" else None)
    # Another Triton namespace (torch differs) that holds ELSEWHERE.
    c = root.objects.put_bytes(b"kernel" * 100)
    gens.publish("triton-dd44", [Entry(f"{ELSEWHERE}/k.cubin", c.digest, c.size, 0o644, 1)],
                 node="seed", fingerprint={"torch": "2.12.1", "triton": "3.4.0"})
    for d in range(10):
        t = now - d * DAY
        for node, k in (("node-a", 1), ("node-b", 2)):
            outcomes.record(root.backend, "triton-aa11", family="triton", node=node, now=t,
                            hits=3 * k + d, misses=k, saved_ms=12_345 * k + d,
                            missed=[(f"K{d % 3}", 2 + d), (ELSEWHERE, 20), (NOWHERE, 15)])
        outcomes.record(root.backend, "inductor-bb22", family="inductor", node="node-a",
                        now=t, hits=d, misses=5, saved_ms=1_000 * d, untimed=1)
    reads.record(root.backend, "triton-aa11", "node-a", ["K0/f"], now - 3600)
    reads.record(root.backend, "triton-dd44", "node-a", [f"{ELSEWHERE}/k.cubin"], now - 3600)
    return root


def cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(root), *args],
                          capture_output=True, text=True, timeout=120, check=False)


def report_json(root: Path, *args: str) -> dict[str, Any]:
    import json

    r = cli(root, "report", "--json", *args)
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc
