"""The CuTe DSL (nvidia-cutlass-dsl) and FlashAttention's CuTe kernels.

``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR`` holds flash-attn's compiled CuTe
kernels; the cache is off unless ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``,
a companion that changes the library's behaviour, so opt-in.
``CUTE_DSL_CACHE_DIR`` is the DSL's own file cache (default
``$TMPDIR/<user>/cutlass_python_cache``): ``cute_dsl_<function>.mlir``
bytecode, written into ``tmp.pid_<pid>_<uuid4>/`` then ``os.replace``d into
place and the temp dir removed (cutlass/base_dsl/cache_helpers.py, 4.8.1),
so those temp dirs are scratch, as Triton's are.
"""

from __future__ import annotations

from casfs.families.base import Family, common_scratch


def is_scratch(name: str) -> bool:
    return name.startswith("tmp.pid_") or common_scratch(name)


FAMILY = Family(
    name="cutedsl",
    summary="CuTe DSL compiled kernels (FLASH_ATTENTION_CUTE_DSL_CACHE_DIR, CUTE_DSL_CACHE_DIR)",
    env_vars=("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "CUTE_DSL_CACHE_DIR"),
    companions={"FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1"},
    ingredients=("python", "platform", "arch", "libc", "torch", "cutlass_dsl", "flash_attn",
                 "cuda", "nvidia_driver", "gpu", "build_key"),
    packages={"cutlass_dsl": ("nvidia-cutlass-dsl",),
              "flash_attn": ("flash-attn-cute", "flash-attn", "flash_attn")},
    scratch=is_scratch,
)
