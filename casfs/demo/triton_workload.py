"""Triton compilation (no GPU needed) as a probe of a TRITON_CACHE_DIR.

Usage: ``TRITON_CACHE_DIR=<dir> python -m casfs.demo.triton_workload --kernels 4 --json``

``triton.compile(ASTSource(...), target=GPUTarget("cuda", 80, 32))`` runs the
whole pipeline with the bundled ptxas and writes real kernel directories into
the cache; only launching would need a driver. Hits are counted by Triton's
own machinery (triton 3.7.1, compiler/compiler.py): the compilation listener
(``knobs.compilation.listener``) is told ``cache_hit=True`` exactly when
``FileCacheManager.get_group`` found the kernel's ``__grp__<name>.json`` and
its metadata child; a spy on ``FileCacheManager.put`` confirms that a hit
wrote nothing. Prints one JSON line: kernels, hits, misses, seconds and the
sha256 of every cubin, so a caller can check that a hit gave the bytes a
fresh compile gives.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from typing import Any

TARGET = ("cuda", 80, 32)
_BLOCKS = (64, 128, 256)


def _kernels() -> tuple[Any, Any]:
    import triton
    import triton.language as tl

    @triton.jit
    def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, SCALE: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * SCALE, mask=mask)

    @triton.jit
    def axpy_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr, ALPHA: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, ALPHA * x + y, mask=mask)

    return scale_kernel, axpy_kernel


def _sources(count: int) -> list[Any]:
    """``count`` distinct kernels: two sources, distinct constexpr values."""
    from triton.compiler import ASTSource

    scale_kernel, axpy_kernel = _kernels()
    scale_sig = {
        "x_ptr": "*fp32",
        "y_ptr": "*fp32",
        "n": "i32",
        "BLOCK": "constexpr",
        "SCALE": "constexpr",
    }
    axpy_sig = {
        "x_ptr": "*fp32",
        "y_ptr": "*fp32",
        "out_ptr": "*fp32",
        "n": "i32",
        "BLOCK": "constexpr",
        "ALPHA": "constexpr",
    }
    sources = []
    for i in range(count):
        block = _BLOCKS[i % len(_BLOCKS)]
        if i % 2 == 0:
            constexprs = {"BLOCK": block, "SCALE": i + 1}
            sources.append(ASTSource(scale_kernel, scale_sig, constexprs=constexprs))
        else:
            constexprs = {"BLOCK": block, "ALPHA": i + 1}
            sources.append(ASTSource(axpy_kernel, axpy_sig, constexprs=constexprs))
    return sources


def run(count: int) -> dict[str, Any]:
    t_start = time.perf_counter()
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime.cache import FileCacheManager

    events: list[bool] = []
    puts: list[str] = []
    original_put = FileCacheManager.put

    def spy_put(self: Any, data: Any, filename: str, binary: bool = True) -> str:
        puts.append(filename)
        return str(original_put(self, data, filename, binary))

    def listener(**kwargs: Any) -> None:
        events.append(bool(kwargs["cache_hit"]))

    FileCacheManager.put = spy_put
    knobs.compilation.listener = listener
    target = GPUTarget(*TARGET)
    per_kernel: list[dict[str, Any]] = []
    t_compile = time.perf_counter()
    try:
        for src in _sources(count):
            n_events, n_puts = len(events), len(puts)
            compiled = triton.compile(src, target=target)
            listener_hit = len(events) > n_events and events[-1]
            wrote = len(puts) - n_puts
            per_kernel.append(
                {
                    "name": src.name,
                    "hash": compiled.hash,
                    # A hit must also have written nothing: otherwise it was not served whole.
                    "hit": bool(listener_hit and wrote == 0),
                    "files_written": wrote,
                    "cubin_sha256": hashlib.sha256(compiled.asm["cubin"]).hexdigest(),
                }
            )
    finally:
        FileCacheManager.put = original_put
        knobs.compilation.listener = None
    t_end = time.perf_counter()
    hits = sum(1 for k in per_kernel if k["hit"])
    return {
        "workload": "triton",
        "kernels": count,
        "hits": hits,
        "misses": count - hits,
        "seconds": round(t_end - t_compile, 3),
        "import_seconds": round(t_compile - t_start, 3),
        "cubin_sha256s": [k["cubin_sha256"] for k in per_kernel],
        "per_kernel": per_kernel,
        "triton": triton.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m casfs.demo.triton_workload")
    parser.add_argument("--kernels", type=int, default=4, help="distinct kernels to compile")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args(argv)
    if args.kernels < 1:
        parser.error("--kernels must be at least 1")
    if not os.environ.get("TRITON_CACHE_DIR"):
        print(
            "error: TRITON_CACHE_DIR must be set to the cache directory to probe", file=sys.stderr
        )
        return 2
    t0 = time.perf_counter()
    result = run(args.kernels)
    result["total_seconds"] = round(time.perf_counter() - t0, 3)
    result["cache_dir"] = os.environ["TRITON_CACHE_DIR"]
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(
            f"triton: {result['kernels']} kernels, {result['hits']} hits, "
            f"{result['misses']} misses, {result['seconds']}s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
