"""Each family says which entry a path belongs to (the unit of compile time saved)."""

from __future__ import annotations

import pytest

from casfs import families

KEY = "A" * 52
HEX = "0" * 64


@pytest.mark.parametrize(("family", "path", "entry"), [
    ("triton", KEY, KEY),
    ("triton", f"{KEY}/k.cubin", KEY),
    ("triton", f"{KEY}/__grp__k.json", KEY),
    ("triton", f"{KEY}/tmp.pid_1_2/k.cubin", KEY),
    ("triton", f"{HEX}/k.ptx", HEX),
    ("triton", "cuda_utils.so", None),
    ("inductor", "fxgraph/ab/fabc/0123", "fxgraph/ab/fabc"),
    ("inductor", "fxgraph/ab", None),
    ("inductor", "aotautograd/aabc/entry", "aotautograd/aabc"),
    ("inductor", f"triton/0/{KEY}/k.cubin", f"triton/0/{KEY}"),
    ("inductor", "triton/0", None),
    ("inductor", "xy/cxyz.py", "xy/cxyz"),
    ("inductor", "xy/cxyz.best_config", "xy/cxyz"),
    ("inductor", "xy/.123.456.tmp", None),
    ("inductor", "locks/x.lock", None),
    ("vllm", "torch_compile_cache/h/rank_0_0/backbone/vllm_compile_cache.py",
     "torch_compile_cache/h/rank_0_0/backbone"),
    ("vllm", "torch_compile_cache/h/rank_0_0/backbone/inductor_cache/fxgraph/ab/x/y",
     "torch_compile_cache/h/rank_0_0/backbone"),
    ("vllm", "torch_compile_cache/torch_aot_compile/h/rank_0_0/model",
     "torch_compile_cache/torch_aot_compile/h/rank_0_0"),
    ("vllm", "torch_compile_cache/h", None),
    ("generic", "some/file", "some/file"),
    ("generic", "some/file.lock", None),
    ("cuda", "index", "index"),
])
def test_entry_of(family: str, path: str, entry: str | None) -> None:
    assert families.rules(family).entry_of(path) == entry
