"""bench/gpu.py without a GPU: a one-line refusal, and its flow with a stand-in driver."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", "bench.gpu", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)


def test_no_gpu_is_one_line(tmp_path: Path) -> None:
    r = bench("--out", str(tmp_path / "x.json"))
    assert r.returncode == 2
    assert r.stderr.startswith("bench.gpu: ") and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_cpu_smoke_cuda_cache_flow(tmp_path: Path) -> None:
    # Node B adds a program (the driver rewrites index: a replaced path); C hits both.
    out = tmp_path / "smoke.json"
    r = bench("--cpu-smoke", "--only", "cuda", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(out.read_text())["summary"]["cuda"]
    assert s["hits_misses"] == {"plain_cold": [0, 1], "casfs_a": [0, 1], "plain_warm": [1, 0],
                                "casfs_b": [1, 1], "casfs_c": [2, 0]}
    assert s["new_cache_files"]["casfs_c"] == 0
    assert s["casfs_conflicts"] == {"casfs_a": 0, "casfs_b": 0, "casfs_c": 0}
    assert s["outputs_equal_everywhere"] and s["outputs_match_reference"]
