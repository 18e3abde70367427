"""DeepGEMM's JIT (``DG_JIT_CACHE_DIR``, default ``~/.deep_gemm``).

Layout: ``cache/kernel.<name>.<hash>/`` holding ``kernel.cu`` and
``kernel.cubin``; each kernel directory is built under ``tmp/`` and renamed
into ``cache/`` whole, so ``tmp/`` is scratch and a kernel directory is
complete when it appears.
"""

from __future__ import annotations

from casfs.families.base import Family, common_scratch


def is_scratch(name: str) -> bool:
    return name == "tmp" or common_scratch(name)


FAMILY = Family(
    name="deepgemm",
    summary="DeepGEMM JIT kernels (DG_JIT_CACHE_DIR)",
    env_vars=("DG_JIT_CACHE_DIR",),
    ingredients=("python", "platform", "arch", "libc", "torch", "deep_gemm", "cuda", "gpu",
                 "build_key"),
    packages={"deep_gemm": ("deep-gemm", "deep_gemm")},
    scratch=is_scratch,
)
