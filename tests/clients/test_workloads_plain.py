"""The probe workloads on a plain directory: cold is all misses, warm all hits.

This is what makes them trustworthy probes for a casfs mount: on a plain
directory a fresh process hits every entry a previous process wrote, with the
same results. Each run is a fresh subprocess so no in-memory cache hides the
on-disk one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from casfs.families import rules as family_rules
from casfs.families.triton import group_children, group_written_root, is_group_file

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.real_client, pytest.mark.slow]


def _run(module: str, env_var: str, cache: Path, *args: str) -> dict[str, Any]:
    env = dict(os.environ)
    env[env_var] = str(cache)
    proc = subprocess.run(
        [sys.executable, "-m", module, "--json", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_inductor_workload_cold_then_warm(tmp_path: Path) -> None:
    cache = tmp_path / "inductor"
    cold = _run("casfs.demo.inductor_workload", "TORCHINDUCTOR_CACHE_DIR", cache)
    graphs = cold["graphs"]
    assert graphs >= 2
    assert cold["counters"] == {
        "fxgraph_cache_hit": 0,
        "fxgraph_cache_miss": graphs,
        "fxgraph_cache_bypass": 0,
        "autograd_cache_hit": 0,
        "autograd_cache_miss": graphs,
        "autograd_cache_bypass": 0,
    }
    assert cold["max_abs_err_vs_eager"] < 1e-4
    assert cold["stable"]

    # Of what a real run leaves behind, only the lock files are scratch.
    rules = family_rules("inductor")
    scratch = [f for f in _files(cache) if rules.is_scratch(f)]
    assert scratch and all(f.startswith("locks/") and f.endswith(".lock") for f in scratch)
    assert any(f.startswith("fxgraph/") for f in _files(cache))

    warm = _run("casfs.demo.inductor_workload", "TORCHINDUCTOR_CACHE_DIR", cache)
    assert warm["counters"] == {
        "fxgraph_cache_hit": graphs,
        "fxgraph_cache_miss": 0,
        "fxgraph_cache_bypass": 0,
        "autograd_cache_hit": graphs,
        "autograd_cache_miss": 0,
        "autograd_cache_bypass": 0,
    }
    assert warm["checksum"] == cold["checksum"]


def test_inductor_workload_requires_cache_dir() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    proc = subprocess.run(
        [sys.executable, "-m", "casfs.demo.inductor_workload", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_triton_workload_cold_then_warm(tmp_path: Path) -> None:
    cache = tmp_path / "triton"
    n = 6
    cold = _run("casfs.demo.triton_workload", "TRITON_CACHE_DIR", cache, "--kernels", str(n))
    assert (cold["kernels"], cold["hits"], cold["misses"]) == (n, 0, n)
    assert len({k["hash"] for k in cold["per_kernel"]}) == n

    # Every group file names exactly the other files of its kernel directory.
    rules = family_rules("triton")
    files = _files(cache)
    groups = [f for f in files if is_group_file(f)]
    assert len(groups) == n
    for group in groups:
        data = (cache / group).read_bytes()
        children = group_children(group, data)
        assert children is not None
        # Triton 3.x records absolute paths under the root it wrote to.
        assert group_written_root(group, data) == str(cache)
        key_dir = group.rsplit("/", 1)[0]
        siblings = [f for f in files if f.startswith(key_dir + "/") and f != group]
        assert children == sorted(siblings)
        assert f"{key_dir}/{Path(group).name[len('__grp__') :]}" in children
    assert not any(rules.is_scratch(f) for f in files)

    warm = _run("casfs.demo.triton_workload", "TRITON_CACHE_DIR", cache, "--kernels", str(n))
    assert (warm["kernels"], warm["hits"], warm["misses"]) == (n, n, 0)
    assert all(k["files_written"] == 0 for k in warm["per_kernel"])
    # A hit serves the very bytes a fresh compile produced.
    assert warm["cubin_sha256s"] == cold["cubin_sha256s"]
    assert len(set(cold["cubin_sha256s"])) == n
