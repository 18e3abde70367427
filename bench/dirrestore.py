"""dir mode's copy into the directory, in-process: microseconds a file.

    python -m bench.dirrestore [--files 4800] [--rounds 3] [--journaled-scratch] [--work DIR]

Installs ``--files`` random objects (2-30 KB, 8 to a directory as Triton
writes) into a local object cache, then per round restores them all into an
empty directory with ``casfs.view.dirmode.restore``, as root and as a tenant
(uid/gid 65534: the tenant's credentials switched as casfsd does), checking
every file's bytes. Prints one JSON line: wall and CPU microseconds a file,
by round and median. ``--journaled-scratch``: on a fresh journaled ext4 (a
node's disk; this VM's root ext4 has no journal and its file creation swings
several-fold with its recent deletions).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import blake3

from bench.common import bench_dir, median, scratch_fs
from casfs.index.objcache import install_file, object_path
from casfs.store.entry import Entry
from casfs.util.counters import Counters
from casfs.view import dirmode

TENANT = 65534


class _Fetcher:
    def __init__(self, cache: Path) -> None:
        self.cache = str(cache)

    def fetch(self, e: Entry) -> str:
        return object_path(self.cache, e.digest)

    def unpin(self, digest: str) -> None:
        pass


def _objects(cache: Path, files: int) -> list[Entry]:
    rnd = random.Random(1)
    cache.mkdir()
    out = []
    for i in range(files):
        data = rnd.randbytes(rnd.randint(2000, 30000))
        digest = blake3.blake3(data).hexdigest()
        install_file(str(cache), digest, data)
        out.append(Entry(f"k{i // 8:05d}/f{i % 8}.bin", digest, len(data), 0o644,
                         1_700_000_000_000_000_000 + i))
    return out


def _round(work: Path, entries: list[Entry], fetcher: _Fetcher, owner: int | None,
           n: int) -> tuple[float, float]:
    dest = work / f"dest-{owner}-{n}"
    dest.mkdir()
    if owner is not None:
        os.chown(dest, owner, owner)
    c0, t0 = time.process_time(), time.perf_counter()
    written = dirmode.restore(dest, entries, fetcher, Counters(), dirmode.RestoreStamps(None),
                              owner=(owner, owner) if owner is not None else None)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if len(written) != len(entries):
        raise SystemExit(f"restored {len(written)} of {len(entries)} files")
    for e in entries:
        if blake3.blake3((dest / e.path).read_bytes()).hexdigest() != e.digest:
            raise SystemExit(f"{e.path}: wrong bytes")
    return wall / len(entries) * 1e6, cpu / len(entries) * 1e6


def run(work: Path, files: int, rounds: int) -> dict[str, Any]:
    entries = _objects(work / "cache", files)
    fetcher = _Fetcher(work / "cache")
    out: dict[str, Any] = {"files": files, "rounds": rounds, "workdir_fs": scratch_fs(work)}
    by: dict[str, dict[str, list[float]]] = {"root": {"wall": [], "cpu": []},
                                             "tenant": {"wall": [], "cpu": []}}
    for n in range(rounds):  # the two alternated, each round
        for who, owner in (("root", None), ("tenant", TENANT)):
            wall, cpu = _round(work, entries, fetcher, owner, n)
            by[who]["wall"].append(round(wall, 1))
            by[who]["cpu"].append(round(cpu, 1))
    for who, xs in by.items():
        out[who] = {"wall_us_per_file": xs["wall"], "cpu_us_per_file": xs["cpu"],
                    "wall_us_median": median(xs["wall"]), "cpu_us_median": median(xs["cpu"])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=4800)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=None, help="parent of the scratch dir")
    ap.add_argument("--journaled-scratch", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench.dirrestore: run as root (it restores as a tenant too)")
    with bench_dir(args.work, "casfs-bench-dirrestore-", args.journaled_scratch) as work:
        os.chmod(work, 0o755)  # the tenant reaches its directory
        print(json.dumps(run(work, args.files, args.rounds)))


if __name__ == "__main__":
    main()
