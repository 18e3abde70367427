"""SGLang's JIT cache root (``SGLANG_JIT_CACHE_ROOT``, default ``~/.cache/sglang``).

Layout: ``torch_compile/<hash>/`` (an Inductor cache with Triton inside) and
``deep_gemm/``, so Inductor's, Triton's and DeepGEMM's rules apply inside it.
``SGLANG_CACHE_DIR`` is what users ask for; both point here.
"""

from __future__ import annotations

from casfs.families.base import FULL_STACK, Family, common_scratch

FAMILY = Family(
    name="sglang",
    summary="SGLang torch.compile and DeepGEMM caches (SGLANG_JIT_CACHE_ROOT)",
    env_vars=("SGLANG_JIT_CACHE_ROOT", "SGLANG_CACHE_DIR"),
    ingredients=(*FULL_STACK[:-1], "sglang", "build_key"),
    scratch=common_scratch,
    includes=("inductor", "deepgemm"),
)
