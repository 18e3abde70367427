"""FlashInfer, CUDA, CuTe DSL, DeepGEMM, TileLang and SGLang rules on their documented layouts.

None of these compiles here without a GPU driver (see docs/families.md), so
their rules are tested on the paths their sources write.
"""

from __future__ import annotations

import pytest

from casfs import families

WS = ".cache/flashinfer/0.7.2.post1/90a/cached_ops/batch_prefill_with_kv_cache_dtype_q_bf16"

CASES = [
    # (family, relative path, scratch?, replace rule kind or None)
    ("flashinfer", f"{WS}/batch_prefill.so", False, None),
    ("flashinfer", f"{WS}/batch_prefill.cuda.o", False, None),
    ("flashinfer", f"{WS}/build.ninja", False, "newest"),
    ("flashinfer", f"{WS}/.ninja_log", False, "newest"),
    ("flashinfer", f"{WS}/.ninja_deps", False, "newest"),
    ("flashinfer", ".cache/flashinfer/0.5.3/90a/generated/m/batch_prefill.cu", False, None),
    ("flashinfer", f"{WS}.lock", True, None),
    ("flashinfer", ".cache/flashinfer/0.7.2.post1/90a/flashinfer_jit.log", True, None),
    ("cuda", "index", False, "newest"),
    ("cuda", "a/3/8f1c2d0e9b7a6c5d", False, None),
    ("cutedsl", "fa_fwd_sm90_5c1e/kernel.cubin", False, None),
    ("cutedsl", "cute_dsl_host.mlir", False, None),
    ("cutedsl", "tmp.pid_4242_0b5c7e1e-2a43-4c4f-9d0b-3f1f7c1e9a11/cute_dsl_host.mlir", True, None),
    ("deepgemm", "cache/kernel.fp8_gemm.8a7b6c5d/kernel.cubin", False, None),
    ("deepgemm", "cache/kernel.fp8_gemm.8a7b6c5d/kernel.cu", False, None),
    ("deepgemm", "tmp/3b2a1c/kernel.cubin", True, None),
    ("deepgemm", "cache/kernel.gemm_fp8.6f1e/kernel.so", False, None),  # the 1.0 Python JIT
    ("deepgemm", "tmp/nvcc.tmp.0b5c7e1e-2a43-4c4f-9d0b-3f1f7c1e9a11.ab.so", True, None),
    ("tilelang", "4e5f6a7b/kernel_lib.so", False, None),
    ("tilelang", "4e5f6a7b/params.pkl", False, None),
    ("tilelang", "4e5f6a7b/kernel_lib.so.tmp", True, None),
    ("sglang", "torch_compile/ab12/fxgraph/cd/fcd/0a1b", False, None),
    ("sglang", "deep_gemm/tmp/x/kernel.cubin", True, None),
    ("sglang", "torch_compile/ab12/.123.456.tmp", True, None),
]


@pytest.mark.parametrize(("family", "relpath", "scratch", "rule"), CASES)
def test_layouts(family: str, relpath: str, scratch: bool, rule: str | None) -> None:
    rules = families.rules(family)
    assert rules.is_scratch(relpath) is scratch
    got = rules.replace_rule(relpath)
    assert (got.kind if got else None) == rule


def test_cuda_cache_is_keyed_by_driver_not_python() -> None:
    fam = families.get("cuda")
    assert {"nvidia_driver", "gpu"} <= set(fam.ingredients)
    assert "python" not in fam.ingredients and "torch" not in fam.ingredients


def test_companions() -> None:
    assert families.get("cutedsl").companions == {"FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1"}
    assert "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR" in families.get("cutedsl").env_vars
    assert families.get("flashinfer").package_dists("flashinfer")[0] == "flashinfer-python"
