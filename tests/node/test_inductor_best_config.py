"""Inductor's ``.best_config`` files are replaced paths: the newest version publishes.

Found on an H200 (bench/gpu.py, ``max-autotune-no-cudagraphs``): Inductor saves
a kernel's autotuning winner, then seconds later the coordinate-descent winner,
by ``write_atomic`` (a temp file renamed over the old one). First-writer-wins
published the first one and counted the second a conflict, so fresh nodes did
not get the configs the cold node ended with. Through ``casfs run --mode dir``:
no FUSE needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from casfs.store.root import SharedRoot

REPO = Path(__file__).resolve().parents[2]
REL = "ab/cabcdef.best_config"


def save(text: str) -> str:
    """Shell for torch's write_atomic of the file (temp file beside it, then rename)."""
    d = '"$TORCHINDUCTOR_CACHE_DIR/ab"'
    return (f"mkdir -p {d} && printf '%s' '{text}' > {d}/.1.2.tmp && "
            f"mv {d}/.1.2.tmp {d}/cabcdef.best_config")


def run(tmp: Path, node: str, script: str) -> dict[str, Any]:
    env = dict(os.environ, CASFS_ROOT=str(tmp / "root"), CASFS_STATE_DIR=str(tmp / node),
               CASFS_MOUNT_BASE=str(tmp / f"mnt-{node}"))
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    report = tmp / f"{node}.json"
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--mode", "dir",
                        "--family", "inductor", "--namespace", "ind", "--stable-after", "0.2",
                        "--publish-interval", "0.5", "--report", str(report), "--",
                        "sh", "-c", script],
                       env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    out: dict[str, Any] = json.loads(report.read_text())["families"][0]
    out["stdout"] = r.stdout
    return out


def published(tmp: Path) -> bytes:
    root = SharedRoot.open(tmp / "root")
    gens = root.generations()
    ns = next(n for n in gens.namespaces() if n.endswith("ind"))
    return root.objects.get_bytes(gens.entries(ns).entries[REL].digest)


def test_best_config_rewritten_after_publication_publishes_newest(tmp_path: Path) -> None:
    v1, v2, v3 = (f'{{"XBLOCK": {n}}}' for n in (64, 128, 32))
    cat = f'cat "$TORCHINDUCTOR_CACHE_DIR/{REL}"'
    # Node A: the autotuning winner is published, then coordinate descent saves again.
    a = run(tmp_path, "a", f"{save(v1)} && sleep 2.5 && {save(v2)}")
    assert a["conflicts"] == 0, a
    assert published(tmp_path) == v2.encode()
    # Node B, fresh, gets the final version; its own re-save publishes too.
    b = run(tmp_path, "b", f"{cat} && {save(v3)}")
    assert b["stdout"] == v2
    assert b["conflicts"] == 0 and b["published"] == 1, b
    c = run(tmp_path, "c", cat)
    assert c["stdout"] == v3
