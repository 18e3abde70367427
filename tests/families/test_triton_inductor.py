"""Triton and Inductor family rules on real client paths, and Triton group files."""

from __future__ import annotations

import json

import pytest

from casfs.errors import UsageError
from casfs.families import rules as family_rules
from casfs.families.triton import (
    GROUPS,
    group_children,
    group_written_root,
    is_group_file,
)

KEY = "7NKZN2IV7ZBONWLCSFOQYCSFLUEILF3Z7JGCKATQOW63BQKAVLRQ"
UUID = "0b5c7e1e-2a43-4c4f-9d0b-3f1f7c1e9a11"

# (relative path, scratch?) as Triton 3.7.1 and Inductor 2.13 write them.
REAL_PATHS = [
    (f"{KEY}/k.cubin", False),
    (f"{KEY}/k.json", False),
    (f"{KEY}/__grp__k.json", False),
    (f"{KEY}/k.source", False),
    (f"{KEY}/tmp.pid_12345_{UUID}", True),
    (f"{KEY}/tmp.pid_12345_{UUID}/k.cubin", True),
    (f"{KEY}/k.cubin.tmp.pid_12345_{UUID}", True),
    ("cuda_utils.so", False),
    ("ab/cabcdef0123456789.py", False),
    ("ab/cabcdef0123456789.cpp", False),
    ("ab/cabcdef0123456789.so", False),
    ("ab/.4242.139871234567.tmp", True),
    ("fxgraph/bc/fabcdef/0a1b2c3d4e5f", False),
    ("fxgraph/bc/fabcdef/.4242.139871234567.tmp", True),
    ("aotautograd/aabcdef/entry", False),
    ("locks", True),
    ("locks/cabcdef0123.lock", True),
    ("precompiled_headers/locks/h123.lock", True),
    ("g++.lock", True),
    ("ab/cabcdef_CxxBuild", True),
    ("ab/cabcdef_CxxBuild/cabcdef.o", True),
    (f"triton/0/tmp.{UUID}/k.cubin", True),
    (f"triton/0/{KEY}/k.cubin", False),
    ("tmp.not-a-uuid", False),
    ("ab/.wh.cabcdef.so", True),
    (".wh..wh..opq", True),
    ("ab/clock.py", False),
    ("ab/unlocks.py", False),
    ("ab/c.tmp", False),
]


# Inductor keeps a Triton cache inside (triton/<dev>/), and a generic cache may
# hold either: their rules include Triton's.
@pytest.mark.parametrize("family", ["inductor", "generic", "vllm", "sglang"])
@pytest.mark.parametrize(("relpath", "scratch"), REAL_PATHS)
def test_builtin_rules(family: str, relpath: str, scratch: bool) -> None:
    assert family_rules(family).is_scratch(relpath) is scratch


def test_triton_rules_alone() -> None:
    rules = family_rules("triton")
    for relpath, scratch in REAL_PATHS:
        triton_made = "tmp.pid_" in relpath or relpath.endswith(".lock") or ".wh." in relpath
        assert rules.is_scratch(relpath) is (scratch and triton_made), relpath
    assert rules.is_commit_record(f"{KEY}/__grp__k.json")
    assert rules.replace_rule(f"{KEY}/__grp__k.json") is None  # never replaced


def test_user_patterns_match_path_and_components() -> None:
    rules = family_rules("generic", ["*.partial", "cache/old/*"])
    assert rules.is_scratch("a/b/c.partial")
    assert rules.is_scratch("x.partial/inner")
    assert rules.is_scratch("cache/old/f")
    assert not rules.is_scratch("cache/new/f")
    assert not rules.is_scratch("a/b/c.partially")
    assert not family_rules("generic").is_scratch("a/b/c.partial")


def test_unknown_family() -> None:
    with pytest.raises(UsageError):
        family_rules("nope")


def test_is_group_file() -> None:
    assert is_group_file(f"{KEY}/__grp__k.json")
    assert is_group_file("__grp__add_kernel.json")
    assert not is_group_file(f"{KEY}/k.json")
    assert not is_group_file(f"{KEY}/__grp__k.json.tmp")


def _real_group(root: str) -> bytes:
    # Exactly what FileCacheManager.put_group writes (json.dumps, absolute paths).
    names = ["k.source", "k.ttir", "k.ttgir", "k.llir", "k.ptx", "k.cubin", "k.json"]
    return json.dumps({"child_paths": {n: f"{root}/{KEY}/{n}" for n in names}}).encode()


def test_a_group_file_past_what_casfs_parses_is_not_one() -> None:
    """Group files are parsed by root's shared processes: past MAX_PARSED_BYTES one is
    not a group (never published), whatever it names."""
    from casfs.families.base import MAX_PARSED_BYTES

    rel = f"{KEY}/__grp__k.json"
    data = json.dumps({"child_paths": {"k.cubin": f"/c/{KEY}/k.cubin"},
                       "pad": "y" * MAX_PARSED_BYTES}).encode()
    assert group_children(rel, data) is None
    assert family_rules("triton").record_children(rel, data) is None
    assert group_children(rel, data[:-MAX_PARSED_BYTES // 2 - 2] + b'"}') is not None


def test_group_children_maps_absolute_paths_by_basename() -> None:
    data = _real_group("/tmp/tw/c1")
    children = group_children(f"{KEY}/__grp__k.json", data)
    assert children == sorted(
        f"{KEY}/k.{ext}" for ext in ("source", "ttir", "ttgir", "llir", "ptx", "cubin", "json")
    )
    # A node mounting elsewhere maps to the same relative paths.
    assert group_children(f"{KEY}/__grp__k.json", _real_group("/other/mnt")) == children
    # Nested under Inductor's triton/<dev>/.
    nested = group_children(f"triton/0/{KEY}/__grp__k.json", data)
    assert nested is not None and nested[0].startswith(f"triton/0/{KEY}/")


@pytest.mark.expect_log(r"group file \S+ names an unusable child")
@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"{not json",
        b'{"child_paths": {"k.cubin": "/x/K/k.cub',  # half-written
        b"[1, 2]",
        b'{"other": {}}',
        b'{"child_paths": ["k.cubin"]}',
        b'{"child_paths": {"k.cubin": 3}}',
        b'{"child_paths": {"k": "/x/K/.."}}',
        b'{"child_paths": {"k": "/x/K/"}}',
        b"\xff\xfe",
    ],
)
def test_group_children_unusable(data: bytes) -> None:
    assert group_children(f"{KEY}/__grp__k.json", data) is None


def test_group_children_empty_group() -> None:
    assert group_children(f"{KEY}/__grp__k.json", b'{"child_paths": {}}') == []


def test_group_relocation_round_trip() -> None:
    rel = f"triton/0/{KEY}/__grp__k.json"
    data = _real_group("/mnt/a/triton/0")
    stored = GROUPS.to_pathfree(rel, data)
    assert stored is not None and b"/mnt/a" not in stored
    assert group_children(rel, stored) == group_children(rel, data)
    # Presented at the path it was written from: byte-identical to Triton's own file.
    assert GROUPS.present(rel, stored, "/mnt/a") == data
    moved = GROUPS.present(rel, stored, "/srv/cache/")
    assert moved == _real_group("/srv/cache/triton/0")
    assert group_written_root(rel, moved) == "/srv/cache"
    # The presented size follows from the stored size and the count alone.
    n = GROUPS.count(rel, stored)
    assert n == 7 and GROUPS.count(rel, data) is None
    for root in ("/mnt/a", "/srv/cache/", "/run/casfs/uid-0/triton-0123", '/odd "dir"/é'):
        shown = GROUPS.present(rel, stored, root)
        assert shown is not None and len(shown) == GROUPS.present_size(len(stored), n, root)
    # Absolute (legacy) groups and garbage are served as stored.
    assert GROUPS.present(rel, data, "/x") is None
    assert GROUPS.present(rel, b"{", "/x") is None
    assert GROUPS.to_pathfree(rel, b"{") is None


def test_group_written_root() -> None:
    assert group_written_root(f"{KEY}/__grp__k.json", _real_group("/tmp/tw/c1")) == "/tmp/tw/c1"
    nested = f"triton/0/{KEY}/__grp__k.json"
    data = _real_group("/cache/triton/0")
    assert group_written_root(nested, data) == "/cache"
    # Children under another key directory, mixed roots, or garbage: unknown.
    assert group_written_root(nested, _real_group("/cache/triton/1")) is None
    mixed = json.dumps({"child_paths": {"a": f"/r1/{KEY}/a", "b": f"/r2/{KEY}/b"}}).encode()
    assert group_written_root(f"{KEY}/__grp__k.json", mixed) is None
    assert group_written_root(f"{KEY}/__grp__k.json", b"{") is None
    assert group_written_root(f"{KEY}/__grp__k.json", b'{"child_paths": {}}') is None


def test_inductor_best_config_is_replaced_newest() -> None:
    # runtime/autotune_cache.py saves it twice under coordinate descent: newest wins.
    for family, prefix in (("inductor", ""), ("vllm", "torch_compile_cache/3f/rank_0_0/x/"
                                                       "inductor_cache/")):
        rule = family_rules(family).replace_rule(f"{prefix}ab/cab.best_config")
        assert rule is not None and rule.kind == "newest", family
    assert family_rules("inductor").replace_rule("ab/cab.py") is None  # generated code: first
    assert family_rules("triton").replace_rule(f"{KEY}/k.json") is None
