"""6. Footprint of a mount process serving a large generation.

A fresh node mounts the fixture's generation (100,000 entries; 10,000 with
--quick). Measured from /proc: RSS and open fds right after READY, again after
a process has listed and stat'ed every entry (the inode table and kernel
lookups populated), and the CPU the idle mount uses over a quiet interval
(its background promotion, publication and counter tasks keep running).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.common import Result, Settings, Target, log, proc_cpu, rmtree
from bench.fixture import Fixture
from bench.mounts import config, mounted


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _workers_rss_mb(pid: int, module: bytes = b"casfs.node.fetchworker") -> float:
    """RSS of the mount process's children running ``module``: its fetch worker and the
    spare (casfs.node.fetchproc), or its promotion worker (casfs.node.promoteproc)."""
    total = 0.0
    for d in Path("/proc").iterdir():
        try:
            if not d.name.isdigit() or module not in (d / "cmdline").read_bytes():
                continue
            if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                total += _rss_mb(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return round(total, 1)


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def run(fx: Fixture, s: Settings) -> list[Result]:
    state = s.workdir / "footprint-node"
    idle_s = 10.0 if s.quick else 20.0
    # Production-like intervals: a promotion check every second, publication every 10 s.
    cfg = config(fx.root_path, state, s.workdir / "mnt", fx.namespace, stable_after=2.0,
                 publish_interval=10.0)
    with mounted(cfg) as m:
        rss_ready, fds_ready = _rss_mb(m.pid), _fds(m.pid)
        log(f"footprint: walking {fx.files} entries")
        t0 = time.perf_counter()
        n = 0
        for dirpath, _, files in os.walk(m.path):
            for f in files:
                os.lstat(os.path.join(dirpath, f))
                n += 1
        walk_s = time.perf_counter() - t0
        rss_walk, fds_walk = _rss_mb(m.pid), _fds(m.pid)
        fetch_rss = _workers_rss_mb(m.pid)
        promote_rss = _workers_rss_mb(m.pid, b"casfs.node.promoteworker")
        log(f"footprint: idle for {idle_s:.0f} s")
        cpu0 = proc_cpu(m.pid)
        time.sleep(idle_s)
        idle_cpu = (proc_cpu(m.pid) - cpu0) / idle_s
        ready_s = m.ready_seconds
    rmtree(state)
    return [Result("footprint", f"mount of {fx.files:,} entries", {
        "ready_s": round(ready_s, 3), "rss_ready_mb": rss_ready, "fds_ready": fds_ready,
        "walked_entries": n, "walk_s": round(walk_s, 2), "rss_after_walk_mb": rss_walk,
        "fds_after_walk": fds_walk, "idle_cpu_percent": round(100 * idle_cpu, 2),
        "fetch_workers_rss_mb": fetch_rss, "promote_worker_rss_mb": promote_rss,
    }, {}, [Target("rss_after_walk_mb", 150)])]
