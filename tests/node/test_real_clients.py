"""Real compilers through real mounts, via `casfs run`: cold on node A, warm on node B.

Node B has a fresh state dir (empty index, object cache and upper): everything
it hits comes from what node A published to the shared root. Both nodes use
the same fixed mount paths, one after the other, as a cluster would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import require_fuse

pytestmark = [pytest.mark.fuse, pytest.mark.real_client, pytest.mark.slow]


def casfs_run(tmp: Path, node: str, family: str, *cmd: str, mode: str = "fuse",
              root: str | None = None, opts: tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:
    require_fuse()
    env = dict(os.environ, CASFS_ROOT=root or str(tmp / "root"), CASFS_STATE_DIR=str(tmp / node),
               CASFS_MOUNT_BASE=str(tmp / "mnt"))
    r = subprocess.run(
        [sys.executable, "-m", "casfs.cli.main", "run", "--family", family, "--mode", mode,
         "--stable-after", "0.3", *opts, "--", sys.executable, *cmd],
        env=env, capture_output=True, text=True, timeout=900, check=False,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(line), r.stderr


# On a loaded machine (torch.compile beside the parallel suite) the first open of a
# fresh S3 root can outlast its 3 s bound: the mount serves local state, reopens the
# root, and the test's hit assertions still hold (seen once in a CI run at -n 3).
@pytest.mark.expect_log(r"shared root unavailable, serving local state only: root-open:s3://")
@pytest.mark.parametrize("where", ["posix", "s3"])
def test_torch_compile_warm_on_a_fresh_node(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    # s3: the shared root on a real SeaweedFS server (tests/seaweed.py)
    root = request.getfixturevalue("s3_url") if where == "s3" else None
    cold, _ = casfs_run(tmp_path, "node-a", "inductor", "-m", "casfs.demo.inductor_workload",
                        "--json", root=root)
    c = cold["counters"]
    assert c["fxgraph_cache_miss"] > 0 and c["fxgraph_cache_hit"] == 0
    warm, summary = casfs_run(tmp_path, "node-b", "inductor", "-m",
                              "casfs.demo.inductor_workload", "--json", root=root)
    w = warm["counters"]
    assert w["fxgraph_cache_hit"] == c["fxgraph_cache_miss"]
    assert w["fxgraph_cache_miss"] == 0
    assert w["autograd_cache_hit"] == c["autograd_cache_miss"]
    assert w["autograd_cache_miss"] == 0
    assert warm["checksum"] == cold["checksum"]
    assert "inductor: restored" in summary and "0 promoted" in summary  # nothing new on B


def test_triton_compile_served_from_the_cache_on_a_fresh_node(tmp_path: Path) -> None:
    n = 4
    cold, _ = casfs_run(tmp_path, "node-a", "triton", "-m", "casfs.demo.triton_workload",
                        "--kernels", str(n), "--json")
    assert cold["misses"] == n and cold["hits"] == 0
    warm, _ = casfs_run(tmp_path, "node-b", "triton", "-m", "casfs.demo.triton_workload",
                        "--kernels", str(n), "--json")
    assert warm["hits"] == n and warm["misses"] == 0  # Triton's own cache manager says so
    assert warm["cubin_sha256s"] == cold["cubin_sha256s"]


def test_clients_through_overlay_mode(tmp_path: Path) -> None:
    """Triton cold and warm through kernel overlayfs mounts, then warm again with the
    objects on the node (served from hard links); torch.compile warm through overlay."""
    from casfs.view import overlay

    if (why := overlay.unavailable_reason()) is not None:
        pytest.skip(why)
    n = 3
    args = ("-m", "casfs.demo.triton_workload", "--kernels", str(n), "--json")
    cold, _ = casfs_run(tmp_path, "node-a", "triton", *args, mode="overlay")
    assert cold["misses"] == n and cold["hits"] == 0
    for _ in range(2):  # fresh node (through FUSE), then objects local (hard links)
        warm, _ = casfs_run(tmp_path, "node-b", "triton", *args, mode="overlay")
        assert warm["hits"] == n and warm["misses"] == 0
        assert warm["cubin_sha256s"] == cold["cubin_sha256s"]
    # A fresh node that waits for warm-ready: the profile node-a published is linked
    # before the job starts (then looked up once by the launcher); same cubins.
    report = tmp_path / "report.json"
    warm, summary = casfs_run(tmp_path, "node-e", "triton", *args, mode="overlay",
                              opts=("--wait-warm=300", "--report", str(report)))
    assert warm["hits"] == n and warm["misses"] == 0
    assert warm["cubin_sha256s"] == cold["cubin_sha256s"]
    assert "warm-ready" in summary and "not warm-ready" not in summary, summary
    (fam,) = json.loads(report.read_text())["families"]
    assert fam["prefetched_files"] > 0  # the profile's hot set came before the job
    assert fam["warm_ready_s"] <= fam["mount_ready_s"]
    ind = ("-m", "casfs.demo.inductor_workload", "--json")
    cold, _ = casfs_run(tmp_path, "node-c", "inductor", *ind)
    warm, _ = casfs_run(tmp_path, "node-d", "inductor", *ind, mode="overlay")
    assert warm["counters"]["fxgraph_cache_hit"] == cold["counters"]["fxgraph_cache_miss"]
    assert warm["counters"]["fxgraph_cache_miss"] == 0
    assert warm["checksum"] == cold["checksum"]
