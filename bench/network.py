"""A fresh node across a network (issue 23): casfs against copy-restore at 20 ms RTT.

Usage: ``python -m bench.network [--runs 3] [--quick] [--rtt-ms 20]
[--journaled-scratch] [--json FILE]`` (also ``bench/run --only network``: opt-in,
not in the default set). ``--journaled-scratch``: the nodes write on a fresh
journaled ext4, as a node's disk (this VM's root ext4 has none, which makes
every file created dearer: bench.common.scratch_fs; the JSON's ``workdir_fs``).

The shared root is an S3 root on SeaweedFS behind tests/netem.py's proxy, which
adds a one-way delay both ways (20 ms RTT; beside it 0 delay, ~0.1 ms through
the proxy on loopback) and counts every request by kind. The tree is a
600-kernel Triton-like cache, 8 files a kernel as Triton 3.x writes them
(``k.source .ttir .ttgir .llir .ptx .cubin .json`` and ``__grp__k.json``):
4,800 files, ~77 MB, deterministic pseudo-content that compresses about as
real IR and cubins do (~7-8x with zstd, file by file).

For each run and each delay:

(a) **casfs**: a writer job under a real ``casfs run --family triton`` writes
    the tree into ``$TRITON_CACHE_DIR`` (as Triton does: a temp dir, then
    ``os.replace``), and casfs promotes it into packs and publishes a fresh
    namespace (at 0 delay: publication is not what is measured). Then a fresh
    node (empty state dir) runs ``casfs run -- <a job that reads every file>``;
    timed from launching ``casfs run`` to its exit, requests counted through
    the proxy over exactly that span. A fresh namespace per run, so every
    measured node is the first to read it, as in the issue.
(b) **copy-restore**: one GET of a tar.zst of the same tree (uploaded to the
    same bucket beforehand) through the same proxy, streamed into
    ``zstd -dc | tar -x`` into an empty local dir, then the same read; the
    whole process timed (boto3, as the copy scripts casfs replaces use).
(c) **plain**: the same read job on a warm plain local dir.
(d) **fuse floor**: the same read job through the pyfuse3 floor (bench.floorfs:
    the tree in memory, nothing fetched, nothing verified), mounted afresh so the
    kernel knows none of its names: the least any pyfuse3 view can cost a first
    read of the tree, whatever the network. fuse mode's job cannot read faster;
    the JSON's ``fuse_floor_read_s`` and ``fuse_floor_over_copy_restore``.

Prints one JSON document: medians, every run's raw figures, requests by kind,
bytes, the casfs/copy-restore ratio, and where the time goes as the proxy saw
it (requests x RTT, the time some request was in flight, mean and peak
requests in flight, the first request's and last response's offsets from
launch). Speed goals are ratios here, never assertions in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
KERNELS = 600
SIZES = {"source": 6_000, "ttir": 14_000, "ttgir": 18_000, "llir": 36_000, "ptx": 30_000,
         "cubin": 22_000, "json": 2_000}  # + __grp__k.json: 8 files, ~128 KB a kernel
FILES_PER_KERNEL = len(SIZES) + 1
BUCKET = "casfs-net"
_WORDS = ["%0", "%1", "%arg0", "=", "tt.load", "tt.store", "arith.addf", "arith.mulf",
          "tt.splat", "tt.broadcast", "ld.global.f32", "st.global.f32", "mov.u32", "add.s32",
          "mad.lo.s32", "setp.lt.s32", "bra", "define", "void", "@kernel", "ptr",
          "addrspace(1)", "i32", "float", "getelementptr", "inbounds", "#blocked",
          "#triton_gpu.blocked<{sizePerThread", "[1],", "threadsPerWarp", "[32]}>", "%r1",
          "%rd1", "%f1", ";", "loc(#loc1)", "scf.for", "tt.reduce", "tt.dot"]


# --- the tree (stdlib only: the writer job imports this module) --------------

def _key(i: int) -> str:
    import base64
    import hashlib

    return base64.b32encode(hashlib.sha256(f"net:{i}".encode()).digest()).decode()[:52]


def _text(rng: random.Random, size: int, head: bytes) -> bytes:
    lines = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 10)))
             for _ in range(20)]
    out = [head.decode()]
    n, r = len(head), 0
    while n < size:
        ln = f"  {rng.choice(lines)} %r{r}\n"
        r += rng.randint(0, 3)
        out.append(ln)
        n += len(ln)
    return "".join(out).encode()[:size]


def _cubin(rng: random.Random, size: int, head: bytes) -> bytes:
    """16-byte instruction words from a small set, low-entropy operands (~5x with zstd)."""
    ops = [rng.randbytes(12) for _ in range(64)]
    out = bytearray(b"\x7fELF" + head)
    while len(out) < size:
        out += rng.choice(ops) + bytes([rng.randrange(8)]) + bytes(3)
    return bytes(out[:size])


def kernel_files(i: int, cache_dir: str) -> list[tuple[str, bytes]]:
    """(relative path, bytes) of kernel ``i``; the group file names its children under
    ``cache_dir`` by absolute path, as Triton's does."""
    key = _key(i)
    rng = random.Random(f"net:{i}")
    out, children = [], {}
    for ext, base in SIZES.items():
        size = max(64, int(base * rng.uniform(0.75, 1.25)))
        head = f"// {key}/k.{ext}\n".encode()
        data = _cubin(rng, size, head) if ext == "cubin" else _text(rng, size, head)
        if ext == "json":
            data = json.dumps({"name": "k", "hash": key, "pad": data.decode()[:size]}).encode()
        out.append((f"{key}/k.{ext}", data))
        children[f"k.{ext}"] = f"{cache_dir}/{key}/k.{ext}"
    out.append((f"{key}/__grp__k.json", json.dumps({"child_paths": children}).encode()))
    return out


def write_tree(dest: Path, kernels: int, start: int = 0) -> tuple[int, int]:
    """Write the tree as Triton's FileCacheManager.put does: each file into
    ``<KEY>/tmp.pid_<pid>_<id>/``, then ``os.replace``d into ``<KEY>/``, group last.
    Kernels ``start`` .. ``start + kernels - 1`` (a fleet's nodes each add their own)."""
    files = nbytes = 0
    for i in range(start, start + kernels):
        kf = kernel_files(i, str(dest))
        kdir = dest / kf[0][0].split("/")[0]
        kdir.mkdir(parents=True, exist_ok=True)
        tmp = kdir / f"tmp.pid_{os.getpid()}_{random.Random(i).getrandbits(64):016x}"
        tmp.mkdir()
        for rel, data in kf:
            t = tmp / rel.split("/")[1]
            t.write_bytes(data)
            os.replace(t, dest / rel)
            files += 1
            nbytes += len(data)
        tmp.rmdir()
    return files, nbytes


def read_tree(root: Path) -> dict[str, Any]:
    """Read every file under ``root``: (files, bytes, seconds) of the read alone."""
    mono0 = time.monotonic()  # CLOCK_MONOTONIC: comparable with the proxy's stamps
    t0 = time.perf_counter()
    files = nbytes = group_bytes = 0
    for dirpath, dirnames, names in os.walk(root):
        dirnames.sort()
        for n in sorted(names):
            with open(os.path.join(dirpath, n), "rb") as f:
                size = len(f.read())
            nbytes += size
            if n.startswith("__grp__"):  # holds the absolute paths it is served at
                group_bytes += size
            files += 1
    return {"files": files, "bytes": nbytes, "bytes_but_groups": nbytes - group_bytes,
            "read_s": round(time.perf_counter() - t0, 4), "mono": [mono0, time.monotonic()]}


def restore(endpoint: str, bucket: str, key: str, dest: Path) -> dict[str, Any]:
    """What a copy script does: one GET of a tar.zst streamed into ``zstd -dc | tar -x``
    (boto3, as such scripts use). bench/clients_net.py restores a client's cache so."""
    t0 = time.perf_counter()
    import boto3
    from botocore.config import Config

    t_import = time.perf_counter() - t0
    s3 = boto3.client("s3", endpoint_url=endpoint, config=Config(retries={"max_attempts": 1}))
    dest.mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen(f"zstd -q -dc | tar -C '{dest}' -xf -", shell=True,
                         stdin=subprocess.PIPE)
    assert p.stdin is not None
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    got = 0
    for chunk in body.iter_chunks(1 << 20):
        p.stdin.write(chunk)
        got += len(chunk)
    p.stdin.close()
    if p.wait() != 0:
        raise RuntimeError("zstd | tar failed")
    return {"import_s": round(t_import, 3), "restore_s": round(time.perf_counter() - t0, 3),
            "got_bytes": got}


def upload(srv: Any, path: Path, bucket: str, key: str) -> None:
    """``path`` into the bucket, straight to the server (tests/seaweed.py's; no delay)."""
    import boto3

    e = srv.env()
    boto3.client("s3", endpoint_url=srv.endpoint, aws_access_key_id=e["AWS_ACCESS_KEY_ID"],
                 aws_secret_access_key=e["AWS_SECRET_ACCESS_KEY"],
                 region_name="us-east-1").upload_file(str(path), bucket, key)


def _copy_restore_job(endpoint: str, key: str, dest: Path) -> dict[str, Any]:
    """The restore, then the read."""
    got = restore(endpoint, BUCKET, key, dest)
    out = read_tree(dest)
    out.update(got)
    return out


# --- the benchmark ------------------------------------------------------------

SCRIPT = str(Path(__file__).resolve())  # the jobs run this file as a script (stdlib only)


def _unmount_under(path: Path) -> None:
    """Lazily unmount anything a node left mounted under ``path`` (deepest first)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    prefix = str(path) + "/"
    mps = sorted((ln.split()[4] for ln in lines if ln.split()[4].startswith(prefix)),
                 key=len, reverse=True)
    for mp in mps:
        subprocess.run(["umount", "-l", mp], capture_output=True, check=False)


def _machine_busy() -> float:
    """Seconds the machine's CPUs were busy since boot (/proc/stat: all but idle, iowait)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(x) for x in fields]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


class _TreeCpu:
    """CPU of the processes whose command line names ``marker`` (a node's mount process
    and workers, which ``casfs run`` does not reap), sampled every 0.1 s until ``stop``;
    the bench's own children are left out (their CPU is in RUSAGE_CHILDREN)."""

    def __init__(self, marker: str) -> None:
        import threading

        self.marker = marker.encode()
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _sample(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        me = os.getpid()
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                if self.marker not in Path(f"/proc/{d}/cmdline").read_bytes():
                    continue
                f = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(f[1]) == me:
                continue
            self.seen[int(d)] = (int(f[11]) + int(f[12])) / tick

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            self._sample()

    def stop(self) -> float:
        self._stop.set()
        self._t.join()
        return sum(self.seen.values())


def _timeline(reqs: list[Any], t0: float, t1: float, rtt: float,
              job: tuple[float, float] | None = None) -> dict[str, Any]:
    """Where the time went as the proxy saw it (``job``: when the job's read began and
    ended, so requests split into set-up, the job's reads, and after)."""
    spans = sorted((r.start, r.end if r.end is not None else t1) for r in reqs)
    out = _spans(spans, rtt)
    if spans:
        out["first_request_after_s"] = round(spans[0][0] - t0, 3)
        out["last_response_before_end_s"] = round(t1 - max(e for _, e in spans), 3)
    if job is not None:
        j0, j1 = job
        out["phases"] = {
            "setup": {"s": round(j0 - t0, 3), **_spans([x for x in spans if x[0] < j0], rtt)},
            "job": {"s": round(j1 - j0, 3),
                    **_spans([x for x in spans if j0 <= x[0] < j1], rtt)},
            "after": {"s": round(t1 - j1, 3), **_spans([x for x in spans if x[0] >= j1], rtt)},
        }
    return out


def _spans(spans: list[tuple[float, float]], rtt: float) -> dict[str, Any]:
    """Requests, time some request was outstanding, concurrency of ``spans``."""
    busy, cur_s, cur_e = 0.0, None, 0.0
    for s, e in spans:
        if cur_s is None or s > cur_e:
            if cur_s is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_s is not None:
        busy += cur_e - cur_s
    total_latency = sum(e - s for s, e in spans)
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    peak = cur = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return {
        "requests": len(spans),
        "requests_x_rtt_s": round(len(spans) * rtt, 3),
        "in_flight_s": round(busy, 3),  # time at least one request was outstanding
        "mean_in_flight": round(total_latency / busy, 2) if busy else None,
        "peak_in_flight": peak,
        "serial_rtts": round(busy / rtt, 1) if rtt else None,  # in_flight_s in round trips
    }


class Bed:
    """SeaweedFS, the proxy, the generated tree and the tar.zst, in ``work``."""

    def __init__(self, work: Path, kernels: int, casfs_src: Path = REPO,
                 reader_args: tuple[str, ...] = ()) -> None:
        sys.path.insert(0, str(REPO / "tests"))
        from netem import NetProxy
        from seaweed import SeaweedServer

        self.work = work
        self.kernels = kernels
        self.casfs_src = casfs_src
        self.reader_args = reader_args  # the fresh node's casfs run options (--mode ...)
        self.srv = SeaweedServer(work / "weed")
        self.srv.start()
        self.srv.create_bucket(BUCKET)
        self.net = NetProxy(self.srv.port, delay=0.0, record=True).start()
        self.src = work / "plain" / "triton"
        self.files, self.nbytes = write_tree(self.src, kernels)
        self.nbytes_but_groups = read_tree(self.src)["bytes_but_groups"]
        archive = work / "tree.tar.zst"
        subprocess.run(f"tar -C '{self.src}' -cf - . | zstd -q -3 -T0 -o '{archive}'",
                       shell=True, check=True)
        self.archive_bytes = archive.stat().st_size
        upload(self.srv, archive, BUCKET, "copy/tree.tar.zst")
        archive.unlink()
        self.seq = 0
        # `casfs init` first, as docs say for S3: a node's first open of a root that does
        # not exist yet creates it, ~19 serial requests, and past ROOT_OPEN_TIMEOUT (3 s:
        # a loaded machine, or 200 ms RTT) that node serves local state only and its
        # job's files are not published (exit 0)
        subprocess.run([sys.executable, "-m", "casfs.cli.main", "init", self.env()["CASFS_ROOT"]],
                       env=self.env(), cwd=REPO, check=True, capture_output=True, timeout=300)

    def close(self) -> None:
        self.net.stop()
        self.srv.kill()

    def env(self, node: Path | None = None) -> dict[str, str]:
        env = dict(os.environ, **self.srv.env())
        env["AWS_ENDPOINT_URL"] = self.net.endpoint
        env["AWS_CONFIG_FILE"] = str(self.work / "no-aws-config")
        env["AWS_SHARED_CREDENTIALS_FILE"] = str(self.work / "no-aws-credentials")
        env["CASFS_ROOT"] = f"s3://{BUCKET}/root?endpoint={self.net.endpoint}"
        env["CASFS_SOCKET"] = str(self.work / "no-casfsd" / "casfsd.sock")
        env["PYTHONPATH"] = str(self.casfs_src)
        if node is not None:
            env.update(CASFS_STATE_DIR=str(node / "state"), CASFS_SERVE_BASE=str(node / "serve"),
                       CASFS_MOUNT_BASE=str(node / "mnt"))
        return env

    def _cpu(self) -> tuple[float, float, float, float]:
        """CPU seconds so far: reaped children (a node: casfs run, its mount process and
        workers, the job), this process (the proxy's thread; the rest waits), SeaweedFS,
        and the whole machine's busy time (/proc/stat: every process and kernel thread)."""
        from bench.common import proc_cpu

        ch = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert self.srv.proc is not None
        return (ch.ru_utime + ch.ru_stime, time.process_time(), proc_cpu(self.srv.proc.pid),
                _machine_busy())

    def _cpu_since(self, before: tuple[float, float, float, float]) -> dict[str, float]:
        now = self._cpu()
        out = {k: round(b - a, 2) for k, a, b in zip(("node", "proxy", "server", "machine"),
                                                     before, now, strict=True)}
        # The node's share of the machine's busy time: no process counted twice (the
        # per-process split below can be: overlay mode's mount process is both reaped by
        # casfs run and sampled by _TreeCpu), and its kernel threads' work included.
        out["node_machine"] = round(out["machine"] - out["proxy"] - out["server"], 2)
        return out

    def _casfs_run(self, node: Path, ns: str, job: list[str], report: Path,
                   extra: tuple[str, ...] = ()
                   ) -> tuple[subprocess.CompletedProcess[str], float, float, float]:
        cmd = [sys.executable, "-m", "casfs.cli.main", "run", "--family", "triton",
               "--namespace", ns, *extra,
               "--report", str(report), "--", *job]
        try:
            t0 = time.monotonic()
            p = subprocess.run(cmd, env=self.env(node), cwd=REPO, capture_output=True,
                               text=True, timeout=1800, check=False)
            t1 = time.monotonic()
        finally:
            _unmount_under(node)
        if p.returncode != 0:
            sys.stderr.write(p.stderr[-4000:])
            raise RuntimeError(f"casfs run exited {p.returncode}")
        return p, t0, t1, t1 - t0

    def publish(self) -> dict[str, Any]:
        """A writer job under casfs run writes the tree; casfs promotes and publishes it."""
        self.seq += 1
        ns = f"triton-net-{self.seq}"
        node = self.work / f"writer-{self.seq}"
        self.net.delay = 0.0
        self.net.reset_counts()
        job = [sys.executable, SCRIPT, "--write-tree-job", str(self.kernels)]
        _, _, _, wall = self._casfs_run(node, ns, job, node / "report.json")
        counts = self.net.reset_counts()
        report = json.loads((node / "report.json").read_text())
        promoted = sum(f.get("published", 0) for f in report.get("families", []))
        if promoted != self.files:
            raise RuntimeError(f"the writer's casfs run published {promoted} files, not "
                               f"{self.files}: {json.dumps(report)[:2000]}")
        shutil.rmtree(node, ignore_errors=True)
        return {"namespace": ns, "wall_s": round(wall, 3), "requests": _kinds(counts),
                "bytes_up": counts["bytes_up"], "report": report}

    def casfs_fresh_node(self, ns: str, delay: float) -> dict[str, Any]:
        node = self.work / f"reader-{ns}-{int(delay * 1e6)}"
        self.net.delay = delay
        self.net.reset_counts()
        job = [sys.executable, SCRIPT, "--read-tree-job"]
        cpu0 = self._cpu()
        tree = _TreeCpu(str(node))
        p, t0, t1, wall = self._casfs_run(node, ns, job, node / "report.json",
                                          self.reader_args)
        cpu = self._cpu_since(cpu0)
        cpu["casfs_run_and_job"] = cpu["node"]
        cpu["mount"] = round(tree.stop(), 2)
        cpu["node"] = round(cpu["node"] + cpu["mount"], 2)  # (see node_machine)
        counts, reqs = self.net.counts(), self.net.requests()
        self.net.reset_counts()
        self.net.delay = 0.0
        read = json.loads(p.stdout.strip().splitlines()[-1])
        report = json.loads((node / "report.json").read_text())
        shutil.rmtree(node, ignore_errors=True)
        if read["files"] != self.files or read["bytes_but_groups"] != self.nbytes_but_groups:
            raise RuntimeError(f"the fresh node read {read}, not {self.files} files, "
                               f"{self.nbytes_but_groups} bytes besides group files")
        return {"wall_s": round(wall, 3), "job": read, "requests": _kinds(counts), "cpu_s": cpu,
                "bytes_down": counts["bytes_down"], "bytes_up": counts["bytes_up"],
                "connections": counts["connections"],
                "files_per_request": round(self.files / max(1, counts["requests"]), 2),
                "where": _timeline(reqs, t0, t1, 2 * delay, tuple(read["mono"])),
                "report": _report_summary(report)}

    def copy_restore(self, delay: float) -> dict[str, Any]:
        dest = self.work / "restored"
        shutil.rmtree(dest, ignore_errors=True)
        self.net.delay = delay
        self.net.reset_counts()
        cpu0 = self._cpu()
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, SCRIPT, "--copy-restore-job",
                            self.net.endpoint, str(dest)], env=self.env(), cwd=REPO,
                           capture_output=True, text=True, timeout=900, check=False)
        wall = time.monotonic() - t0
        cpu = self._cpu_since(cpu0)
        counts = self.net.reset_counts()
        self.net.delay = 0.0
        shutil.rmtree(dest, ignore_errors=True)
        if p.returncode != 0:
            sys.stderr.write(p.stderr[-4000:])
            raise RuntimeError("copy-restore failed")
        job = json.loads(p.stdout.strip().splitlines()[-1])
        if job["files"] != self.files or job["bytes"] != self.nbytes:
            raise RuntimeError(f"copy-restore read {job}")
        return {"wall_s": round(wall, 3), "job": job, "requests": _kinds(counts), "cpu_s": cpu,
                "bytes_down": counts["bytes_down"]}

    def plain(self) -> dict[str, Any]:
        read_tree(self.src)  # warm
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, SCRIPT, "--read-tree-job",
                            str(self.src)], env=self.env(), cwd=REPO, capture_output=True,
                           text=True, timeout=300, check=True)
        wall = time.monotonic() - t0
        return {"wall_s": round(wall, 3), "job": json.loads(p.stdout.strip().splitlines()[-1])}

    def fuse_floor(self) -> dict[str, Any]:
        """The same job through a fresh pyfuse3 floor mount of the tree (d)."""
        from bench.mounts import floor_mounted

        mnt = self.work / "floor"
        with floor_mounted(self.src, mnt):
            t0 = time.monotonic()
            p = subprocess.run([sys.executable, SCRIPT, "--read-tree-job", str(mnt)],
                               env=self.env(), cwd=REPO, capture_output=True, text=True,
                               timeout=300, check=True)
            wall = time.monotonic() - t0
        return {"wall_s": round(wall, 3), "job": json.loads(p.stdout.strip().splitlines()[-1])}


def _kinds(counts: dict[str, int]) -> dict[str, int]:
    from netem import KINDS

    out = {k: counts[k] for k in KINDS if counts.get(k)}
    out["total"] = counts["requests"]
    for k in ("slowdown_503", "resets", "upstream_5xx"):
        if counts.get(k):
            out[k] = counts[k]
    return out


def _report_summary(report: Any) -> Any:
    """The casfs run report, minus nothing but bulky lists (kept small for the JSON)."""
    if isinstance(report, dict):
        return {k: _report_summary(v) for k, v in report.items()
                if not (isinstance(v, list) and len(v) > 20)}
    if isinstance(report, list):
        return [_report_summary(v) for v in report[:20]]
    return report


def _rev(src: Path) -> str:
    rev = src / "REVISION"  # a `git archive` export: written by whoever made it
    if rev.exists():
        return rev.read_text().strip()
    p = subprocess.run(["git", "-C", str(src), "describe", "--always", "--dirty"],
                       capture_output=True, text=True, check=False)
    return p.stdout.strip() or "unknown"


def _med(xs: list[float]) -> float:
    return round(statistics.median(xs), 3)


def measure(work: Path, runs: int, rtt_ms: float, kernels: int = KERNELS,
            casfs_src: Path = REPO, reader_args: tuple[str, ...] = ()) -> dict[str, Any]:
    delays = {f"{rtt_ms:g}ms": rtt_ms / 2000, "0.1ms": 0.0}
    from bench.common import scratch_fs, warn_scratch_fs  # (this file runs as the jobs too)

    t_start = time.perf_counter()
    fs = scratch_fs(work)  # where the nodes create their files: see scratch_fs
    warn_scratch_fs(fs)
    bed = Bed(work, kernels, casfs_src, reader_args)
    raw: dict[str, dict[str, list[Any]]] = {
        name: {"casfs": [], "copy_restore": [], "plain": [], "fuse_floor": [],
               "publish": []} for name in delays}
    try:
        for r in range(runs):
            for name, delay in delays.items():
                print(f"bench.network: run {r + 1}/{runs}, {name}: publish", file=sys.stderr,
                      flush=True)
                pub = bed.publish()
                raw[name]["publish"].append(pub)
                print(f"bench.network: run {r + 1}/{runs}, {name}: fresh node, copy-restore,"
                      " plain", file=sys.stderr, flush=True)
                raw[name]["casfs"].append(bed.casfs_fresh_node(pub["namespace"], delay))
                raw[name]["copy_restore"].append(bed.copy_restore(delay))
                raw[name]["plain"].append(bed.plain())
                raw[name]["fuse_floor"].append(bed.fuse_floor())
        summary: dict[str, Any] = {}
        for name, d in raw.items():
            c = _med([x["wall_s"] for x in d["casfs"]])
            cr = _med([x["wall_s"] for x in d["copy_restore"]])
            pl = _med([x["wall_s"] for x in d["plain"]])
            summary[name] = {
                "casfs_s": c, "copy_restore_s": cr, "plain_s": pl,
                "casfs_over_copy_restore": round(c / cr, 2),
                "casfs_over_plain": round(c / pl, 1),
                "casfs_read_s": _med([x["job"]["read_s"] for x in d["casfs"]]),
                "casfs_cpu_s": {k: _med([x["cpu_s"][k] for x in d["casfs"]])
                                for k in ("node", "node_machine", "casfs_run_and_job",
                                          "mount", "proxy", "server")},
                "copy_restore_cpu_s": {k: _med([x["cpu_s"][k] for x in d["copy_restore"]])
                                       for k in ("node", "node_machine", "proxy", "server")},
                "copy_restore_get_unpack_s": _med([x["job"]["restore_s"]
                                                   for x in d["copy_restore"]]),
                "plain_read_s": _med([x["job"]["read_s"] for x in d["plain"]]),
                "fuse_floor_read_s": _med([x["job"]["read_s"] for x in d["fuse_floor"]]),
                "fuse_floor_over_copy_restore": round(
                    _med([x["wall_s"] for x in d["fuse_floor"]]) / cr, 2),
                "casfs_requests": [x["requests"] for x in d["casfs"]],
                "casfs_files_per_request": [x["files_per_request"] for x in d["casfs"]],
                "casfs_bytes_down": [x["bytes_down"] for x in d["casfs"]],
                "casfs_where": [x["where"] for x in d["casfs"]],
                "copy_restore_requests": [x["requests"] for x in d["copy_restore"]],
                "copy_restore_bytes_down": [x["bytes_down"] for x in d["copy_restore"]],
                "publish_s": [x["wall_s"] for x in d["publish"]],
                "publish_requests": [x["requests"] for x in d["publish"]],
            }
    finally:
        bed.close()
    return {"casfs_src": str(casfs_src), "casfs_rev": _rev(casfs_src),
            "tree": {"kernels": kernels, "files": bed.files, "bytes": bed.nbytes,
                     "tar_zst_bytes": bed.archive_bytes},
            "runs": runs, "rtt_ms": rtt_ms, "cpus": os.cpu_count(),
            "reader_args": list(reader_args), "workdir_fs": fs,
            "loadavg_end": os.getloadavg()[0], "seconds": round(time.perf_counter() - t_start),
            "summary": summary, "raw": raw}


def run(s: Any) -> list[Any]:
    """bench/run's entry (opt-in: ``--only network``). On a journal-less ext4 (this VM's
    root) and as root, the nodes write on a journaled scratch ext4, as a node's disk."""
    from bench.common import Result, Target, bench_dir, scratch_fs

    parent = Path(s.workdir or tempfile.gettempdir())
    bare = scratch_fs(parent)
    journaled = bare["fstype"] == "ext4" and bare["journal"] is False and os.geteuid() == 0
    with bench_dir(parent, "casfs-bench-net-", journaled) as tmp:
        doc = measure(tmp, 1 if s.quick else 3, 20.0)
    out = []
    for name, v in doc["summary"].items():
        figs = {k: v[k] for k in ("casfs_s", "copy_restore_s", "plain_s",
                                  "fuse_floor_read_s")}
        figs["casfs_requests"] = statistics.median(x["total"] for x in v["casfs_requests"])
        figs["files"] = doc["tree"]["files"]
        figs["journaled"] = doc["workdir_fs"]["journal"]
        targets = [Target("casfs_over_copy_restore", 1.0)] if name != "0.1ms" else []
        out.append(Result("network", f"RTT {name}, {doc['tree']['files']} files", figs,
                          {"casfs_over_copy_restore": v["casfs_over_copy_restore"],
                           "fuse_floor_over_copy_restore": v["fuse_floor_over_copy_restore"]},
                          targets,
                          raw={"summary": v, "tree": doc["tree"]}))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.network", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one run")
    ap.add_argument("--rtt-ms", type=float, default=20.0)
    ap.add_argument("--kernels", type=int, default=KERNELS)
    ap.add_argument("--json", type=Path, help="also write the document here")
    ap.add_argument("--journaled-scratch", action="store_true",
                    help="run on a fresh journaled ext4, loop-mounted for the run (root), as"
                         " a node's disk: this VM's root ext4 has no journal (bench.common)")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--raw", action="store_true", help="print every run's figures too")
    ap.add_argument("--reader-args", default="", metavar="ARGS",
                    help="the fresh node's casfs run options, e.g. '--mode overlay"
                         " --wait-warm 60'")
    ap.add_argument("--casfs-src", type=Path, default=REPO,
                    help="run casfs from this source tree (default: this checkout)")
    # the jobs this benchmark runs (in child processes)
    ap.add_argument("--write-tree-job", type=int, metavar="KERNELS", help=argparse.SUPPRESS)
    ap.add_argument("--read-tree-job", nargs="?", const="", help=argparse.SUPPRESS)
    ap.add_argument("--copy-restore-job", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--restore-job", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.write_tree_job is not None:
        files, nbytes = write_tree(Path(os.environ["TRITON_CACHE_DIR"]), args.write_tree_job)
        print(json.dumps({"files": files, "bytes": nbytes}))
        return 0
    if args.read_tree_job is not None:
        print(json.dumps(read_tree(Path(args.read_tree_job or os.environ["TRITON_CACHE_DIR"]))))
        return 0
    if args.restore_job:  # ENDPOINT BUCKET KEY DEST
        endpoint, bucket, key, dest = args.restore_job
        print(json.dumps(restore(endpoint, bucket, key, Path(dest))))
        return 0
    if args.copy_restore_job:
        print(json.dumps(_copy_restore_job(args.copy_restore_job[0], "copy/tree.tar.zst",
                                           Path(args.copy_restore_job[1]))))
        return 0
    from bench.common import bench_dir

    with bench_dir(args.workdir, "casfs-bench-net-", args.journaled_scratch) as tmp:
        doc = measure(tmp, 1 if args.quick else args.runs, args.rtt_ms, args.kernels,
                      args.casfs_src.resolve(), tuple(shlex.split(args.reader_args)))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")  # with every run's figures
    if not args.raw:
        doc.pop("raw")
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
