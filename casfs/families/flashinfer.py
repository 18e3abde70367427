"""FlashInfer's JIT (``FLASHINFER_WORKSPACE_BASE``), flashinfer-python 0.2-0.5.

Layout (flashinfer/jit/env.py): ``<base>/.cache/flashinfer/<version>/<arch>/``
holding ``generated/<module>/`` (sources written only when they differ) and
``cached_ops/<module>/`` (``build.ninja``, ``*.o``, ``<module>.so``, built by
ninja under a ``FileLock``); downloaded cubins under ``.../cubins/``. The
version and the target architectures are in the path already.

Replaced paths: ninja's own state. ``build.ninja`` is rewritten when the
module's flags or sources change; ``.ninja_log`` and ``.ninja_deps`` are
rewritten by every ninja run, and without the newest ones ninja considers
the outputs dirty ("command line not found in log") and rebuilds.
"""

from __future__ import annotations

from casfs.families.base import NEWEST, Family, ReplacedPath, common_scratch

FAMILY = Family(
    name="flashinfer",
    summary="FlashInfer JIT-built CUDA modules (FLASHINFER_WORKSPACE_BASE)",
    env_vars=("FLASHINFER_WORKSPACE_BASE",),
    ingredients=("python", "platform", "arch", "libc", "torch", "flashinfer", "cuda", "gpu",
                 "build_key"),
    packages={"flashinfer": ("flashinfer-python", "flashinfer")},
    scratch=common_scratch,
    replaced=(
        ReplacedPath("*/cached_ops/*/build.ninja", NEWEST, "regenerated when flags change"),
        ReplacedPath("*/cached_ops/*/.ninja_log", NEWEST, "rewritten by every ninja run"),
        ReplacedPath("*/cached_ops/*/.ninja_deps", NEWEST, "rewritten by every ninja run"),
    ),
)
