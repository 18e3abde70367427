"""FlashInfer's JIT through `casfs run`: node A builds a module for sm_90a, fresh node B's
build is a ninja no-op (the .so untouched), with no GPU.

Needs a venv with flashinfer-python and the nvidia-cuda-* toolchain wheels
(``scripts/flashinfer-venv.sh``, ``make test-clients``) named by
CASFS_FLASHINFER_PYTHON; skipped otherwise. Linking needs a ``libcuda.so``:
without a driver, an empty stub stands in, as a CUDA toolkit's lib64/stubs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

FPY = os.environ.get("CASFS_FLASHINFER_PYTHON", "")
BUILD = """
import json, os, time
from flashinfer.jit.activation import gen_act_and_mul_module
spec = gen_act_and_mul_module("silu")
so = spec.get_library_path()
before = os.stat(so).st_mtime_ns if os.path.exists(so) else None
t = time.time()
spec.build()
print(json.dumps({"seconds": time.time() - t, "before": before,
                  "after": os.stat(so).st_mtime_ns}))
"""

if os.environ.get("CASFS_REQUIRE_CLIENTS") == "1" and not (FPY and os.access(FPY, os.X_OK)):
    pytest.fail("CASFS_REQUIRE_CLIENTS=1 but the client venv is missing: run make clients",
                pytrace=False)

pytestmark = [
    pytest.mark.fuse, pytest.mark.real_client, pytest.mark.slow,
    pytest.mark.skipif(not (FPY and os.access(FPY, os.X_OK)),
                       reason="CASFS_FLASHINFER_PYTHON not set: make test-clients"),
]


def build(tmp: Path, node: str, stub: Path) -> tuple[dict[str, Any], str]:
    site = Path(subprocess.run([FPY, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    cuda = site / "nvidia" / "cu13"
    env = dict(os.environ, CASFS_ROOT=str(tmp / "root"), CASFS_STATE_DIR=str(tmp / node),
               CASFS_MOUNT_BASE=str(tmp / "mnt"), CUDA_HOME=str(cuda),
               PATH=f"{cuda / 'bin'}:{os.environ['PATH']}", LIBRARY_PATH=str(stub),
               FLASHINFER_CUDA_ARCH_LIST="9.0a")
    env.pop("FLASHINFER_WORKSPACE_BASE", None)
    script = tmp / "build.py"
    script.write_text(BUILD)
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "flashinfer",
                        "--python", FPY, "--stable-after", "0.3", "--", FPY, str(script)],
                       env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("{")][-1]), r.stderr


def test_flashinfer_jit_hits_on_a_fresh_node(tmp_path: Path) -> None:
    stub = tmp_path / "stubs"
    stub.mkdir()
    (stub / "empty.c").write_text("")
    subprocess.run(["gcc", "-shared", "-o", str(stub / "libcuda.so"), str(stub / "empty.c")],
                   check=True)
    site = subprocess.run([FPY, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    cudart = Path(site.stdout.strip()) / "nvidia" / "cu13" / "lib" / "libcudart.so.13"
    (stub / "libcudart.so").symlink_to(cudart)
    a, _ = build(tmp_path, "node-a", stub)
    assert a["before"] is None  # built cold
    b, summary = build(tmp_path, "node-b", stub)
    assert b["before"] == b["after"] == a["after"]  # ninja found nothing to do
    assert "restored" in summary and "0 published" in summary  # nothing new, no conflict
