"""DeepGEMM's JIT (``DG_JIT_CACHE_DIR``; ``DG_CACHE_DIR`` in the 1.0 Python JIT).

Both default to ``~/.deep_gemm``. Layout: ``cache/kernel.<name>.<hash>/``
holding ``kernel.cu`` and the built ``kernel.cubin`` (C++ JIT) or
``kernel.so`` and ``kernel.args`` (1.0, deep_gemm/jit/compiler.py). Files
are written under ``tmp/`` (``file.tmp.<uuid>.<hash>``, ``nvcc.tmp.<uuid>...``)
and ``os.replace``d into the kernel directory, so ``tmp/`` is scratch and
every cache file is whole when it appears.

The ``deep-gemm`` entry on PyPI is that 1.0.0 sdist (February 2025, 19 KB,
no metadata): it lacks the CUDA headers and CUTLASS its JIT includes, so it
cannot build a kernel; DeepGEMM is installed from its repository. The rules
here follow both versions' sources.
"""

from __future__ import annotations

from casfs.families.base import Family, common_scratch


def is_scratch(name: str) -> bool:
    return name == "tmp" or common_scratch(name)


FAMILY = Family(
    name="deepgemm",
    summary="DeepGEMM JIT kernels (DG_JIT_CACHE_DIR)",
    env_vars=("DG_JIT_CACHE_DIR", "DG_CACHE_DIR"),
    ingredients=("python", "platform", "arch", "libc", "torch", "deep_gemm", "cuda", "gpu",
                 "build_key"),
    packages={"deep_gemm": ("deep-gemm", "deep_gemm")},
    scratch=is_scratch,
)
