"""Triton through the overlay: cold misses, warm hits, and hits after a restore.

The restore is the casfs flow in miniature: a second mount at the same path
whose lower layer holds what the first mount's upper received (Triton 3.x
group files hold absolute paths, so the path must be the same).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fusehelpers import REPO, MountedView

from .conftest import Overlay

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.real_client,
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed"),
]


def triton_run(cache: Path) -> dict[str, Any]:
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache))
    proc = subprocess.run(
        [sys.executable, "-m", "casfs.demo.triton_workload", "--kernels", "3", "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_triton_cold_warm_and_restored(overlay: Callable[..., Overlay], tmp_path: Path) -> None:
    ov = overlay({})
    cache = ov.mnt / "triton"
    cold = triton_run(cache)
    assert cold["hits"] == 0 and cold["misses"] == 3
    warm = triton_run(cache)
    assert warm["hits"] == 3 and warm["cubin_sha256s"] == cold["cubin_sha256s"]
    ov.view.stop()
    # Restore: the first upper becomes the lower of a fresh mount at the same path.
    lower2 = tmp_path / "lower2"
    shutil.copytree(ov.upper, lower2, ignore=shutil.ignore_patterns(".wh.*"))
    view2 = MountedView(lower2, tmp_path / "upper2", ov.mnt).start()
    try:
        restored = triton_run(cache)
    finally:
        view2.stop()
    assert restored["hits"] == 3 and restored["cubin_sha256s"] == cold["cubin_sha256s"]
