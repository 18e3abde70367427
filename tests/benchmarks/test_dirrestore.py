"""bench.dirrestore runs and reports both credentials' cost a file (its figures are in
docs/performance.md, "dir mode: the copy, a directory at a time")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_the_bench_restores_as_root_and_as_a_tenant(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "bench.dirrestore", "--files", "40",
                          "--rounds", "2", "--work", str(tmp_path)],
                         check=True, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout
    got = json.loads(out)
    assert got["files"] == 40
    for who in ("root", "tenant"):
        assert len(got[who]["wall_us_per_file"]) == 2
        assert got[who]["cpu_us_median"] > 0
    assert list(tmp_path.iterdir()) == []  # its scratch dir removed
