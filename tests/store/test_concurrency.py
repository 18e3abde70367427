"""Several processes publishing to one namespace, and processes killed mid-put/mid-publish."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from casfs.store import maintenance
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot

PROCS = 5
BATCHES = 12
SHARED = 4  # paths every process publishes, each with its own bytes


def _publisher(root_path: str, proc: int, out: Any) -> None:
    root = SharedRoot.open(root_path)
    gens = root.generations()
    results = []
    for b in range(BATCHES):
        files = {f"p{proc}/b{b}/f{i}": f"proc {proc} batch {b} file {i}".encode()
                 for i in range(3)}
        if b < SHARED:
            files[f"shared/k{b}"] = f"shared {b} from proc {proc}".encode()
        entries = []
        for path, data in files.items():
            res = root.objects.put_bytes(data)
            entries.append(Entry(path, res.digest, res.size, 0o644, 0))
        pub = gens.publish("race", entries, node=f"node{proc}", max_attempts=200)
        results.append({"seq": pub.seq, "added": pub.added, "conflicts": pub.conflicts,
                        "conflict_paths": pub.conflict_paths, "paths": sorted(files),
                        "attempts": pub.attempts})
    out.put((proc, results))


@pytest.mark.slow
def test_concurrent_publishers_lose_nothing(root: SharedRoot) -> None:
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_publisher, args=(str(root.path), i, q)) for i in range(PROCS)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    gens = root.generations()
    seqs = gens.seqs("race")
    total_added = sum(r["added"] for rs in results.values() for r in rs)
    # Strictly increasing, no gaps: 1..N, one generation per publication that added something.
    assert seqs == list(range(1, len(seqs) + 1))
    assert len(seqs) == PROCS * BATCHES
    recs = [gens.record("race", s) for s in seqs]
    for prev, rec in itertools.pairwise(recs):
        assert rec.parent == prev.seq
        assert rec.entries > prev.entries
    # Every published path is in the final snapshot.
    snap = gens.entries("race")
    published = {p for rs in results.values() for r in rs for p in r["paths"]}
    assert set(snap.entries) == published
    assert len(snap.entries) == total_added
    # First writer wins: each shared path was added once, every other publisher conflicted.
    conflicts = sum(r["conflicts"] for rs in results.values() for r in rs)
    assert conflicts == SHARED * (PROCS - 1)
    for k in range(SHARED):
        winners = [proc for proc, rs in results.items()
                   if f"shared/k{k}" in rs[k]["paths"] and f"shared/k{k}" not in
                   rs[k]["conflict_paths"]]
        assert len(winners) == 1
        data = root.objects.get_bytes(snap.entries[f"shared/k{k}"].digest)
        assert data == f"shared {k} from proc {winners[0]}".encode()
    # Each publication's seq is one a process really created.
    created = sorted(r["seq"] for rs in results.values() for r in rs)
    assert created == seqs
    report = maintenance.verify(root)
    assert report.problems == []


# --- SIGKILL in the middle of put and publish ---------------------------------------
_PUTTER = r"""
import os, random, sys
from pathlib import Path
from casfs.store.root import SharedRoot
root = SharedRoot.open(Path(sys.argv[1]))
src = Path(sys.argv[2])
rng = random.Random(os.getpid())
print("started", flush=True)
i = 0
while True:
    i += 1
    root.objects.put_bytes(rng.randbytes(3 << 20) + b"compressible " * 200_000)
    with open(src, "r+b") as f:  # a new > 16 MiB file each round: the streaming path
        f.write(i.to_bytes(8, "little"))
    root.objects.put_file(src)
"""

_PUBLISHER = r"""
import sys
from pathlib import Path
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot
root = SharedRoot.open(Path(sys.argv[1]))
gens = root.generations()
b = 0
while True:
    b += 1
    entries = []
    for i in range(40):
        res = root.objects.put_bytes(f"batch {b} file {i} ".encode() * 50)
        entries.append(Entry(f"b{b}/f{i}", res.digest, res.size, 0o644, 0))
    pub = gens.publish("killed", entries, node="victim")
    print("published", pub.seq, flush=True)
"""


def _run_and_kill(args: list[str], wait_for: str, *, extra_lines: int = 0,
                  delay: float = 0.3) -> int:
    proc = subprocess.Popen([sys.executable, "-c", *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        seen = 0
        for line in proc.stdout:
            if line.startswith(wait_for):
                seen += 1
                if seen > extra_lines:
                    break
        time.sleep(delay)  # land somewhere inside the next put/publish
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return seen


def _stale_tmp(root_path: Path) -> list[str]:
    return sorted(os.listdir(root_path / "tmp"))


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.05, 0.4])
def test_sigkill_during_put_leaves_a_valid_store(
    casfs_env: dict[str, Path], cli: Callable[..., Any], tmp_path: Path, delay: float
) -> None:
    root = SharedRoot.open(casfs_env["root"], create=True)
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        f.write(os.urandom(1 << 20) * 17)  # 17 MiB, compressible (repeated 1 MiB)
    _run_and_kill([_PUTTER, str(root.path), str(src)], "started", delay=delay)
    # Plant one more stale staging file, as a crash at any other moment would leave.
    (root.path / "tmp" / ".tmp-obj-99999-deadbeef").write_bytes(b"partial")
    res = cli("verify", "--json", check=True)
    assert res.json()["ok"] is True and res.json()["problems"] == []
    leftovers = _stale_tmp(root.path)
    assert leftovers
    kept = cli("gc", "--grace", "3600", "--json", check=True).json()
    assert kept["removed_tmp"] == 0 and _stale_tmp(root.path) == leftovers
    removed = cli("gc", "--grace", "0", "--json", check=True).json()
    assert removed["removed_tmp"] == len(leftovers)
    assert _stale_tmp(root.path) == []
    assert cli("verify", "--json").json()["ok"] is True


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.03])
def test_sigkill_during_publish_leaves_a_valid_store(
    casfs_env: dict[str, Path], cli: Callable[..., Any], delay: float
) -> None:
    root = SharedRoot.open(casfs_env["root"], create=True)
    _run_and_kill([_PUBLISHER, str(root.path)], "published", extra_lines=1, delay=delay)
    res = cli("verify", "--json", check=True)
    doc = res.json()
    assert doc["ok"] is True and doc["generations"] >= 2
    gens = root.generations()
    seqs = gens.seqs("killed")
    assert seqs == list(range(1, len(seqs) + 1))
    snap = gens.entries("killed")
    assert len(snap.entries) == 40 * len(seqs)
    # The store keeps working: the next publisher continues the sequence.
    e = root.objects.put_bytes(b"after the crash")
    pub = gens.publish("killed", [Entry("after", e.digest, e.size, 0o644, 0)], node="n")
    assert pub.seq == seqs[-1] + 1
    # gc with no grace removes what the dead publisher left unreferenced; still valid.
    cli("gc", "--grace", "0", "--keep", "100", check=True)
    assert cli("verify", "--json").json()["ok"] is True
    assert json.loads(cli("ls", "killed", "after", "--json", check=True).out)[0]["path"] == "after"
