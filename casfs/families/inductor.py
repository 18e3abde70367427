"""TorchInductor (``TORCHINDUCTOR_CACHE_DIR``), torch 2.x.

Layout: two-character shard dirs of generated ``.py``/``.cpp``/``.so``,
``fxgraph/``, ``aotautograd/``, and a Triton cache under ``triton/<dev>/``
(hence ``includes=("triton",)``). Scratch names, each where torch makes it:

- ``.<pid>.<tid>.tmp``: codecache.py ``write_atomic`` writes its temp file
  beside the target, then renames it;
- ``locks/``: codecache.py ``get_lock_dir()`` (filelock ``*.lock`` files
  live there, under ``precompiled_headers/locks/`` and beside directories);
- ``*_CxxBuild/``: cpp_builder.py runs g++ with its working directory in
  ``f"{name}_CxxBuild"``, removed after;
- ``tmp.<uuid4>/``: triton_bundler.py writes bundled kernels to
  ``triton/<dev>/tmp.<uuid4>/`` and renames it onto ``<KEY>``; on failure the
  temp dir stays behind.

Replaced: ``<shard>/<key>.best_config`` (runtime/autotune_cache.py), the
config a Triton kernel's runtime autotuning picked. With coordinate descent
on (``max-autotune*`` modes, ``coordinate_descent_tuning``) it is saved twice:
the autotuning winner, then the coordinate-descent winner seconds later.
First-writer-wins published the first and counted the second a conflict: on
an H200 a fresh node then re-tuned 4 kernels that a plain warm cache did not
(docs/performance.md "On a GPU"). So the newest version wins.
"""

from __future__ import annotations

import re

from casfs.families import triton
from casfs.families.base import NEWEST, UUID4, Family, ReplacedPath, common_scratch

_BUNDLER_TMP_RE = re.compile(rf"tmp\.{UUID4}")


def is_scratch(name: str) -> bool:
    return (
        (name.startswith(".") and name.endswith(".tmp"))
        or name == "locks"
        or name.endswith("_CxxBuild")
        or (name.startswith("tmp.") and _BUNDLER_TMP_RE.fullmatch(name) is not None)
        or common_scratch(name)
    )


_SHARD_RE = re.compile(r"[0-9a-z]{2}")


def entry_of(relpath: str) -> str | None:
    """The entry a path belongs to: ``fxgraph/<xx>/<key>`` (an FX graph),
    ``aotautograd/<key>``, ``triton/<dev>/<KEY>`` (a Triton kernel), and a
    generated module's files ``<xx>/<name>.*`` (``.py``, ``.so``,
    ``.best_config``...: ``<xx>/<name>``); None for the directories above them."""
    parts = relpath.split("/")
    top = parts[0]
    if top == "fxgraph":
        return "/".join(parts[:3]) if len(parts) >= 3 else None
    if top == "aotautograd":
        return "/".join(parts[:2]) if len(parts) >= 2 else None
    if top == "triton":
        if len(parts) < 3:
            return None
        key = triton.entry_of("/".join(parts[2:]))
        return f"triton/{parts[1]}/{key}" if key is not None else None
    if len(parts) == 2 and _SHARD_RE.fullmatch(top) and not is_scratch(parts[1]):
        return f"{top}/{parts[1].partition('.')[0]}"
    return None


FAMILY = Family(
    name="inductor",
    summary="TorchInductor FX-graph, AOTAutograd and generated code (TORCHINDUCTOR_CACHE_DIR)",
    env_vars=("TORCHINDUCTOR_CACHE_DIR",),
    scratch=is_scratch,
    replaced=(ReplacedPath("*.best_config", NEWEST,
                           "runtime autotuning saves, then coordinate descent saves again"),),
    includes=("triton",),
    entry_of=entry_of,
)
