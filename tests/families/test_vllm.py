"""vLLM family: the index merges, the AOT artifact is newest-wins, the rest first-writer."""

from __future__ import annotations

import ast
import os
import pprint
import subprocess
import sys
from pathlib import Path

import pytest

from casfs import families
from casfs.families.vllm import merge_dict_literal

RANK = "torch_compile_cache/3f2a1b0c9d/rank_0_0/backbone"


def _index(d: dict[object, object]) -> bytes:
    return pprint.PrettyPrinter(indent=4).pformat(d).encode()  # as vLLM writes it


def test_replaced_paths() -> None:
    rules = families.rules("vllm")
    index = rules.replace_rule(f"{RANK}/vllm_compile_cache.py")
    assert index is not None and index.kind == "merge"
    aot = rules.replace_rule("torch_compile_cache/torch_aot_compile/9a8b/rank_0_0/model")
    assert aot is not None and aot.kind == "newest"
    # Inductor artifacts inside vLLM's cache stay first-writer-wins.
    assert rules.replace_rule(f"{RANK}/inductor_cache/ab/cabc.py") is None
    assert rules.replace_rule("torch_compile_cache/x/rank_0_0/backbone/computation_graph.py") \
        is None
    assert rules.is_scratch(f"{RANK}/inductor_cache/locks/x.lock")
    assert rules.is_commit_record(f"{RANK}/triton_cache/K/__grp__k.json")


def test_merge_is_union_newest_per_key() -> None:
    old = {("(1, 8)", 0, "inductor"): ("h1", "/a/x.py"), ("(1, 8)", 1, "inductor"): 1}
    new = {("(1, 8)", 0, "inductor"): ("h2", "/b/x.py"), ("(9, 16)", 0, "inductor"): 3}
    merged = merge_dict_literal(_index(old), _index(new))
    assert merged is not None
    got = ast.literal_eval(merged.decode())
    assert got == {("(1, 8)", 0, "inductor"): ("h2", "/b/x.py"), ("(1, 8)", 1, "inductor"): 1,
                   ("(9, 16)", 0, "inductor"): 3}


def test_merge_refuses_what_is_not_a_dict_literal() -> None:
    good = _index({1: 2})
    for bad in (b"", b"[1, 2]", b"__import__('os').system('true')", b"{1: 2", b"\xff",
                b"{[1]: 2}", b"{set(): 1}"):  # unhashable keys: TypeError, not ValueError
        assert merge_dict_literal(bad, good) is None
        assert merge_dict_literal(good, bad) is None


def test_index_is_a_commit_record_of_its_artifacts() -> None:
    rules = families.rules("vllm")
    idx = f"{RANK}/vllm_compile_cache.py"
    assert rules.is_commit_record(idx)
    data = _index({
        ((1, 8), 0, "inductor_standalone"): {
            "graph_handle": ("artifact_compile_range_1_8_subgraph_0", f"/abs/{RANK}/x"),
            "cache_key": "k0"},
        ((1, 8), 1, "inductor"): {"graph_handle": ("fabcdef0123", "/abs/y.py"), "cache_key": "k1"},
        ((9, 16), 0, "inductor_standalone"): {
            "graph_handle": ("../escape", "/z"), "cache_key": "k2"},
    })
    assert rules.record_children(idx, data) == [
        f"{RANK}/artifact_compile_range_1_8_subgraph_0"]
    assert rules.record_children(idx, b"not a dict") is None


def test_an_index_past_what_casfs_parses_is_not_one() -> None:
    """Root's shared processes parse indexes: past MAX_PARSED_BYTES, or with more
    items than MAX_LITERAL_ITEMS (~900 bytes of parse each), one is not in the format
    (no children, no merge), whatever it names. Before: parsed, at ~470x its size."""
    from casfs.families.base import MAX_LITERAL_ITEMS, MAX_PARSED_BYTES

    rules = families.rules("vllm")
    idx = f"{RANK}/vllm_compile_cache.py"
    named = {"x": {"graph_handle": ("artifact_a", "p")}}
    ok = _index({**named, "pad": "y" * (MAX_PARSED_BYTES // 2)})  # one large string: fine
    assert rules.record_children(idx, ok) == [f"{RANK}/artifact_a"]
    big = _index({**named, "pad": "y" * MAX_PARSED_BYTES})
    items = _index({**named, "pad": [0] * MAX_LITERAL_ITEMS})  # small, but 150,000 items
    strings = _index({**named, "pad": ["y"] * (MAX_LITERAL_ITEMS // 2)})  # quotes count
    assert len(items) < MAX_PARSED_BYTES and len(strings) < MAX_PARSED_BYTES
    for bad in (big, items, strings):
        assert rules.record_children(idx, bad) is None
        assert merge_dict_literal(bad, ok) is None and merge_dict_literal(ok, bad) is None


def test_an_index_made_of_what_no_literal_has_is_never_parsed(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """ast.literal_eval parses any expression before it refuses a non-literal, and a
    review's 8 MiB "1<1<1..." (no separator, bracket or quote: no item counted) took
    the shared worker to 3.5 GB: such text is refused on its tokens, unparsed."""
    import ast

    from casfs.families.base import MAX_LITERAL_TOKENS, MAX_PARSED_BYTES

    parsed: list[int] = []
    real_eval = ast.literal_eval
    monkeypatch.setattr(ast, "literal_eval", lambda t: parsed.append(len(t)) or real_eval(t))
    rules = families.rules("vllm")
    idx = f"{RANK}/vllm_compile_cache.py"
    named = _index({"x": {"graph_handle": ("artifact_a", "p")}})
    n = MAX_PARSED_BYTES // 2 - 8
    for bomb in (b"1<" * n + b"1", b"1|" * n + b"1", b"a." * n + b"a", b"not " * (n // 2) + b"1",
                 b"{'x': f'{" + b"1<" * 1000 + b"1}'}", b"{'x': (" + b"0 " * n + b")}"):
        assert rules.record_children(idx, bomb) is None
        assert merge_dict_literal(bomb, named) is None and merge_dict_literal(named, bomb) is None
    assert parsed == [len(named)] * 12  # the good one, twice a bomb; no bomb was parsed
    # a literal's every kind of token is still one (signs, bytes, implicit concatenation)
    odd = b"{'x': {'graph_handle': ('artifact_' 'a', 'p'), 'n': (-1, +2.5, 0x10, b'z', None)}}"
    assert rules.record_children(idx, odd) == [f"{RANK}/artifact_a"]
    assert merge_dict_literal(b"{0: [" + b"0," * MAX_LITERAL_TOKENS + b"]}", named) is None


def test_a_large_real_index_is_within_the_bounds_and_a_merge_past_them_is_refused() -> None:
    """81 piecewise graphs x 35 compile sizes (a review's measure of a large real
    index: ~1 MB, ~57,000 items) parses; two halves whose union would be past the
    items bound are not merged (newest wins), rather than dropped every round."""
    from casfs.families.base import MAX_LITERAL_ITEMS, literal_items

    rules = families.rules("vllm")
    idx = f"{RANK}/vllm_compile_cache.py"

    def entries(sizes: range) -> dict[object, object]:
        return {((s, s), g, "inductor_standalone"): {
            "graph_handle": (f"artifact_compile_range_{s}_{s}_subgraph_{g}", f"/abs/{RANK}/x"),
            "cache_key": "k" * 52} for s in sizes for g in range(81)}

    real = _index(entries(range(35)))
    assert len(rules.record_children(idx, real) or []) == 81 * 35
    per = literal_items(real) / (81 * 35)  # items an entry
    sizes = int(MAX_LITERAL_ITEMS / per * 0.6) // 81  # each half ~60 % of the bound
    half_a = _index(entries(range(sizes)))
    half_b = _index(entries(range(1000, 1000 + sizes)))
    assert rules.record_children(idx, half_a) is not None
    assert merge_dict_literal(half_a, half_b) is None


@pytest.mark.fuse
def test_an_index_with_an_unhashable_key_does_not_stop_publication(tmp_path: Path) -> None:
    """Was: ``{[1]: 2}`` made ast.literal_eval raise TypeError, which the parser let
    through: every promotion round of the namespace failed, nothing was published."""
    job = ("import os; d = os.environ['VLLM_CACHE_ROOT'];"
           f"os.makedirs(d + '/{RANK}');"
           "open(d + '/good.bin', 'wb').write(b'good');"
           f"open(d + '/{RANK}/vllm_compile_cache.py', 'w').write('{{[1]: 2}}')")
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"),
               CASFS_STATE_DIR=str(tmp_path / "state"), CASFS_MOUNT_BASE=str(tmp_path / "mnt"))
    cli = [sys.executable, "-m", "casfs.cli.main"]
    r = subprocess.run([*cli, "run", "--family", "vllm", "--namespace", "v", "--stable-after",
                        "0.2", "--", sys.executable, "-c", job],
                       env=env, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    ls = subprocess.run([*cli, "ls", "-r", "v"], env=env, capture_output=True, text=True,
                        timeout=120, check=False)
    assert ls.returncode == 0 and "good.bin" in ls.stdout, (ls.stdout, ls.stderr)
