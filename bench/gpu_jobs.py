"""The jobs bench/gpu.py runs, each in a fresh process: ``python -m bench.gpu_jobs JOB``.

Each job reads its cache directory from the usual variable (set by the bench
for a plain directory, by ``casfs run`` for a casfs one), lists that directory
before and after (files it wrote = compiles), and prints one JSON line: its own
timings, the client's own hit/miss counters, output checksums and whether the
outputs equal a reference.

- ``triton``: a vector add, a fused softmax and a matmul with ``@triton.autotune``
  over four configs (``cache_results``: the chosen config is cached too), launched
  on the GPU and checked against torch. Hits are Triton's own
  (``knobs.compilation.listener``) and the files it ``put`` into its cache.
  ``--cpu`` compiles for sm_80 without launching (casfs.demo.triton_workload).
- ``inductor``: ``torch.compile`` of a small MLP (forward and backward) and an
  attention block (forward); torch's counters (``fxgraph_cache_hit``...).
  ``--mode max-autotune-no-cudagraphs``; ``--cpu`` compiles for the CPU.
- ``cuda``: runs PTX-only executables (``--bins a,b``): the driver JITs them for
  the GPU at load and keeps the result in ``CUDA_CACHE_PATH``. ``--fake`` stands in
  for the driver (same file pattern: an entry per module, the index rewritten in
  place) to test the flow without a GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_T0 = time.perf_counter()

# Only the local on-disk caches: remote caches off, as in casfs.demo.inductor_workload.
_TORCH_ENV = {
    "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
    "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "0",
    "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "0",
    "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE": "0",
    "TORCHINDUCTOR_BUNDLED_AUTOTUNE_REMOTE_CACHE": "0",
}


def snapshot(root: str | None) -> dict[str, tuple[int, int]]:
    """path -> (size, mtime_ns) of every file under ``root``."""
    out: dict[str, tuple[int, int]] = {}
    if not root or not os.path.isdir(root):
        return out
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns)
    return out


def changes(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
            ) -> dict[str, Any]:
    # Empty lock files (filelock leaves Inductor's behind even on a hit) are scratch.
    new = sorted(p for p in after if p not in before and not p.endswith(".lock"))
    changed = sorted(p for p in after if p in before and after[p] != before[p])
    return {"files_before": len(before), "files_after": len(after), "new_files": len(new),
            "changed_files": changed[:20], "new_sample": new[:8], "new_all": new}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def tensor_sha(t: Any) -> str:
    return sha(t.detach().contiguous().cpu().view(-1).view(__import__("torch").uint8)
               .numpy().tobytes())


# --- Triton ------------------------------------------------------------------------
def triton_job(cpu: bool) -> dict[str, Any]:
    if cpu:
        from casfs.demo.triton_workload import run

        r = run(6)
        return {"hits": r["hits"], "misses": r["misses"], "files_put": 0,
                "work_s": r["seconds"], "outputs": r["cubin_sha256s"], "ok": True}
    import torch
    import triton
    import triton.language as tl
    from triton import knobs
    from triton.runtime.cache import FileCacheManager

    events: list[bool] = []
    puts: list[str] = []
    original_put = FileCacheManager.put

    def spy_put(self: Any, data: Any, filename: str, binary: bool = True) -> str:
        puts.append(filename)
        return str(original_put(self, data, filename, binary))

    FileCacheManager.put = spy_put
    listens = hasattr(knobs.compilation, "listener")
    if listens:
        knobs.compilation.listener = lambda **kw: events.append(bool(kw["cache_hit"]))

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs,
                                                                            mask=mask), mask=mask)

    @triton.jit
    def softmax_kernel(out_ptr, in_ptr, stride, n_cols,  # type: ignore[no-untyped-def]
                       BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        x = tl.load(in_ptr + row * stride + cols, mask=cols < n_cols, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        num = tl.exp(x)
        tl.store(out_ptr + row * stride + cols, num / tl.sum(num, axis=0), mask=cols < n_cols)

    configs = [triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_warps=w, num_stages=s)
               for bm, bn, bk, w, s in ((128, 128, 64, 8, 3), (128, 64, 32, 4, 4),
                                        (64, 128, 32, 4, 4), (64, 64, 64, 4, 3))]

    # cache_results: the chosen config is cached too, so a warm node does not re-benchmark
    cache_results = "cache_results" in inspect.signature(triton.autotune).parameters
    tune: dict[str, Any] = {"cache_results": True} if cache_results else {}

    @triton.autotune(configs=configs, key=["M", "N", "K"], **tune)
    @triton.jit
    def matmul_kernel(a, b, c, M, N, K,  # type: ignore[no-untyped-def]
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pm, pn = tl.program_id(0), tl.program_id(1)
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            x = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
            y = tl.load(b + (k + rk)[:, None] * N + rn[None, :])
            acc += tl.dot(x, y)
        tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.float16))

    torch.manual_seed(0)
    dev = "cuda"
    n = 1 << 24
    x, y = torch.rand(n, device=dev), torch.rand(n, device=dev)
    s_in = torch.randn(4096, 1000, device=dev)
    m = 2048
    a = torch.randn(m, m, device=dev, dtype=torch.float16)
    b = torch.randn(m, m, device=dev, dtype=torch.float16)
    torch.cuda.synchronize()
    t_work = time.perf_counter()
    first: dict[str, float] = {}
    outs: dict[str, str] = {}
    ok: dict[str, bool] = {}

    def timed(name: str, fn: Any) -> Any:
        t = time.perf_counter()
        r = fn()
        torch.cuda.synchronize()
        first[name] = round(time.perf_counter() - t, 3)
        return r

    def add() -> Any:
        out = torch.empty_like(x)
        add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        return out

    def softmax() -> Any:
        out = torch.empty_like(s_in)
        softmax_kernel[(s_in.shape[0],)](out, s_in, s_in.stride(0), s_in.shape[1],
                                         BLOCK=triton.next_power_of_2(s_in.shape[1]))
        return out

    def matmul() -> Any:
        out = torch.empty(m, m, device=dev, dtype=torch.float16)
        grid = lambda meta: (m // meta["BM"], m // meta["BN"])  # noqa: E731
        matmul_kernel[grid](a, b, out, m, m, m)
        return out

    r_add = timed("add", add)
    r_sm = timed("softmax", softmax)
    r_mm = timed("matmul", matmul)
    work_s = time.perf_counter() - t_work
    FileCacheManager.put = original_put
    if listens:
        knobs.compilation.listener = None
    for name, got, ref, tol in (("add", r_add, x + y, 0.0),
                                ("softmax", r_sm, torch.softmax(s_in, dim=1), 1e-5),
                                ("matmul", r_mm, (a.float() @ b.float()).half(), 2e-2)):
        outs[name] = tensor_sha(got)
        ok[name] = bool(torch.allclose(got.float(), ref.float(), atol=tol * 4, rtol=tol))
    best = getattr(matmul_kernel, "best_config", None)
    return {"hits": sum(events) if listens else None,
            "misses": len(events) - sum(events) if listens else None, "files_put": len(puts),
            "autotune_cache_results": cache_results,
            "puts": sorted(set(p.rsplit(".", 1)[-1] for p in puts)),
            "first_call_s": first, "work_s": round(work_s, 3), "outputs": outs,
            "ok": all(ok.values()), "ok_per_kernel": ok, "matmul_config": str(best),
            "triton": triton.__version__}


# --- torch.compile ----------------------------------------------------------------
def _grad(w: Any) -> Any:
    assert w.grad is not None
    return w.grad.clone()


def best_configs(root: str | None) -> dict[str, int]:
    """Inductor's autotuning results in its cache: how many, how many by coordinate descent."""
    n = coordesc = 0
    for dirpath, _dirs, files in os.walk(root or "/nonexistent"):
        for name in files:
            if name.endswith(".best_config"):
                n += 1
                with open(os.path.join(dirpath, name), "rb") as f:
                    coordesc += b'"found_by_coordesc": true' in f.read()
    return {"best_configs": n, "found_by_coordesc": coordesc}


def inductor_job(cpu: bool, mode: str, coordesc: bool) -> dict[str, Any]:
    for k, v in _TORCH_ENV.items():
        os.environ.setdefault(k, v)
    if coordesc:  # what max-autotune modes turn on: a second save of each .best_config
        os.environ["TORCHINDUCTOR_COORDINATE_DESCENT_TUNING"] = "1"
    import torch
    from torch import nn
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    dev = "cpu" if cpu else "cuda"
    dt = torch.float32 if cpu else torch.float16
    d, hidden, batch, seq = (64, 256, 32, 16) if cpu else (1024, 4096, 1024, 512)

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(d)
            self.up = nn.Linear(d, hidden)
            self.down = nn.Linear(hidden, d)

        def forward(self, x: Any) -> Any:
            return x + self.down(nn.functional.gelu(self.up(self.norm(x))))

    class Attention(nn.Module):
        def __init__(self, heads: int = 8) -> None:
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(d, 3 * d)
            self.out = nn.Linear(d, d)

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).unbind(2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            w = (q @ k.transpose(-1, -2)) * (d // self.heads) ** -0.5
            w = w.masked_fill(torch.ones(s, s, device=x.device, dtype=torch.bool).triu(1),
                              float("-inf"))
            y = (torch.softmax(w.float(), dim=-1).to(x.dtype) @ v).transpose(1, 2)
            return self.out(y.reshape(b, s, d))

    mlp = MLP().to(dev, dt)
    attn = Attention().to(dev, dt).eval()
    x_mlp = torch.randn(batch, d, device=dev, dtype=dt)
    x_attn = torch.randn(batch // 64 if not cpu else 2, seq, d, device=dev, dtype=dt)
    ref_mlp = mlp(x_mlp)
    ref_mlp.float().square().mean().backward()
    ref_grad = _grad(mlp.up.weight)
    mlp.zero_grad()
    with torch.no_grad():
        ref_attn = attn(x_attn)
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    sync()
    kw: dict[str, Any] = {} if mode == "default" else {"mode": mode}
    c_mlp = torch.compile(mlp, **kw)
    c_attn = torch.compile(attn, **kw)
    first: dict[str, float] = {}
    t_work = time.perf_counter()

    t = time.perf_counter()
    out_mlp = c_mlp(x_mlp)
    out_mlp.float().square().mean().backward()
    sync()
    first["mlp_fwd_bwd"] = round(time.perf_counter() - t, 3)
    grad = _grad(mlp.up.weight)
    t = time.perf_counter()
    with torch.no_grad():
        out_attn = c_attn(x_attn)
    sync()
    first["attention"] = round(time.perf_counter() - t, 3)
    work_s = time.perf_counter() - t_work
    t = time.perf_counter()
    with torch.no_grad():
        c_attn(x_attn)
    sync()
    tol = 1e-3 if cpu else 3e-2
    ok = {"mlp": bool(torch.allclose(out_mlp.float(), ref_mlp.float(), atol=tol, rtol=tol)),
          "grad": bool(torch.allclose(grad.float(), ref_grad.float(), atol=tol, rtol=tol)),
          "attention": bool(torch.allclose(out_attn.float(), ref_attn.float(), atol=tol,
                                           rtol=tol))}
    cnt = {f"{group}.{k}": v for group in ("inductor", "aot_autograd")
           for k, v in counters[group].items() if "cache" in k}
    return {"hits": cnt.get("inductor.fxgraph_cache_hit", 0),
            "misses": cnt.get("inductor.fxgraph_cache_miss", 0), "counters": cnt,
            "first_call_s": first, "work_s": round(work_s, 3),
            "steady_call_s": round(time.perf_counter() - t, 4),
            "outputs": {"mlp": tensor_sha(out_mlp), "grad": tensor_sha(grad),
                        "attention": tensor_sha(out_attn)},
            "ok": all(ok.values()), "ok_per_output": ok, "torch": torch.__version__, "mode": mode,
            **best_configs(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))}


# --- the CUDA driver's ComputeCache ------------------------------------------------
def _fake_driver(cache: Path, module: str) -> dict[str, Any]:
    """What the driver does with CUDA_CACHE_PATH: an entry per module, the index rewritten."""
    key = hashlib.sha256(module.encode()).hexdigest()
    entry = cache / key[:2] / key[2:4] / key
    index = cache / "index"
    t = time.perf_counter()
    hit = entry.exists()
    if not hit:
        time.sleep(0.3)  # "JIT"
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_bytes(hashlib.sha512(module.encode()).digest() * 64)
        keys = set(index.read_text().split()) if index.exists() else set()
        with open(index, "a+") as f:  # rewritten in place, as the driver does
            f.seek(0)
            f.truncate()
            f.write("\n".join(sorted(keys | {key})) + "\n")
    return {"first_launch_s": round(time.perf_counter() - t, 3), "init_s": 0.0,
            "checksum": sha(module.encode()), "ok": True, "fake_hit": hit}


def cuda_job(bins: list[str], fake: bool) -> dict[str, Any]:
    cache = Path(os.environ["CUDA_CACHE_PATH"])
    cache.mkdir(parents=True, exist_ok=True)
    runs: dict[str, Any] = {}
    t_work = time.perf_counter()
    for b in bins:
        if fake:
            runs[Path(b).name] = _fake_driver(cache, Path(b).name)
            continue
        p = subprocess.run([b], capture_output=True, text=True, timeout=300, check=False)
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not line:
            raise RuntimeError(f"{b} failed ({p.returncode}): {p.stdout[-500:]}{p.stderr[-500:]}")
        runs[Path(b).name] = json.loads(line[-1])
    return {"runs": runs, "work_s": round(time.perf_counter() - t_work, 3),
            "first_launch_s": {k: v["first_launch_s"] for k, v in runs.items()},
            "outputs": {k: v["checksum"] for k, v in runs.items()},
            "ok": all(v["ok"] for v in runs.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_jobs")
    p.add_argument("job", choices=("triton", "inductor", "cuda"))
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--mode", default="default")
    p.add_argument("--bins", default="")
    p.add_argument("--fake", action="store_true")
    p.add_argument("--coordesc", action="store_true")
    a = p.parse_args(argv)
    var = {"triton": "TRITON_CACHE_DIR", "inductor": "TORCHINDUCTOR_CACHE_DIR",
           "cuda": "CUDA_CACHE_PATH"}[a.job]
    dirs = {v: os.environ.get(v) for v in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                                           "CUDA_CACHE_PATH") if os.environ.get(v)}
    before = {v: snapshot(d) for v, d in dirs.items()}
    if a.job == "triton":
        out = triton_job(a.cpu)
    elif a.job == "inductor":
        out = inductor_job(a.cpu, a.mode, a.coordesc)
    else:
        out = cuda_job([b for b in a.bins.split(",") if b], a.fake)
    out["job"] = a.job
    out["cache_var"] = var
    out["caches"] = {v: changes(before[v], snapshot(d)) for v, d in dirs.items()}
    if a.job == "cuda":  # the driver's own verdict is not visible: a new entry file is a JIT
        jits = sum(1 for p in out["caches"][var]["new_all"] if p != "index")
        out["hits"], out["misses"] = len(out["runs"]) - jits, jits
    for c in out["caches"].values():
        c.pop("new_all")
    out["process_s"] = round(time.perf_counter() - _T0, 3)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
