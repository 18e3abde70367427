"""Caches that move: Triton group files stored path-free, presented with the serving path.

Published from a mount at one path, the cache hits 100% through a fresh
node's mount at another path, with the real Triton client (no GPU needed).
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

from casfs.families.triton import is_group_file
from casfs.store.root import SharedRoot
from tests.fusehelpers import root_objects

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.real_client,
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed"),
]
REPO = Path(__file__).resolve().parents[2]


def triton_run(cache: Path) -> dict[str, Any]:
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache))
    proc = subprocess.run(
        [sys.executable, "-m", "casfs.demo.triton_workload", "--kernels", "3", "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_published_at_one_path_hits_at_another(cluster: dict[str, Any]) -> None:
    a, b, c = cluster["a"], cluster["b"], cluster["c"]
    mnt: Path = cluster["mnt"]
    wa = a.mount("triton", mountpoint=mnt / "written" / "here")
    cold = triton_run(wa.cfg.mountpoint)
    assert cold["hits"] == 0 and cold["misses"] == 3
    a.stop(wa)

    snap = SharedRoot.open(cluster["root"]).generations().entries("testns").entries
    objects = root_objects(cluster["root"])
    groups = [e for p, e in snap.items() if is_group_file(p)]
    assert len(groups) == 3
    for g in groups:
        stored = objects.get_bytes(g.digest)
        assert str(mnt).encode() not in stored  # path-free
        assert g.extras is not None and g.extras["relocate"] >= 2

    # A fresh node serving the namespace at another path: every kernel hits.
    wb = b.mount("triton", mountpoint=mnt / "elsewhere")
    mb = wb.cfg.mountpoint
    group = mb / groups[0].path
    shown = group.read_bytes()
    assert group.stat().st_size == len(shown)  # synthetic content, consistent size
    paths = json.loads(shown)["child_paths"].values()
    assert all(p.startswith(f"{mb}/") and Path(p).is_file() for p in paths)
    warm = triton_run(mb)
    assert warm["hits"] == 3 and warm["misses"] == 0
    assert warm["cubin_sha256s"] == cold["cubin_sha256s"]
    assert b.ask(wb, "stats")["counters"]["presented_opens"] >= 3
    # B only read: what it opened still reaches the root, as a read record (retention).
    b.ask(wb, "publish")
    recs = list((cluster["root"] / "namespaces" / "testns" / "reads").iterdir())
    opened = {p for r in recs for p in json.loads(r.read_text())["paths"]}
    assert {g.path for g in groups} <= opened

    # `casfs export` writes the groups with the destination's paths.
    dest = cluster["mnt"].parent / "exported"
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(cluster["root"]),
                        "--state-dir", str(cluster["mnt"].parent / "state-x"), "export", "testns",
                        str(dest)], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    exported = json.loads((dest / groups[0].path).read_text())["child_paths"].values()
    assert all(p.startswith(f"{dest}/") and Path(p).is_file() for p in exported)

    # Dir mode (no FUSE) restores the presented form at its own path too.
    wc = c.mount("triton", mountpoint=mnt / "plain" / "dir", mode="dir")
    plain = triton_run(wc.cfg.mountpoint)
    assert plain["hits"] == 3 and plain["cubin_sha256s"] == cold["cubin_sha256s"]


def test_an_imported_cache_packs_its_group_files_and_hits_at_another_path(
        cluster: dict[str, Any], tmp_path: Path) -> None:
    """`casfs import --packs` (the default on an object store) packs the group files'
    path-free form like any small file, as promotion does: one loose object a kernel
    was a GET each on a fresh node. Served at another path, every kernel hits."""
    local = tmp_path / "local-cache"
    cold = triton_run(local)
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(cluster["root"]),
                        "--state-dir", str(tmp_path / "state-import"), "import", str(local),
                        "-n", "imported", "--family", "triton", "--packs"],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    snap = SharedRoot.open(cluster["root"]).generations().entries("imported").entries
    groups = [e for p, e in snap.items() if is_group_file(p)]
    assert len(groups) == 3 and len(snap) == 3 * 8
    objects = root_objects(cluster["root"], "imported")
    for g in groups:
        assert g.extras is not None and g.extras["relocate"] >= 2
        assert g.extras.get("pack"), g.extras  # packed, not loose
        assert str(local).encode() not in objects.get_bytes(g.digest)  # path-free
    assert all((e.extras or {}).get("pack") for e in snap.values())
    wb = cluster["b"].mount("triton", namespace="imported",
                            mountpoint=cluster["mnt"] / "served" / "elsewhere")
    warm = triton_run(wb.cfg.mountpoint)
    assert warm["hits"] == 3 and warm["misses"] == 0
    assert warm["cubin_sha256s"] == cold["cubin_sha256s"]
