"""TileLang's kernel cache (``TILELANG_CACHE_DIR``, default ``~/.tilelang/cache``).

Layout (tilelang/cache/kernel_cache.py): one directory per sha256 key with
``kernel.cu``, ``wrapped_kernel.cu``, ``kernel_lib.so`` and ``params.pkl``.
Temporary build files go to ``TILELANG_TMP_DIR``, not here; files written
through a temp name end in ``.tmp``.
"""

from __future__ import annotations

from casfs.families.base import Family, common_scratch


def is_scratch(name: str) -> bool:
    return name.endswith(".tmp") or common_scratch(name)


FAMILY = Family(
    name="tilelang",
    summary="TileLang compiled kernels (TILELANG_CACHE_DIR)",
    env_vars=("TILELANG_CACHE_DIR",),
    ingredients=("python", "platform", "arch", "libc", "torch", "tilelang", "cuda", "gpu",
                 "build_key"),
    scratch=is_scratch,
)
