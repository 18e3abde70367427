"""2. Time to ready: casfs mount on a fresh node against copy-based restores.

Also ``casfs run``'s ready time as a job sees it (issue 13: <= 0.5 s at
10,000 files on a fresh node, Python start-up and imports included): from
launching ``casfs run -- JOB`` to the job's first instruction, against
launching the same job directly in the same run; fresh node state each time.

casfs: spawn of the mount process to READY on a brand-new node state dir (empty
index, empty object cache), which includes reading and indexing the generation's
manifest. Alternatives restore the same files into a fresh local directory:
``cp -a``, ``rsync -a`` (skipped with a note if rsync is not installed) and a
``zstd -dc | tar -x`` extraction of an archive made beforehand. The page cache
holds the sources (best case for the copies; a real shared filesystem is slower).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from bench.common import Result, Settings, Target, log, median, ratio, repeat, rmtree
from bench.fixture import Fixture
from bench.mounts import config, mounted
from casfs.node.guard import mounts_at
from casfs.view.session import lazy_unmount

CASFS = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "casfs")


def _sh(cmd: str) -> None:
    subprocess.run(["bash", "-c", cmd], check=True)


def casfs_ready(fx: Fixture, ns: str, work: Path, n: int) -> list[float]:
    out = []
    for i in range(n):
        state = work / f"node-{ns}-{i}"
        cfg = config(fx.root_path, state, work / "mnt", ns)
        with mounted(cfg) as m:
            out.append(round(m.ready_seconds, 4))
        rmtree(state)
    return out


def _job_start(cmd: list[str], stamp: Path, env: dict[str, str]) -> float:
    """Seconds from launching ``cmd`` to the job writing its start time into ``stamp``."""
    t0 = time.time()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=300)
    return float(stamp.read_text()) - t0


def run_ready(fx: Fixture, ns: str, work: Path, n: int) -> tuple[list[float], list[float]]:
    """(casfs run ready, the same job launched directly), ``n`` each, interleaved."""
    stamp = work / "job-started"
    job = ["sh", "-c", f"date +%s.%N > '{stamp}'"]
    exe = CASFS if os.access(CASFS, os.X_OK) else shutil.which("casfs") or "casfs"
    casfs, plain = [], []
    for i in range(n):
        node = work / f"run-node-{i}"
        env = dict(os.environ, CASFS_ROOT=str(fx.root_path), CASFS_STATE_DIR=str(node / "state"),
                   CASFS_SERVE_BASE=str(node / "serve"), CASFS_MOUNT_BASE=str(node / "mnt"))
        try:
            casfs.append(round(_job_start(
                [exe, "run", "--family", "generic", "--namespace", ns, "--", *job], stamp,
                env), 4))
        finally:
            for _ in range(3):  # the host unmounts its FUSE mount and guard; if it did not
                if mounts_at(node / "serve"):
                    lazy_unmount(node / "serve")
            rmtree(node)
        plain.append(round(_job_start(job, stamp, dict(os.environ)), 4))
    return casfs, plain


def bench_size(fx: Fixture, s: Settings, files: int) -> Result:
    ns, src = fx.subset(files)
    work = s.workdir / f"ready-{files}"
    dst = work / "dst"
    work.mkdir(parents=True, exist_ok=True)
    reps = s.reps(3, 2 if files <= 1_000 else 1)
    log(f"ready: {files} files, casfs mount")
    casfs = casfs_ready(fx, ns, work, reps)
    log(f"ready: {files} files, casfs run -- JOB (fresh node)")
    run_casfs, run_plain = run_ready(fx, ns, work, max(reps, 3))
    alts: dict[str, list[float]] = {}
    notes = ["sources in the page cache (best case for copying)"]

    def clean() -> None:
        rmtree(dst)

    log(f"ready: {files} files, cp -a")
    alts["cp_a"] = repeat(reps, lambda: _sh(f"cp -a '{src}' '{dst}'"), clean)
    if shutil.which("rsync"):
        log(f"ready: {files} files, rsync -a")
        alts["rsync"] = repeat(reps, lambda: _sh(f"rsync -a '{src}/' '{dst}/'"), clean)
    else:
        notes.append("rsync is not installed: skipped")
    archive = work / "cache.tar.zst"
    _sh(f"tar -C '{src}' -cf - . | zstd -q -3 -T0 -o '{archive}'")
    log(f"ready: {files} files, tar+zstd extract")
    alts["tar_zstd"] = repeat(
        reps, lambda: _sh(f"mkdir -p '{dst}' && zstd -q -dc '{archive}' | tar -C '{dst}' -xf -"),
        clean)
    archive_bytes = archive.stat().st_size
    rmtree(work)
    c = median(casfs)
    figures: dict[str, object] = {"files": files, "casfs_ready_s": round(c, 3)}
    ratios: dict[str, float | None] = {}
    for k, v in alts.items():
        figures[f"{k}_s"] = round(median(v), 3)
        ratios[f"{k}_over_casfs"] = ratio(median(v), c, 1)
    fastest = min(median(v) for v in alts.values())
    ratios["fastest_copy_over_casfs"] = ratio(fastest, c, 1)
    figures["casfs_run_ready_s"] = round(median(run_casfs), 3)
    figures["plain_job_start_s"] = round(median(run_plain), 4)
    ratios["casfs_run_ready_over_plain_job_start"] = ratio(median(run_casfs),
                                                           median(run_plain), 1)
    # Restated (issue 23): `casfs run` ready <= 0.5 s at 1,000 and 10,000 files; the copy
    # ratio only at 100,000 files (at 1,000 a copy takes less than Python's start).
    targets: list[Target] = []
    if files >= 100_000:
        targets += [Target("casfs_ready_s", 1.0), Target("fastest_copy_over_casfs", 20, "ge")]
    if files in (1_000, 10_000):
        targets.insert(0, Target("casfs_run_ready_s", 0.5))
    return Result("ready", f"{files} files", figures, ratios, targets,
                  raw={"casfs_s": casfs, **{f"{k}_s": v for k, v in alts.items()},
                       "casfs_run_ready_s": run_casfs, "plain_job_start_s": run_plain,
                       "archive_bytes": archive_bytes}, notes=notes)


def run(fx: Fixture, s: Settings) -> list[Result]:
    sizes = [1_000, 10_000] if s.quick else [1_000, 10_000, 100_000]
    return [bench_size(fx, s, n) for n in sizes if n <= fx.files + 10]
