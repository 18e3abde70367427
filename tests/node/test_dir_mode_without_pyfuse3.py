"""dir mode serves on a host where pyfuse3 cannot be imported.

pyfuse3 has no wheels (it builds against libfuse3), so a GPU image without
libfuse3 has no pyfuse3: found on an H200 machine, where every `casfs run
--mode dir` fell back to private, unshared caches ("No module named
'pyfuse3'") because the mount process imported the FUSE layer at start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(tmp: Path, node: str, blocker: Path, script: str) -> dict:
    env = dict(os.environ, CASFS_ROOT=str(tmp / "root"), CASFS_STATE_DIR=str(tmp / node),
               CASFS_MOUNT_BASE=str(tmp / "mnt"),
               PYTHONPATH=os.pathsep.join([str(blocker), str(REPO)]))
    env.pop("TRITON_CACHE_DIR", None)
    report = tmp / f"{node}.json"
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--mode", "dir",
                        "--family", "triton", "--namespace", "nofuse", "--stable-after", "0.2",
                        "--report", str(report), "--", "sh", "-c", script],
                       env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "private" not in r.stderr, r.stderr  # served, not a private temporary directory
    out = json.loads(report.read_text())["families"][0]
    out["stdout"] = r.stdout
    return out


def test_casfs_run_dir_mode_needs_no_pyfuse3(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "pyfuse3.py").write_text("raise ImportError('pyfuse3 is not installed here')\n")
    a = _run(tmp_path, "node-a", blocker,
             'mkdir -p "$TRITON_CACHE_DIR/K" && printf cubin > "$TRITON_CACHE_DIR/K/k.cubin"')
    assert a["served"] and a["published"] == 1 and a["errors"] == 0
    b = _run(tmp_path, "node-b", blocker, 'cat "$TRITON_CACHE_DIR/K/k.cubin"')
    assert b["restored_entries"] == 1
    assert b["stdout"] == "cubin"
