"""torch.compile on CPU as a probe of a TORCHINDUCTOR_CACHE_DIR.

Usage: ``TORCHINDUCTOR_CACHE_DIR=<dir> python -m casfs.demo.inductor_workload --json``

Compiles a small model split into two graphs by a graph break, plus a third
standalone function, and prints one JSON line: wall seconds, the cache
counters torch keeps (``counters["inductor"]["fxgraph_cache_hit|miss|bypass"]``
in torch/_inductor/codecache.py and
``counters["aot_autograd"]["autograd_cache_hit|miss|bypass"]`` in
torch/_functorch/_aot_autograd/autograd_cache.py, torch 2.13) and a sha256
of the outputs. A cold run is all misses; a warm run in a fresh process on
the same directory must be all hits with the same checksum.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import warnings
from typing import Any

GRAPHS = 3
_SEED = 1234
_THREADS = 2

# Pinned so the probe measures the local on-disk caches and nothing else:
# both caches on, remote caches (which would need network) off.
_ENV = {
    "OMP_WAIT_POLICY": "PASSIVE",  # OpenMP spin-waits swing timings wildly on 2 cores
    "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
    "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "0",
    "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "0",
    "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE": "0",
    "TORCHINDUCTOR_BUNDLED_AUTOTUNE_REMOTE_CACHE": "0",
}

COUNTERS = {
    "fxgraph_cache_hit": ("inductor", "fxgraph_cache_hit"),
    "fxgraph_cache_miss": ("inductor", "fxgraph_cache_miss"),
    "fxgraph_cache_bypass": ("inductor", "fxgraph_cache_bypass"),
    "autograd_cache_hit": ("aot_autograd", "autograd_cache_hit"),
    "autograd_cache_miss": ("aot_autograd", "autograd_cache_miss"),
    "autograd_cache_bypass": ("aot_autograd", "autograd_cache_bypass"),
}


def _sha256(t: Any) -> str:
    # Raw float bytes, without numpy (not a torch dependency).
    import torch

    return hashlib.sha256(bytes(t.contiguous().view(torch.uint8).flatten().tolist())).hexdigest()


def run() -> dict[str, Any]:
    """Compile and run the model; the environment must already be set up."""
    t_start = time.perf_counter()
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch
    from torch import nn
    from torch._dynamo.utils import counters

    t_imported = time.perf_counter()
    torch.set_num_threads(_THREADS)
    torch.manual_seed(_SEED)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(64, 128)
            self.norm = nn.LayerNorm(128)
            self.fc2 = nn.Linear(128, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.nn.functional.gelu(self.norm(self.fc1(x)))
            torch._dynamo.graph_break()  # second graph, so the probe covers several entries
            return torch.softmax(self.fc2(h) * 0.5, dim=-1)

    def postprocess(y: torch.Tensor) -> torch.Tensor:
        return (y.cumsum(dim=-1) - y.mean(dim=0, keepdim=True)).tanh()

    model = Model().eval()
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(_SEED))
    compiled_model = torch.compile(model, dynamic=False)
    compiled_post = torch.compile(postprocess, dynamic=False)

    with torch.no_grad():
        expected = postprocess(model(x))
        t0 = time.perf_counter()
        out = compiled_post(compiled_model(x))
        t1 = time.perf_counter()
        again = compiled_post(compiled_model(x))

    result: dict[str, Any] = {
        "workload": "inductor",
        "graphs": GRAPHS,
        "import_seconds": round(t_imported - t_start, 3),
        "compile_seconds": round(t1 - t0, 3),
        "counters": {name: int(counters[group][key]) for name, (group, key) in COUNTERS.items()},
        "checksum": _sha256(out),
        "max_abs_err_vs_eager": float((out - expected).abs().max()),
        "stable": bool(torch.equal(out, again)),
        "torch": torch.__version__,
    }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m casfs.demo.inductor_workload")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args(argv)
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        print(
            "error: TORCHINDUCTOR_CACHE_DIR must be set to the cache directory to probe",
            file=sys.stderr,
        )
        return 2
    if "torch" in sys.modules:
        # The env pins below are read at import; too late to apply them.
        print("error: run this in a fresh process (torch already imported)", file=sys.stderr)
        return 2
    os.environ.update(_ENV)
    t0 = time.perf_counter()
    result = run()
    result["total_seconds"] = round(time.perf_counter() - t0, 3)
    result["cache_dir"] = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        c = result["counters"]
        print(
            f"inductor: compile {result['compile_seconds']}s, total {result['total_seconds']}s, "
            f"fxgraph hit/miss {c['fxgraph_cache_hit']}/{c['fxgraph_cache_miss']}, "
            f"aot hit/miss {c['autograd_cache_hit']}/{c['autograd_cache_miss']}, "
            f"checksum {result['checksum'][:16]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
