"""The family registry: every family is complete, and only the registry names them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from casfs import families
from casfs.errors import UsageError
from casfs.families.base import HOST_INGREDIENTS
from casfs.fingerprint import fingerprint

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", families.names())
def test_every_family_declares_itself(name: str) -> None:
    fam = families.get(name)
    assert fam.name == name and fam.summary
    assert fam.env_vars and all(re.fullmatch(r"[A-Z][A-Z0-9_]*", v) for v in fam.env_vars)
    assert "build_key" in fam.ingredients  # the operator can always split a namespace
    for key in fam.ingredients:
        assert key in HOST_INGREDIENTS or fam.package_dists(key)
    fp = fingerprint(name)
    assert fp.namespace.startswith(f"{name}-") and set(fp.ingredients) == set(fam.ingredients)
    for inc in fam.includes:
        assert inc in families.names() and inc != name


def test_env_vars_are_unique_across_families() -> None:
    seen: dict[str, str] = {}
    for name in families.names():
        for var in families.get(name).env_vars:
            assert var not in seen, f"{var} claimed by {seen.get(var)} and {name}"
            seen[var] = name


def test_env_for_never_overrides_and_companions_are_opt_in() -> None:
    dirs = {"triton": "/m/triton", "cutedsl": "/m/cutedsl"}
    job = {"TRITON_CACHE_DIR": "/job/own"}
    env = families.env_for(dirs, job)
    assert "TRITON_CACHE_DIR" not in env  # the job's own choice stands
    assert env["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] == "/m/cutedsl"
    assert "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED" not in env
    env = families.env_for(dirs, {}, companions=True)
    assert env["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1"
    assert env["TRITON_CACHE_DIR"] == "/m/triton"
    env = families.env_for(dirs, {"FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "0"}, companions=True)
    assert "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED" not in env


def test_unknown_family() -> None:
    with pytest.raises(UsageError, match="unknown cache family 'rustc'"):
        families.rules("rustc")


def test_includes_are_transitive() -> None:
    assert [f.name for f in families.closure("vllm")] == ["vllm", "inductor", "triton"]
    rules = families.rules("sglang")
    assert rules.is_commit_record("torch_compile/ab/triton/0/K/__grp__k.json")
    assert rules.is_scratch("deep_gemm/tmp/x")


def test_no_family_is_named_outside_the_registry() -> None:
    """Family knowledge lives in casfs/families only (env variables, layouts, names)."""
    words = [v for n in families.names() for v in families.get(n).env_vars]
    words += [f'"{n}"' for n in families.names() if n not in HOST_INGREDIENTS] + ["__grp__"]
    patterns = [arg for w in words for arg in ("-e", w)]
    out = subprocess.run(["git", "grep", "--untracked", "-n", "-F", *patterns,
                          "--", "casfs/", ":!casfs/families/", ":!casfs/demo/"],
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert out.stdout == "", out.stdout
