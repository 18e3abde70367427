"""What recording opens costs in overlay mode (fanotify, casfs.view.opens) and dir mode
(inotify IN_OPEN, casfs.view.dirmode.watch: casfs.view.inowatch).

    python -m bench.open_watch [--files 4000] [--rounds 5]

A plain overlayfs over FILES small files (needs CAP_SYS_ADMIN), read ROUNDS
times by a child process (bench.clients read), warm, in one run:

- ``none``: no watcher;
- ``fanotify``: FAN_OPEN on the overlay mount with ignore marks (one event per
  file per epoch: casfs's setting); first round = the epoch's first opens;
- ``fanotify_no_ignore``: every open is an event (what ignore marks save);
- ``inotify``: casfs.view.inowatch with IN_OPEN on the lower directory read
  directly (dir mode's watch; it receives IN_OPEN whether recorded or not).

Prints one JSON object: files/s per round and mode (ratios to ``none``),
events, events/s handled, and the watcher's CPU seconds (this process's CPU
time: the watcher is its only busy thread while the child reads).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _read(top: Path) -> float:
    out = subprocess.run([sys.executable, "-m", "bench.clients", "read", str(top)],
                         capture_output=True, text=True, check=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["files_per_s"])


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _rounds(top: Path, rounds: int) -> tuple[list[float], float]:
    c0 = _cpu()
    rates = [_read(top) for _ in range(rounds)]
    time.sleep(0.3)  # let the watcher drain its queue
    return rates, round(_cpu() - c0, 3)


def run(files: int, rounds: int) -> dict[str, Any]:
    from casfs.promote.tracker import WriteTracker
    from casfs.view.dirmode import watch
    from casfs.view.opens import FanotifyOpens

    out: dict[str, Any] = {"files": files, "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="casfs-openwatch-") as tmp:
        base = Path(tmp)
        lower, upper, work, mnt = (base / d for d in ("lower", "upper", "work", "mnt"))
        for d in (upper, work, mnt):
            d.mkdir()
        for i in range(files):
            p = lower / f"d{i // 100:03d}" / f"f{i:05d}"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(os.urandom(1024))
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={lower},upperdir={upper},workdir={work}", str(mnt)],
                       check=True)
        try:
            _read(mnt)  # warm the page and dentry caches
            rates, cpu = _rounds(mnt, rounds)
            out["none"] = {"files_per_s": rates, "cpu_s": cpu}
            for name, keep in (("fanotify", True), ("fanotify_no_ignore", False)):
                seen: set[str] = set()

                def on_open(rel: str, keep: bool = keep, seen: set[str] = seen) -> bool:
                    seen.add(rel)
                    return keep

                w = FanotifyOpens(mnt, on_open)
                w.start()
                try:
                    rates, cpu = _rounds(mnt, rounds)
                finally:
                    w.stop()
                out[name] = {"files_per_s": rates, "cpu_s": cpu, "events": w.events,
                             "distinct": len(seen)}
            seen_i: list[str] = []
            obs = watch(lower, WriteTracker(), on_open=seen_i.extend)
            time.sleep(0.5)
            try:
                rates, cpu = _rounds(lower, rounds)
                _read(lower)
            finally:
                obs.stop()
                obs.join(timeout=10)
            base_rates = [_read(lower) for _ in range(rounds)]
            out["plain_lower"] = {"files_per_s": base_rates}
            out["inotify"] = {"files_per_s": rates, "cpu_s": cpu, "events": len(seen_i)}
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
    ref = sorted(out["none"]["files_per_s"])[rounds // 2]
    for name in ("fanotify", "fanotify_no_ignore"):
        r = out[name]
        r["median_vs_none"] = round(sorted(r["files_per_s"])[rounds // 2] / ref, 3)
        r["cpu_us_per_event"] = round(1e6 * r["cpu_s"] / max(1, r["events"]), 1)
    ref_l = sorted(out["plain_lower"]["files_per_s"])[rounds // 2]
    out["inotify"]["median_vs_plain"] = round(sorted(out["inotify"]["files_per_s"])[rounds // 2]
                                              / ref_l, 3)
    out["inotify"]["cpu_us_per_event"] = round(
        1e6 * out["inotify"]["cpu_s"] / max(1, out["inotify"]["events"]), 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    print(json.dumps(run(a.files, a.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
