"""A real client round trip: an Inductor cache imported, exported, and hit by a fresh process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.real_client, pytest.mark.slow]

if importlib.util.find_spec("torch") is None:
    pytest.skip("torch is not installed", allow_module_level=True)


def run_workload(cache_dir: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHINDUCTOR_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    env["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
    proc = subprocess.run(
        [sys.executable, "-m", "casfs.demo.inductor_workload", "--json"],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
    result: dict[str, Any] = json.loads(line)
    return result


def test_inductor_cache_survives_import_and_export(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    cold = run_workload(a)
    c = cold["counters"]
    graphs = cold["graphs"]
    assert c["fxgraph_cache_miss"] >= graphs and c["fxgraph_cache_hit"] == 0
    assert cold["stable"] is True
    imp = cli("import", a, "--family", "inductor", "-n", "ind", "--json", check=True).json()
    assert imp["files"] > 0 and imp["seq"] == 1
    cli("export", "ind", b, check=True)
    assert cli("verify", "--json", check=True).json()["ok"] is True
    warm = run_workload(b)
    w = warm["counters"]
    assert w["fxgraph_cache_miss"] == 0, w
    assert w["autograd_cache_miss"] == 0, w
    assert w["fxgraph_cache_hit"] >= graphs, w
    assert w["autograd_cache_hit"] >= graphs, w
    assert warm["checksum"] == cold["checksum"]
