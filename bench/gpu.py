"""Real GPU JIT clients through ``casfs run``: ``python -m bench.gpu --out FILE``.

Needs a CUDA GPU (exits with one line when there is none; ``--cpu-smoke`` runs
the same flow with torch.compile on the CPU and a stand-in for the driver's
cache, to catch bugs before spending GPU time). Not a test: bench/ is never
collected by pytest. Each workload (bench/gpu_jobs.py) runs as a fresh process:

- plain: cold then warm on a plain local directory (the baseline);
- casfs: ``casfs run --mode dir`` (no FUSE needed) with one shared CASFS_ROOT
  per workload and a node state dir per node: node A compiles cold and
  publishes, node B is a fresh node (empty state dir and cache directory) that
  must hit. For the CUDA driver's ComputeCache (family ``cuda``), node A runs one
  PTX-only program, node B that one and a second (the driver rewrites its
  ``index``: a replaced path), node C both: no JIT left.

Every job reports the client's own counters (Triton's listener and cache
writes, torch's ``fxgraph_cache_hit``...), the files it added to its cache
directory, output checksums (equal across nodes) and a check against a
reference. The JSON holds everything; ``summary`` holds the ratios
(docs/performance.md "On a GPU").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PY = sys.executable
REPO = Path(__file__).resolve().parents[1]
CACHE_VARS = {"triton": "TRITON_CACHE_DIR", "inductor": "TORCHINDUCTOR_CACHE_DIR",
              "cuda": "CUDA_CACHE_PATH"}
# Rough cold+warm seconds of each section on an H200 (a section is skipped when the
# budget left is smaller: the JSON says so).
ESTIMATE = {"cuda": 30, "triton": 40, "inductor": 80, "inductor-coordesc": 100,
            "inductor-max": 250}
KERNELS, ROUNDS, N = 48, 256, 4096


def log(msg: str) -> None:
    print(f"[gpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- the PTX-only programs (CUDA ComputeCache) ---------------------------------------
def cuda_source(salt: int) -> str:
    """KERNELS kernels of fully unrolled integer mixing: enough PTX that its JIT shows."""
    mix = ("__host__ __device__ inline unsigned mix(unsigned x, unsigned c) {\n"
           "  x ^= x >> 16; x *= 0x7feb352du + c; x ^= x >> 15; x *= 0x846ca68bu;"
           " x ^= x >> 16; return x; }\n")
    body = []
    for i in range(KERNELS):
        body.append(
            f"__global__ void k{i}(unsigned* out) {{\n"
            f"  unsigned t = blockIdx.x * blockDim.x + threadIdx.x;\n"
            f"  unsigned x = t * {2 * i + 1}u + {salt}u;\n"
            f"  #pragma unroll\n"
            f"  for (unsigned r = 0; r < {ROUNDS}u; r++) x = mix(x, r * {i + 7}u + {salt}u);\n"
            f"  out[{i} * {N} + t] = x; }}\n")
    launches = "".join(f"  k{i}<<<{N // 256}, 256>>>(d);\n" for i in range(KERNELS))
    return f"""#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>
{mix}{"".join(body)}
static double now() {{ return std::chrono::duration<double>(
    std::chrono::steady_clock::now().time_since_epoch()).count(); }}
static void launch(unsigned* d) {{
{launches}}}
int main() {{
  double t0 = now();
  cudaFree(0);
  double t1 = now();
  unsigned* d; cudaMalloc(&d, {KERNELS} * {N} * sizeof(unsigned));
  double t2 = now();
  launch(d);
  cudaError_t e = cudaDeviceSynchronize();
  double t3 = now();
  launch(d);
  cudaDeviceSynchronize();
  double t4 = now();
  static unsigned h[{KERNELS} * {N}];
  cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
  bool ok = e == cudaSuccess;
  unsigned sum = 2166136261u;
  for (unsigned i = 0; i < {KERNELS}; i++)
    for (unsigned t = 0; t < {N}; t++) {{
      unsigned x = t * (2 * i + 1) + {salt}u;
      for (unsigned r = 0; r < {ROUNDS}u; r++) x = mix(x, r * (i + 7) + {salt}u);
      ok = ok && h[i * {N} + t] == x;
      sum = (sum ^ h[i * {N} + t]) * 16777619u;
    }}
  printf("{{\\"init_s\\": %.4f, \\"first_launch_s\\": %.4f, \\"second_launch_s\\": %.4f, "
         "\\"ok\\": %s, \\"checksum\\": \\"%08x\\", \\"error\\": \\"%s\\"}}\\n",
         t1 - t0, t3 - t2, t4 - t3, ok ? "true" : "false", sum, cudaGetErrorString(e));
  return ok ? 0 : 1;
}}
"""


def build_cuda(work: Path) -> tuple[list[str], dict[str, Any]]:
    """Two PTX-only executables (compute_80 PTX, no SASS): the driver must JIT them."""
    bins: list[str] = []
    info: dict[str, Any] = {}
    procs = []
    for salt in (1, 2):
        src = work / f"jit{salt}.cu"
        src.write_text(cuda_source(salt))
        out = work / f"jit{salt}"
        cmd = ["nvcc", "-O3", "-gencode", "arch=compute_80,code=compute_80", "-o", str(out),
               str(src)]
        procs.append((out, subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True)))
    t = time.perf_counter()
    for out, p in procs:
        text, _ = p.communicate(timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"nvcc failed: {text[-1000:]}")
        bins.append(str(out))
    info["nvcc_build_s"] = round(time.perf_counter() - t, 2)
    if shutil.which("cuobjdump"):  # shows PTX only, no ELF (SASS) in the binary
        dump = subprocess.run(["cuobjdump", "--list-ptx", "--list-elf", bins[0]],
                              capture_output=True, text=True, check=False)
        info["cuobjdump"] = (dump.stdout + dump.stderr).strip()[:400]
    return bins, info


# --- running jobs --------------------------------------------------------------------
def _job_json(stdout: str) -> dict[str, Any]:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError("the job printed no JSON line")
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def _base_env() -> dict[str, str]:
    env = dict(os.environ)
    for v in (*CACHE_VARS.values(), "CASFS_ROOT", "CASFS_STATE_DIR", "CASFS_MOUNT_BASE"):
        env.pop(v, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def plain_job(job: list[str], families: list[str], cache: Path) -> dict[str, Any]:
    env = _base_env()
    for f in families:
        (cache / f).mkdir(parents=True, exist_ok=True)
        env[CACHE_VARS[f]] = str(cache / f)
    t = time.perf_counter()
    p = subprocess.run([PY, "-m", "bench.gpu_jobs", *job], env=env, capture_output=True,
                       text=True, timeout=900, check=False)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"job {job} failed ({p.returncode}): {p.stderr[-3000:]}")
    out = _job_json(p.stdout)
    out["wall_s"] = round(wall, 3)
    return out


def casfs_job(job: list[str], families: list[str], work: Path, root: Path, node: str
              ) -> dict[str, Any]:
    """One job through ``casfs run --mode dir`` on node ``node`` (a fresh cache directory)."""
    mnt = work / "mnt"
    shutil.rmtree(mnt, ignore_errors=True)  # a fresh node: nothing on its local disk
    env = _base_env()
    env.update(CASFS_ROOT=str(root), CASFS_STATE_DIR=str(work / f"node-{node}"),
               CASFS_MOUNT_BASE=str(mnt))
    report = work / f"report-{node}.json"
    cmd = [PY, "-m", "casfs.cli.main", "run", "--mode", "dir", "--family", ",".join(families),
           "--python", PY, "--stable-after", "0.5", "--report", str(report), "--",
           PY, "-m", "bench.gpu_jobs", *job]
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"casfs run {job} on node {node} failed ({p.returncode}): "
                           f"{p.stdout[-1500:]} {p.stderr[-3000:]}")
    out = _job_json(p.stdout)
    rep = json.loads(report.read_text())
    out["wall_s"] = round(wall, 3)
    out["casfs"] = {"timings": rep["timings"], "families": rep["families"],
                    "stderr": [ln for ln in p.stderr.splitlines() if ln.startswith("casfs:")]}
    if "private" in p.stderr or not all(f["served"] for f in rep["families"]):
        out["casfs"]["NOT_SERVED"] = True
    return out


def _r(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def summarize(runs: dict[str, dict[str, Any]], warm_node: str) -> dict[str, Any]:
    """The ratios: cold vs warm, and casfs on a fresh node vs plain warm."""
    a, w = runs["casfs_a"], runs[warm_node]
    pc, pw = runs.get("plain_cold", a), runs["plain_warm"]  # one_cold: node A is the cold run
    ct = w["casfs"]["timings"]
    outs = {k: r.get("outputs") for k, r in runs.items()}
    same = len({json.dumps(o, sort_keys=True) for o in outs.values()}) == 1
    return {
        "plain_cold_work_s": pc["work_s"], "plain_warm_work_s": pw["work_s"],
        "casfs_cold_work_s": a["work_s"], "casfs_warm_work_s": w["work_s"],
        "plain_cold_process_s": pc["process_s"], "plain_warm_process_s": pw["process_s"],
        "casfs_warm_process_s": w["process_s"],
        "casfs_warm_setup_s": ct["setup_s"], "casfs_warm_publish_s": ct["publish_s"],
        "cold_over_warm_plain": _r(pc["work_s"], pw["work_s"]),
        "casfs_warm_over_plain_warm_work": _r(w["work_s"], pw["work_s"]),
        "casfs_warm_over_plain_warm_process": _r(w["process_s"], pw["process_s"]),
        "casfs_warm_with_setup_over_plain_warm": _r(
            w["process_s"] + ct["setup_s"] + ct["publish_s"], pw["process_s"]),
        "casfs_cold_over_plain_cold_work": _r(a["work_s"], pc["work_s"]),
        "hits_misses": {k: (r.get("hits"), r.get("misses")) for k, r in runs.items()},
        "new_cache_files": {k: sum(c["new_files"] for c in r["caches"].values())
                            for k, r in runs.items()},
        "casfs_conflicts": {k: sum(f["conflicts"] for f in r["casfs"]["families"])
                            for k, r in runs.items() if "casfs" in r},
        "outputs_equal_everywhere": same,
        "outputs_match_reference": all(r.get("ok") for r in runs.values()),
    }


def section(name: str, job: list[str], families: list[str], work: Path,
            nodes: dict[str, list[str]] | None = None, one_cold: bool = False
            ) -> dict[str, Any]:
    """plain cold, plain warm, then casfs nodes A (cold), B (fresh), ... in that order.

    ``one_cold`` (for the slowest cold compile): node A's run is the only cold one;
    the plain warm baseline runs on a copy of node A's directory (``cp -a``).
    """
    w = work / name
    w.mkdir(parents=True)
    root = w / "root"
    runs: dict[str, dict[str, Any]] = {}
    nodes = nodes or {"a": job, "b": job}
    if not one_cold:
        log(f"{name}: plain cold")
        runs["plain_cold"] = plain_job(job, families, w / "plain")
    for node, node_job in nodes.items():
        if node != "a" and "plain_warm" not in runs:
            if one_cold:  # node A's directory, still in place, copied as a plain cache
                for f in runs["casfs_a"]["casfs"]["families"]:
                    src = next((w / "mnt").glob(f"*/*/{f['namespace']}"))
                    shutil.copytree(src, w / "plain" / f["family"], symlinks=True)
            log(f"{name}: plain warm")
            runs["plain_warm"] = plain_job(job, families, w / "plain")
        log(f"{name}: casfs node {node.upper()}")
        runs[f"casfs_{node}"] = casfs_job(node_job, families, w, root, node)
    return {"runs": runs, "published": published(root), "one_cold": one_cold}


def published(root: Path) -> dict[str, Any]:
    """Per namespace: each generation's entry count and its replaced entries' digests."""
    from casfs.store.root import SharedRoot

    if not (root / "casfs.json").exists():
        return {}
    gens = SharedRoot.open(root).generations()
    out: dict[str, Any] = {}
    for ns in gens.namespaces():
        rows = []
        for seq in gens.seqs(ns):
            snap = gens.entries(ns, seq)
            ents = list(snap.entries.values()) if isinstance(snap.entries, dict) else []
            rows.append({"seq": seq, "entries": len(ents), "replaced": {
                e.path: e.digest[:12] for e in ents if (e.extras or {}).get("replace")}})
        out[ns] = rows
    return out


def env_info(cpu: bool) -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count(),
                            "kernel": platform.release(), "dev_fuse": os.path.exists("/dev/fuse"),
                            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    # CASFS_REV first: a copy of casfs/ run from inside another checkout reports that one.
    info["casfs_rev"] = os.environ.get("CASFS_REV") or subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
        text=True, check=False).stdout.strip() or None
    import torch

    info["torch"] = torch.__version__
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if not cpu:
        info["gpu"] = torch.cuda.get_device_name()
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False)
        info["driver"] = smi.stdout.strip()
    return info


def no_gpu_reason() -> str | None:
    import warnings

    try:
        with warnings.catch_warnings():  # e.g. torch without numpy: the reason stays one line
            warnings.simplefilter("ignore")
            import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU here (torch.cuda.is_available() is False)"
    if shutil.which("nvcc") is None:
        return "nvcc is not on the PATH (the CUDA ComputeCache workload builds with it)"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="write the JSON here")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="the same flow without a GPU: torch.compile on CPU, Triton compiling "
                        "for sm_80, a stand-in for the driver's cache")
    p.add_argument("--only", default="cuda,triton,inductor,inductor-coordesc,inductor-max",
                   help="comma list of sections (default: all)")
    p.add_argument("--budget", type=float, default=1e9,
                   help="seconds: a section that would not fit in what is left is skipped")
    p.add_argument("--workdir", type=Path, help="default: a temp dir, removed at the end")
    a = p.parse_args(argv)
    cpu = a.cpu_smoke
    if not cpu and (why := no_gpu_reason()) is not None:
        print(f"bench.gpu: {why}; --cpu-smoke runs the flow without a GPU", file=sys.stderr)
        return 2
    t_start = time.monotonic()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="casfs-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"bench": "gpu", "cpu_smoke": cpu, "env": env_info(cpu),
                           "sections": {}, "summary": {}, "skipped": [], "errors": {}}

    def save() -> None:
        doc["elapsed_s"] = round(time.monotonic() - t_start, 1)
        tmp = a.out.with_name(a.out.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(a.out)

    xcpu = ["--cpu"] if cpu else []
    try:
        for name in [s.strip() for s in a.only.split(",") if s.strip()]:
            left = a.budget - (time.monotonic() - t_start)
            if left < ESTIMATE.get(name, 60):
                log(f"{name}: skipped ({left:.0f} s of budget left)")
                doc["skipped"].append(name)
                continue
            try:
                if name == "cuda":
                    if cpu:
                        bins = [str(work / "jit1"), str(work / "jit2")]
                        doc["cuda_build"] = {"fake_driver": True}
                    else:
                        bins, doc["cuda_build"] = build_cuda(work)
                    one = ["cuda", "--bins", bins[0], *(["--fake"] if cpu else [])]
                    both = ["cuda", "--bins", ",".join(bins), *(["--fake"] if cpu else [])]
                    s = section(name, one, ["cuda"], work, {"a": one, "b": both, "c": both})
                    s["summary"] = summarize(s["runs"], "casfs_c")
                    # outputs differ by design (B and C run two programs): compare jit1's
                    s["summary"]["outputs_equal_everywhere"] = len(
                        {r["outputs"][Path(bins[0]).name] for r in s["runs"].values()}) == 1
                elif name == "triton":
                    s = section(name, ["triton", *xcpu], ["triton"], work)
                    s["summary"] = summarize(s["runs"], "casfs_b")
                elif name in ("inductor", "inductor-coordesc", "inductor-max"):
                    mode = "max-autotune-no-cudagraphs" if name == "inductor-max" else "default"
                    if cpu and name == "inductor-max":
                        doc["skipped"].append(name)
                        continue
                    job = ["inductor", "--mode", mode, *xcpu]
                    if name == "inductor-coordesc":  # default mode + coordinate descent
                        job.append("--coordesc")
                    nodes = {"a": job, "b": job, "c": job} if name == "inductor-coordesc" else None
                    s = section(name, job, ["inductor", "triton"], work, nodes,
                                one_cold=name == "inductor-max")
                    s["summary"] = summarize(s["runs"], "casfs_b")
                else:
                    raise ValueError(f"unknown section {name}")
                doc["sections"][name] = s
                doc["summary"][name] = s["summary"]
                log(f"{name}: {json.dumps(s['summary'])}")
            except Exception as e:  # one failing section must not lose the others' figures
                log(f"{name}: FAILED: {e}")
                doc["errors"][name] = str(e)[-4000:]
            save()
    finally:
        save()
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(doc["summary"], indent=1))
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
