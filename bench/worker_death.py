"""What a job sees when casfsd's mount process (or one of its workers) dies (kill -9), measured.

    python -m bench.worker_death [--trials N] [--kill mount|fetch|promote]

A real casfsd in a tmp dir serves a namespace a job leased (``casfs env``) and
one configured mount. Probe processes read a published file and create new
files in both, every millisecond, and log each outcome. Then the mount
processes are killed with SIGKILL. casfsd holds their FUSE connections
(casfs.node.fuseconn), so new processes serve the same connections: the
probes should see only "ok". Where no connection is held (pidfd_getfd
refused, a second death within 10 s), the supervisor clears the dead mounts
(uncovering the read-only guard) and starts new ones, and the node's mount
process serves the leased namespace again at the same path.

Per trial: the outcomes (held: only ok; otherwise how long readers saw errors,
ENOTCONN: the dead connection, and misses, ENOENT: the guard, and what
writers got, EROFS on the guard instead of files that would vanish under the
returning mount), wrong bytes (must be 0) and lost writes (a create that
succeeded but whose file is gone after the restart: must be 0).

``--kill fetch``: the namespaces hold published files the node has never
read; probes read them one after the other (every read is a cold fetch) and
check their bytes, while the fetch worker of every mount process is killed
``--kills`` times per trial. A fetch in flight is sent again to the new
worker, so the job should see only correct bytes (a miss if a fetch lost its
worker twice), never ENOTCONN or EIO; the figures are the outcomes and the
read latency (what a kill adds to the reads it interrupts).

``--kill promote``: probes write new small files into both namespaces (and
read each back) every 10 ms, while the promotion worker of every mount
process (promotion and publication, casfs.node.promoteworker) is killed
``--kills`` times per trial. The job should see only successful writes and
correct bytes; the figures are the outcomes, the write latency, and how long
after the last kill every file the probes wrote is in the namespace's newest
generation (``publish_after_last_kill_s``; publish_interval is 0.5 s), plus
the RSS of the mount processes and their workers.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROBE = r'''
import errno, os, sys, time
read_path, write_dir, log_path, stop_path, want = sys.argv[1:6]
want = want.encode()
i = 0
with open(log_path, "w", buffering=1) as log:
    while not os.path.exists(stop_path):
        t = time.monotonic()
        try:
            with open(read_path, "rb") as f:
                got = f.read()
            r = "ok" if got == want else "WRONG"
        except OSError as e:
            r = errno.errorcode.get(e.errno, str(e.errno))
        name = f"w-{os.getpid()}-{i}"
        try:
            with open(os.path.join(write_dir, name), "wb") as f:
                f.write(name.encode())
            w = "ok"
        except OSError as e:
            w = errno.errorcode.get(e.errno, str(e.errno))
        log.write(f"{t:.6f} {r} {w} {name}\n")
        i += 1
        time.sleep(0.001)
'''


COLD_PROBE = r'''
import errno, os, random, sys, time
base, names_path, log_path, stop_path, size = sys.argv[1:6]
names = open(names_path).read().split()
with open(log_path, "w", buffering=1) as log:
    for name in names:
        if os.path.exists(stop_path):
            break
        want = random.Random(name).randbytes(int(size))
        t = time.monotonic()
        try:
            with open(os.path.join(base, name), "rb") as f:
                got = f.read()
            r = "ok" if got == want else "WRONG"
        except OSError as e:
            r = errno.errorcode.get(e.errno, str(e.errno))
        log.write(f"{t:.6f} {(time.monotonic() - t) * 1000:.2f} {r} {name}\n")
'''
WRITE_PROBE = r'''
import errno, os, sys, time
write_dir, log_path, stop_path = sys.argv[1:4]
os.makedirs(write_dir, exist_ok=True)
i = 0
with open(log_path, "w", buffering=1) as log:
    while not os.path.exists(stop_path):
        name = f"p{os.getpid()}-{i}"
        data = (name * 60).encode()
        t = time.monotonic()
        try:
            with open(os.path.join(write_dir, name), "wb") as f:
                f.write(data)
            with open(os.path.join(write_dir, name), "rb") as f:
                r = "ok" if f.read() == data else "WRONG"
        except OSError as e:
            r = errno.errorcode.get(e.errno, str(e.errno))
        log.write(f"{t:.6f} {(time.monotonic() - t) * 1000:.2f} {r} {name}\n")
        i += 1
        time.sleep(0.01)
'''
COLD_SIZE = 64 << 10  # bytes per cold file: random, so its fetch is not trivially short


def _probe_log(path: Path) -> tuple[list[list[str]], dict[str, int], list[float]]:
    """A probe's log: its rows (start, ms, outcome, name), outcome counts, sorted ms."""
    rows = [r for r in (line.split() for line in path.read_text().splitlines()) if len(r) == 4]
    outcomes: dict[str, int] = {}
    for r in rows:
        outcomes[r[2]] = outcomes.get(r[2], 0) + 1
    return rows, outcomes, sorted(float(r[1]) for r in rows)


def _wait(pred: Any, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Node:
    """casfsd over tmp dirs, with one configured mount and on-demand namespaces."""

    def __init__(self, tmp: Path, seed: dict[str, Path] | None = None) -> None:
        self.tmp = tmp
        for ns, src in (seed or {}).items():  # published before the node starts
            subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(tmp / "root"),
                            "--state-dir", str(tmp / "seed-state"), "import", str(src), "-n",
                            ns], check=True, capture_output=True, timeout=600)
        self.state = tmp / "state"
        self.base = tmp / "mnt-base"
        self.static = tmp / "static"
        self.cfg = tmp / "casfs.toml"
        self.cfg.write_text(
            f'[store]\nroot = "{tmp / "root"}"\n[node]\nstate_dir = "{self.state}"\n'
            f'mount_base = "{self.base}"\nlease_grace = 5\n'
            '[defaults]\nstable_after = 0.2\npublish_interval = 0.5\n'
            f'[[mounts]]\nname = "kern"\nfamily = "generic"\nnamespace = "kern-test"\n'
            f'path = "{self.static}"\n')
        self.env = dict(os.environ, CASFS_ROOT=str(tmp / "root"), CASFS_STATE_DIR=str(self.state),
                        CASFS_MOUNT_BASE=str(self.base))
        self.env.pop("NOTIFY_SOCKET", None)
        self.log = open(tmp / "casfsd.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "casfs.daemon.main", "--config",
                                      str(self.cfg)], env=self.env, stdout=self.log,
                                     stderr=self.log, start_new_session=True)
        _wait(lambda: self.status_or_none() is not None, "casfsd")

    def cli(self, *args: str) -> str:
        r = subprocess.run([sys.executable, "-m", "casfs.cli.main", *args], env=self.env,
                           capture_output=True, text=True, timeout=120, check=False)
        return r.stdout

    def status_or_none(self) -> list[dict[str, Any]] | None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"casfsd exited: {self.proc.returncode}")
        r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "status", "--json"],
                           env=self.env, capture_output=True, text=True, timeout=60, check=False)
        if r.returncode != 0:
            return None
        return list(json.loads(r.stdout))

    def worker_pids(self) -> dict[str, int]:
        """Mount name (or a served path) -> pid of the process serving it."""
        return {str(m.get("path") or m["name"]): int(m["pid"])
                for m in (self.status_or_none() or [])}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(90)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for mp in (self.base / "ns", self.static):
            for _ in range(3):
                subprocess.run(["umount", "-l", str(mp)], capture_output=True, check=False)
        self.log.close()


def _parse(log: Path) -> list[tuple[float, str, str, str]]:
    out = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:
            out.append((float(parts[0]), parts[1], parts[2], parts[3]))
    return out


def _summarise(rows: list[tuple[float, str, str, str]], killed_at: float) -> dict[str, Any]:
    after = [r for r in rows if r[0] >= killed_at]
    reads: dict[str, int] = {}
    writes: dict[str, int] = {}
    for _, r, w, _ in after:
        reads[r] = reads.get(r, 0) + 1
        writes[w] = writes.get(w, 0) + 1
    bad = [r for r in after if r[1] != "ok"]
    first_bad = bad[0][0] if bad else killed_at
    back = next((r[0] for r in after if r[0] > first_bad and r[1] == "ok"), None)
    by_kind: dict[str, float] = {}
    for kind in ("ENOTCONN", "ECONNABORTED", "ENOENT", "EROFS", "EIO"):
        ts = [r[0] for r in after if r[1] == kind or r[2] == kind]
        if ts:
            by_kind[kind + "_ms"] = round((max(ts) - min(ts)) * 1000, 1)
    return {
        "read_outcomes": reads, "write_outcomes": writes,
        "reads_failing_ms": round(((back or first_bad) - first_bad) * 1000, 1),
        "served_again": back is not None, **by_kind,
    }


def trial(node: Node, ns_path: Path, job_pid: int) -> dict[str, Any]:
    """Kill every mount process once; what the probes saw and what was lost."""
    tmp = Path(tempfile.mkdtemp(dir=node.tmp))
    stop = tmp / "stop"
    targets = {"on_demand": (ns_path / "published", ns_path),
               "configured": (node.static / "published", node.static)}
    probes = {}
    for name, (read_path, write_dir) in targets.items():
        probes[name] = subprocess.Popen([sys.executable, "-c", PROBE, str(read_path),
                                         str(write_dir), str(tmp / f"{name}.log"), str(stop),
                                         "published bytes"])
    _wait(lambda: all((tmp / f"{n}.log").exists() and (tmp / f"{n}.log").stat().st_size
                      for n in targets), "the probes")
    time.sleep(0.3)
    pids = node.worker_pids()
    killed_at = time.monotonic()
    for pid in set(pids.values()):
        os.kill(pid, signal.SIGKILL)

    def restarted() -> bool:
        now = node.worker_pids()
        return bool(now) and all(p not in pids.values() for p in now.values()) and \
            str(ns_path) in now
    _wait(restarted, "the mount processes to come back")
    time.sleep(0.5)
    stop.touch()
    for p in probes.values():
        p.wait(30)
    out: dict[str, Any] = {}
    for name, (_, write_dir) in targets.items():
        rows = _parse(tmp / f"{name}.log")
        s = _summarise(rows, killed_at)
        # A create that succeeded must still be there, with its bytes, after the restart.
        lost = 0
        for _, _, w, fname in rows:
            if w == "ok":
                try:
                    if (write_dir / fname).read_bytes() != fname.encode():
                        lost += 1
                except OSError:
                    lost += 1
        s["lost_writes"] = lost
        s["wrong_bytes"] = s["read_outcomes"].get("WRONG", 0)
        out[name] = s
    out["job_lease_kept"] = str(ns_path) in node.worker_pids() and \
        os.path.exists(f"/proc/{job_pid}")
    return out


def _worker_pids(module: bytes, arg: Path, comm: str | None = None) -> list[int]:
    """Processes running ``python -m module`` with ``arg`` on their command line
    (and named ``comm`` in /proc/<pid>/comm, when given)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if module in cmd and str(arg).encode() in cmd:
            with contextlib.suppress(OSError):
                if comm is None or (d / "comm").read_text().strip() == comm:
                    out.append(int(d.name))
    return out


def _fetch_worker_pids(node: Node) -> list[int]:
    """The node's serving fetch workers (not their spares: /proc/<pid>/comm says which)."""
    return _worker_pids(b"casfs.node.fetchworker", node.state / "objects", "casfs-fetch")


def cold_files(tmp: Path, trials: int, per_trial: int) -> tuple[dict[str, Path], list[str]]:
    """Random files for cold reads: the same names in both namespaces."""
    src = tmp / "cold-src"
    names = [f"cold/t{t}/f{i:04d}" for t in range(trials) for i in range(per_trial)]
    for n in names:
        (src / n).parent.mkdir(parents=True, exist_ok=True)
        (src / n).write_bytes(random.Random(n).randbytes(COLD_SIZE))
    return {"kern-test": src, "ondemand-test": src}, names


def fetch_trial(node: Node, ns_path: Path, names: list[str], kills: int) -> dict[str, Any]:
    """Kill the fetch workers ``kills`` times while probes read cold files."""
    tmp = Path(tempfile.mkdtemp(dir=node.tmp))
    stop = tmp / "stop"
    (tmp / "names").write_text("\n".join(names))
    bases = {"on_demand": ns_path, "configured": node.static}
    probes = {name: subprocess.Popen([sys.executable, "-c", COLD_PROBE, str(base),
                                      str(tmp / "names"), str(tmp / f"{name}.log"), str(stop),
                                      str(COLD_SIZE)]) for name, base in bases.items()}
    _wait(lambda: all((tmp / f"{n}.log").exists() and (tmp / f"{n}.log").stat().st_size
                      for n in bases), "the probes")
    killed = 0
    kill_times = []
    rng = random.Random(0)
    for _ in range(kills):
        time.sleep(rng.uniform(0.2, 0.6))
        pids = _fetch_worker_pids(node)
        kill_times.append(time.monotonic())
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    time.sleep(1.0)
    stop.touch()
    for p in probes.values():
        p.wait(60)
    out: dict[str, Any] = {"fetch_workers_killed": killed}
    for name in bases:
        rows, outcomes, ms = _probe_log(tmp / f"{name}.log")
        # reads in flight at a kill: started before it, ended after it
        hit = [float(r[1]) for r in rows for k in kill_times
               if float(r[0]) <= k <= float(r[0]) + float(r[1]) / 1000]
        out[name] = {
            "reads": len(rows), "outcomes": outcomes,
            "wrong_bytes": outcomes.get("WRONG", 0),
            "errors": sum(v for k, v in outcomes.items() if k not in ("ok", "ENOENT", "WRONG")),
            "read_ms_p50": ms[len(ms) // 2] if ms else None,
            "read_ms_p99": ms[int(len(ms) * 0.99)] if ms else None,
            "read_ms_max": ms[-1] if ms else None,
            "reads_in_flight_at_a_kill": len(hit),
            "their_read_ms_max": max(hit) if hit else None,
        }
    return out


def _promote_worker_pids(node: Node) -> list[int]:
    """The node's promotion workers (one per mount process)."""
    return _worker_pids(b"casfs.node.promoteworker", node.state)


def _rss_kib(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def rss(node: Node) -> dict[str, Any]:
    """RSS (MiB) of the mount processes and of their fetch and promotion workers."""
    mounts = set(node.worker_pids().values())
    fetch = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()
             and b"casfs.node.fetchworker" in (cmd := _cmdline(d))
             and str(node.state / "objects").encode() in cmd]
    promote = _promote_worker_pids(node)
    mib = lambda pids: sorted(round(_rss_kib(p) / 1024, 1) for p in pids)  # noqa: E731
    return {"mount_mib": mib(mounts), "fetch_worker_mib": mib(fetch),
            "promote_worker_mib": mib(promote)}


def _cmdline(d: Path) -> bytes:
    try:
        return (d / "cmdline").read_bytes()
    except OSError:
        return b""


def _published_names(node: Node, ns: str) -> set[str]:
    out = node.cli("ls", "--json", "-r", ns, "promo")
    try:
        doc = json.loads(out)
    except ValueError:
        return set()
    rows = doc if isinstance(doc, list) else doc.get("entries", [])
    return {Path(str(r.get("path", ""))).name for r in rows if isinstance(r, dict)}


def promote_trial(node: Node, ns_path: Path, kills: int) -> dict[str, Any]:
    """Kill the promotion workers ``kills`` times while probes write; then how long until
    everything written is published."""
    tmp = Path(tempfile.mkdtemp(dir=node.tmp))
    stop = tmp / "stop"
    bases = {"on_demand": (ns_path, "ondemand-test"), "configured": (node.static, "kern-test")}
    probes = {name: subprocess.Popen([sys.executable, "-c", WRITE_PROBE, str(base / "promo"),
                                      str(tmp / f"{name}.log"), str(stop)])
              for name, (base, _) in bases.items()}
    _wait(lambda: all((tmp / f"{n}.log").exists() and (tmp / f"{n}.log").stat().st_size
                      for n in bases), "the probes")
    killed = 0
    rng = random.Random(1)
    last_kill = time.monotonic()
    for _ in range(kills):
        time.sleep(rng.uniform(0.3, 1.0))
        for pid in _promote_worker_pids(node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        last_kill = time.monotonic()
    stop.touch()
    for p in probes.values():
        p.wait(60)
    out: dict[str, Any] = {"promote_workers_killed": killed}
    written: dict[str, set[str]] = {}
    for name in bases:
        rows, outcomes, ms = _probe_log(tmp / f"{name}.log")
        written[name] = {r[3] for r in rows if r[2] == "ok"}
        out[name] = {
            "writes": len(rows), "outcomes": outcomes,
            "wrong_bytes": outcomes.get("WRONG", 0),
            "errors": sum(v for k, v in outcomes.items() if k != "ok"),
            "write_ms_p50": ms[len(ms) // 2] if ms else None,
            "write_ms_max": ms[-1] if ms else None,
            "publish_after_last_kill_s": None,  # stays None: not all published in 120 s
        }
    # Every file a probe wrote in the newest generation: when, after the last kill
    # (resolution: one `casfs ls` per namespace and poll).
    left = set(bases)
    deadline = time.monotonic() + 120
    while left and time.monotonic() < deadline:
        for name in sorted(left):
            if written[name] <= _published_names(node, bases[name][1]):
                out[name]["publish_after_last_kill_s"] = round(time.monotonic() - last_kill, 2)
                left.discard(name)
        time.sleep(0.1)
    out["rss"] = rss(node)
    return out


def setup(node: Node) -> tuple[Path, subprocess.Popen[str]]:
    """A job holding a lease on one namespace; a published file in both mounts."""
    job = subprocess.Popen(
        ["sh", "-c", 'eval "$(casfs env --family generic -n ondemand-test)" && '
         'echo "$CASFS_CACHE_DIR" && exec sleep 3600'],
        env=dict(node.env, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}"),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert job.stdout is not None
    ns_path = Path(job.stdout.readline().strip())
    for d, ns in ((ns_path, "ondemand-test"), (node.static, "kern-test")):
        (d / "published").write_bytes(b"published bytes")
        _wait(lambda ns=ns: "published" in node.cli("ls", ns), f"publication in {ns}")
    return ns_path, job


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.worker_death")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--kill", choices=("mount", "fetch", "promote"), default="mount",
                    help="kill the mount processes (default), their fetch workers or their"
                         " promotion workers")
    ap.add_argument("--kills", type=int, default=5, help="worker kills per trial")
    ap.add_argument("--cold-files", type=int, default=400,
                    help="cold files per trial and namespace (--kill fetch)")
    ap.add_argument("--pause", type=float, default=12.0,
                    help="seconds between trials: a node that crashes less often than this"
                         " always finds its standby processes ready")
    args = ap.parse_args(argv)
    if not os.path.exists("/dev/fuse") or os.geteuid() != 0:
        print(json.dumps({"skipped": "needs root and /dev/fuse"}))
        return 0
    with tempfile.TemporaryDirectory(prefix="casfs-worker-death-") as t:
        seed, names = ({}, []) if args.kill != "fetch" else cold_files(
            Path(t), args.trials, args.cold_files)
        node = Node(Path(t), seed)
        job = None
        try:
            ns_path, job = setup(node)
            trials = []
            for i in range(args.trials):
                if args.kill == "promote":
                    time.sleep(2.0)
                    trials.append(promote_trial(node, ns_path, args.kills))
                    continue
                if args.kill == "fetch":
                    time.sleep(2.0)
                    trials.append(fetch_trial(node, ns_path, names[i * args.cold_files:(
                        i + 1) * args.cold_files], args.kills))
                    continue
                time.sleep(args.pause)  # the standby processes get ready (imports)
                trials.append(trial(node, ns_path, job.pid))
        finally:
            if job is not None:
                job.kill()
                job.wait()
            node.close()
    print(json.dumps({"bench": "worker_death", "kill": args.kill, "pause_s": args.pause,
                      "trials": trials}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Node", "errno", "setup", "trial"]
