"""Overlay mode: first touch after warm-ready on a fresh node, and overlayfs's own cost.

    python -m bench.overlaywarm [--kernels 600] [--rounds 5] [--options] [--json FILE]

The Triton-like tree (600 kernel dirs of 7 files) is imported into a shared
root; an earlier run (a fuse mount on a node of its own) reads every file and
writes one, so its publication names an access profile holding the whole tree
(the repeated workload). Each round, passes side by side, order rotated:

* plain warm: the source directory read twice, the second pass timed;
* warm-ready first touch: a fresh node (its own state dir, same root) mounted
  in overlay mode with ``wait_warm``: the mount is ready once the profile's
  hot set is local, every file then sits in the links layer; the job's first
  read of the tree through the overlay is timed. No ``drop_caches``: the
  prefetch has just written these pages, as it would on a real node;
* overlay warm: the same mount read again.

With ``--options`` each round also mounts, by hand over the same node's
layers (its links dir and its FUSE layer, a throwaway upper/work), overlays
with other mount options, read twice, the second pass timed, and reads the
links directory directly (no overlay: acceptable for a read-only hot set,
not for a cache jobs write into). Ratios are per-file time over plain warm.
``readpath`` (bench/run) runs the first part once per round.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench import common, tree
from bench.common import PY, Result, Settings, Target, log, median, ratio, rmtree
from bench.common import run_proc as _run
from bench.mounts import config, mounted
from casfs.families import rules as family_rules
from casfs.promote.importer import import_tree
from casfs.store.root import SharedRoot
from casfs.util.libc import libc
from casfs.view import overlay

# Variants of the overlay's mount options (issue 13 (b)); "" is casfs's own mount.
# index, metacopy, nfs_export, redirect_dir and xino are off by default on this
# kernel's module (check /sys/module/overlay/parameters): said explicitly here.
OPTION_SETS: dict[str, str] = {
    "default": "",
    "all_off": "index=off,metacopy=off,redirect_dir=off,xino=off,nfs_export=off",
    "redirect_nofollow": "redirect_dir=nofollow",
    "uuid_null": "uuid=null",
    "uuid_off": "uuid=off",
    "xino_on": "xino=on",
    "noatime": "noatime",  # a mount flag (MS_NOATIME), not an overlayfs option
}
MS_NOATIME = 1024


READER_NICE = 0  # --reader-nice: every pass's reader at this niceness (same for all)


def reader(path: Path) -> dict[str, Any]:
    nice = ["nice", "-n", str(READER_NICE)] if READER_NICE else []
    p = _run([*nice, PY, "-m", "bench.clients", "read", str(path)])
    if p.rc != 0:
        raise RuntimeError(f"reader failed on {path}")
    out: dict[str, Any] = json.loads(p.stdout)
    # The reader's own CPU (user + sys: overlayfs's work runs in the opener's context)
    # moves far less with the machine's load than wall time does.
    out["cpu_us_per_file"] = round(out["cpu_seconds"] / out["files"] * 1e6, 1)
    return out


def publish_profile(root: Path, ns: str, work: Path) -> None:
    """An earlier run on its own node: read the whole tree, write one file, publish."""
    state = work / "node-profile"
    with mounted(config(root, state, work / "mnt", ns)) as m:
        reader(m.path)
        (m.path / "casfs-bench").mkdir(exist_ok=True)
        (m.path / "casfs-bench" / "run").write_bytes(b"profile run")
    rec = SharedRoot.open(root).generations().latest(ns)
    if rec is None or not isinstance(rec.options.get("profile"), str):
        raise RuntimeError("the profile run published no access profile")
    rmtree(state)


def _plain(src: Path, out: dict[str, list[dict[str, Any]]]) -> None:
    reader(src)
    out["plain_warm"].append(reader(src))


def bare(src: Path, work: Path, out: dict[str, list[dict[str, Any]]],
         fanotify: bool = True) -> None:
    """The kernel's own bound: an overlay with the plain tree as its only lower and an
    empty upper, no casfs at all (warm: read twice, the second timed); then (with
    ``fanotify``) the same with casfs's fanotify setting on it (a mount mark for
    FAN_OPEN, every file's ignore mark set by a first pass): what each open pays
    for recording."""
    from casfs.view.opens import FanotifyOpens

    with hand_overlay(str(src), work / "bare", "") as mnt:
        reader(mnt)
        out["bare_overlay_warm"].append(reader(mnt))
        if not fanotify:
            return
        w = FanotifyOpens(mnt, lambda rel: True)
        w.start()
        try:
            reader(mnt)  # the epoch's first opens: one event and one ignore mark a file
            deadline = time.monotonic() + 30
            while w.events < out["bare_overlay_warm"][-1]["files"] and (
                    time.monotonic() < deadline):
                time.sleep(0.05)
            time.sleep(0.2)  # the last marks follow the last callbacks
            out["bare_overlay_fanotify_warm"].append(reader(mnt))
        finally:
            w.stop()


@contextlib.contextmanager
def hand_overlay(lowers: str, work: Path, opts: str) -> Iterator[Path]:
    """An overlay over ``lowers`` (a lowerdir= value) with ``opts``, a throwaway upper."""
    for d in ("u", "w", "m"):
        rmtree(work / d)
        (work / d).mkdir(parents=True)
    data = f"lowerdir={lowers},upperdir={work / 'u'},workdir={work / 'w'}"
    flags = MS_NOATIME if opts == "noatime" else 0
    if opts and not flags:
        data += "," + opts
    mnt = work / "m"
    if libc().mount(b"bench-overlay", os.fsencode(mnt), b"overlay", flags,
                    data.encode()) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount overlay {opts or '(default)'}: {os.strerror(e)}")
    try:
        yield mnt
    finally:
        overlay.unmount(mnt)
        rmtree(work)


@contextlib.contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    """``name`` set to ``value`` (None: as it is) for the mount processes spawned inside."""
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if value is not None:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def _record_lag(m: Any, files: int, timeout: float = 60) -> float | None:
    """Seconds until the mount's open listener has reported ``files`` opens (None: no
    listener, or never). Polled with backoff from 0.1 s: a stats call costs the mount
    process some CPU, kept to a few per pass whatever the listener."""
    t0 = time.perf_counter()
    pause = 0.1
    while time.perf_counter() - t0 < timeout:
        ow = m.ask("stats").get("open_watch")
        if ow is None:  # no listener (fanotify unavailable, or off)
            return None
        if (ow.get("events") or 0) >= files:
            return round(time.perf_counter() - t0, 3)
        time.sleep(pause)
        pause = min(pause * 2, 2.0)
    return None


LISTENERS = {"process": None, "thread": "0", "off": "off"}  # CASFS_OPEN_WATCH_PROCESS


def _fresh_node(root: Path, ns: str, work: Path, i: int, options: bool,
                out: dict[str, list[dict[str, Any]]], prewarmed: bool = False,
                listener: str = "process") -> None:
    """``listener``: how overlay mode's fanotify listener runs (casfs's: a child
    process; "thread": in the mount process, as before; "off": none), keys other
    than casfs's own carrying its name."""
    tag = "" if listener == "process" else listener
    state = work / f"node{i}{'p' if prewarmed else ''}{tag}"
    cfg = config(root, state, work / "mnt", ns, mode="overlay", wait_warm=600)
    pre = ("prewarmed_" if prewarmed else "") + (f"{tag}_" if tag else "")
    with _env("CASFS_OPEN_WATCH_PROCESS", LISTENERS[listener]), mounted(cfg) as m:
        st = m.ask("stats")
        c = st["counters"]
        pw: dict[str, Any] = {}
        if prewarmed:  # what `casfs run --wait-warm` does before the job starts
            t0 = time.perf_counter()
            pw["prewarmed_files"] = overlay.prewarm(
                overlay.OverlayPaths(cfg.upper, cfg.overlay_base).links, m.path)
            pw["prewarm_s"] = round(time.perf_counter() - t0, 3)
        out[f"{pre}ready"].append({**pw, "spawn_to_ready_s": round(m.ready_seconds, 3),
                             "mount_ready_s": st["mount_ready_s"],
                             "warm_ready_s": st["warm_ready_s"],
                             "prefetched_files": c.get("prefetched_files", 0),
                             "overlay_linked": c.get("overlay_linked", 0),
                             "overlay_generated": c.get("overlay_generated", 0),
                             "warm_wait_timeouts": c.get("warm_wait_timeouts", 0)})
        lpid = (st.get("open_watch") or {}).get("pid")
        cpu0, lcpu0 = common.thread_cpu(m.pid), common.thread_cpu(lpid)
        first = reader(m.path)
        # CPU beside the job during its pass (what competes with it for the cores)...
        n = first["files"]
        first["server_job_cpu_us_per_file"] = round(common.cpu_since(m.pid, cpu0) / n * 1e6, 1)
        first["listener_job_cpu_us_per_file"] = round(common.cpu_since(lpid, lcpu0) / n * 1e6, 1)
        # ...then how long after the pass its opens are all recorded (a low-priority
        # listener may trail the job), and the CPU until then, both processes.
        first["record_lag_s"] = _record_lag(m, n)
        first["server_cpu_us_per_file"] = round(common.cpu_since(m.pid, cpu0) / n * 1e6, 1)
        first["listener_cpu_us_per_file"] = round(common.cpu_since(lpid, lcpu0) / n * 1e6, 1)
        first["open_events"] = (m.ask("stats").get("open_watch") or {}).get("events")
        out[f"warmready_{pre}first"].append(first)
        c0 = m.ask("stats")["counters"]
        out[f"overlay_{pre}warm"].append(reader(m.path))
        c1 = m.ask("stats")["counters"]
        # FUSE opens during the warm pass: 0 when the links layer serves everything
        out["fuse_opens_warm"].append({"n": c1.get("open_lower", 0) - c0.get("open_lower", 0)})
        if options and not prewarmed:
            links = state / "overlay" / ns / "links"
            fuse = state / "overlay" / ns / "fuse"
            reader(links)
            out["links_direct"].append(reader(links))
            for name, opts in OPTION_SETS.items():
                for key, lowers in ((f"opt_{name}", f"{links}:{fuse}"),
                                    (f"optnofuse_{name}", str(links))):
                    try:
                        with hand_overlay(lowers, work / "hand", opts) as mnt:
                            out.setdefault(f"first_{key}", []).append(reader(mnt))
                            out.setdefault(key, []).append(reader(mnt))
                    except OSError as e:
                        log(f"overlaywarm: {key}: {e}")
                        out.setdefault(f"{key}_refused", []).append({"error": str(e)})
    rmtree(state)


def measure(work: Path, kernels: int, rounds: int, options: bool = False,
            listeners: bool = False) -> dict[str, Any]:
    """Rounds of plain warm vs warm-ready first touch (and, with ``options``, overlay
    mount-option variants); raw passes, per-file medians and ratios over plain warm."""
    if (why := overlay.unavailable_reason()) is not None:
        return {"skipped": why}
    src, root = work / "src", work / "root"
    files, nbytes = tree.build(src, kernels, seed=f"warm{kernels}")
    ns = f"bench-warm-{kernels}"
    import_tree(SharedRoot.open(root, create=True), src, ns, rules=family_rules("triton"),
                node="bench")
    publish_profile(root, ns, work)
    runs: dict[str, list[dict[str, Any]]] = collections.defaultdict(list, {k: [] for k in (
        "plain_warm", "bare_overlay_warm", "bare_overlay_fanotify_warm",
        "warmready_first", "overlay_warm", "ready", "fuse_opens_warm",
        "links_direct", "warmready_prewarmed_first", "overlay_prewarmed_warm",
        "prewarmed_ready")})
    for i in range(rounds):
        log(f"overlaywarm: {files} files, round {i + 1} (load {os.getloadavg()[0]:.2f})")
        passes: list[Callable[[], None]] = [
            functools.partial(_plain, src, runs),
            functools.partial(bare, src, work, runs),
            functools.partial(_fresh_node, root, ns, work, i, options, runs),
            functools.partial(_fresh_node, root, ns, work, i, False, runs, True)]
        if listeners:  # the same warm-ready job with the listener in the mount process, none
            passes += [functools.partial(_fresh_node, root, ns, work, i, False, runs, True, x)
                       for x in ("thread", "off")]
        for k in range(len(passes)):
            passes[(k + i) % len(passes)]()
    us = {k: median([r["seconds"] / r["files"] * 1e6 for r in v])
          for k, v in runs.items() if v and "seconds" in v[0]}
    cpu = {k: median([r["cpu_us_per_file"] for r in v])
           for k, v in runs.items() if v and "cpu_us_per_file" in v[0]}
    per_round = {k: [ratio(r["seconds"] / r["files"], p["seconds"] / p["files"], 2)
                     for r, p in zip(v, runs["plain_warm"], strict=False)]
                 for k, v in runs.items() if v and "seconds" in v[0] and k != "plain_warm"}
    per_round_cpu = {k: [ratio(r["cpu_us_per_file"], p["cpu_us_per_file"], 2)
                         for r, p in zip(v, runs["plain_warm"], strict=False)]
                     for k, v in runs.items()
                     if v and "cpu_us_per_file" in v[0] and k != "plain_warm"}
    return {
        "files": files, "mb": round(nbytes / 1e6, 1), "rounds": rounds,
        "per_round_cpu_over_plain_warm": per_round_cpu,
        "plain_warm_cpu_us_per_file_by_round": [r["cpu_us_per_file"]
                                                for r in runs["plain_warm"]],
        "us_per_file": {k: round(v, 1) for k, v in us.items()},
        "over_plain_warm": {k: ratio(v, us["plain_warm"], 2) for k, v in us.items()
                            if k != "plain_warm"},
        "per_round_over_plain_warm": per_round,
        "reader_cpu_us_per_file": {k: round(v, 1) for k, v in cpu.items()},
        **{f"{w}_cpu_us_per_file": {k: median([r[f"{w}_cpu_us_per_file"] for r in v])
                                    for k, v in runs.items()
                                    if v and f"{w}_cpu_us_per_file" in v[0]}
           for w in ("server", "listener", "server_job", "listener_job")},
        "open_events": {k: [r["open_events"] for r in v] for k, v in runs.items()
                        if v and "open_events" in v[0]},
        "record_lag_s": {k: [r["record_lag_s"] for r in v] for k, v in runs.items()
                         if v and "record_lag_s" in v[0]},
        "reader_cpu_over_plain_warm": {k: ratio(v, cpu["plain_warm"], 2)
                                       for k, v in cpu.items() if k != "plain_warm"},
        "ready": runs["ready"],
        "prewarmed_ready": runs["prewarmed_ready"],
        "fuse_opens_warm": [r["n"] for r in runs["fuse_opens_warm"]],
        "refused": {k: v for k, v in runs.items() if k.endswith("_refused")},
    }


def result(s: Settings, kernels: int = 600) -> Result:
    """bench/run's row (readpath): the issue's target for a repeated workload."""
    work = s.workdir / "overlaywarm"
    try:
        out = measure(work, kernels, 2 if s.quick else 3)
    finally:
        rmtree(work)
    if "skipped" in out:
        return Result("readpath", "overlay warm-ready", notes=[out["skipped"]])
    r = out["over_plain_warm"]
    cpu = out["reader_cpu_over_plain_warm"]
    figures = {"files": out["files"], "mb": out["mb"],
               **{f"{k}_us_per_file": v for k, v in out["us_per_file"].items()},
               "mount_ready_s": median([x["mount_ready_s"] for x in out["ready"]]),
               "warm_ready_s": median([x["warm_ready_s"] or 0 for x in out["ready"]]),
               "prewarm_s": median([x["prewarm_s"] for x in out["prewarmed_ready"]])}
    # The target holds `casfs run --wait-warm` (mount waits, launcher prewarms); the
    # bare figure (no prewarm) and the readers' CPU (load moves it far less) beside it.
    return Result("readpath", "overlay warm-ready, fresh node", figures,
                  {"first_over_plain_warm": r.get("warmready_prewarmed_first"),
                   "first_cpu_over_plain_warm": cpu.get("warmready_prewarmed_first"),
                   "first_noprewarm_over_plain_warm": r.get("warmready_first"),
                   "first_noprewarm_cpu_over_plain_warm": cpu.get("warmready_first"),
                   "overlay_warm_over_plain_warm": r.get("overlay_warm"),
                   "overlay_warm_cpu_over_plain_warm": cpu.get("overlay_warm"),
                   # the kernel's own bound: an overlay of the plain tree, no casfs
                   "bare_overlay_warm_over_plain_warm": r.get("bare_overlay_warm"),
                   "bare_overlay_warm_cpu_over_plain_warm": cpu.get("bare_overlay_warm"),
                   "bare_overlay_fanotify_cpu_over_plain_warm":
                       cpu.get("bare_overlay_fanotify_warm")},
                  [Target("first_over_plain_warm", 1.5),
                   Target("first_cpu_over_plain_warm", 1.5)],
                  raw=out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.overlaywarm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--options", action="store_true",
                    help="also overlays with other mount options, and the links dir alone")
    ap.add_argument("--listeners", action="store_true",
                    help="also warm-ready nodes whose fanotify listener is a thread of the "
                    "mount process (CASFS_OPEN_WATCH_PROCESS=0, as before) or off")
    ap.add_argument("--reader-nice", type=int, default=0,
                    help="run every reader at this niceness (e.g. -10: other load on a "
                    "shared machine then moves wall time less; the listener stays idle)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--workdir", type=Path)
    args = ap.parse_args(argv)
    import tempfile

    global READER_NICE
    READER_NICE = args.reader_nice

    work = Path(tempfile.mkdtemp(prefix="casfs-bench-warm-", dir=args.workdir))
    load0 = os.getloadavg()
    try:
        out = measure(work, args.kernels, args.rounds, args.options, args.listeners)
    finally:
        rmtree(work)
    out["reader_nice"] = args.reader_nice
    out["loadavg"] = {"start": [round(x, 2) for x in load0],
                      "end": [round(x, 2) for x in os.getloadavg()]}
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
