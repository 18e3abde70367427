"""FlashInfer's JIT (``FLASHINFER_WORKSPACE_BASE``), flashinfer-python 0.2-0.7.

Layout (flashinfer/jit/env.py): ``<base>/.cache/flashinfer/<version>/<arch>/``
holding ``generated/<module>/`` (sources written only when they differ) and
``cached_ops/<module>/`` (``build.ninja``, ``*.o``, ``<module>.so``, built by
ninja under a ``FileLock``); downloaded cubins under ``.../cubins/``. The
version and the target architectures are in the path already. Checked with
0.7.2.post1: it compiles for a target architecture without a GPU
(``FLASHINFER_CUDA_ARCH_LIST=9.0a``, nvcc and headers from the
nvidia-cuda-* wheels, a stub ``libcuda.so`` to link against, as a CUDA
toolkit's ``lib64/stubs``), and a fresh node's build through casfs is a
ninja no-op (tests/clients/test_flashinfer.py).

Scratch: ``flashinfer_jit.log`` at the workspace top is appended by every
build of every process (a log, never read back); kept, it would be a
conflict on every publication.

Replaced paths: ninja's own state. ``build.ninja`` is rewritten when the
module's flags or sources change; ``.ninja_log`` and ``.ninja_deps`` are
rewritten by every ninja run, and without the newest ones ninja considers
the outputs dirty ("command line not found in log") and rebuilds.
"""

from __future__ import annotations

from casfs.families.base import NEWEST, Family, ReplacedPath, common_scratch


def is_scratch(name: str) -> bool:
    return name == "flashinfer_jit.log" or common_scratch(name)


FAMILY = Family(
    name="flashinfer",
    summary="FlashInfer JIT-built CUDA modules (FLASHINFER_WORKSPACE_BASE)",
    env_vars=("FLASHINFER_WORKSPACE_BASE",),
    ingredients=("python", "platform", "arch", "libc", "torch", "flashinfer", "cuda", "gpu",
                 "build_key"),
    packages={"flashinfer": ("flashinfer-python", "flashinfer")},
    scratch=is_scratch,
    replaced=(
        ReplacedPath("*/cached_ops/*/build.ninja", NEWEST, "regenerated when flags change"),
        ReplacedPath("*/cached_ops/*/.ninja_log", NEWEST, "rewritten by every ninja run"),
        ReplacedPath("*/cached_ops/*/.ninja_deps", NEWEST, "rewritten by every ninja run"),
    ),
)
