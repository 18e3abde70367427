"""casfs doctor: every check reported, failures make a non-zero exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def doctor(tmp_path: Path, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "casfs.cli.main", "--root", str(root), "--state-dir",
         str(tmp_path / "state"), "doctor", "--json"],
        capture_output=True, text=True, check=False)


def test_doctor_on_a_fresh_node(tmp_path: Path) -> None:
    r = doctor(tmp_path, tmp_path / "root")
    checks = {c["check"]: c for c in json.loads(r.stdout)}
    assert set(checks) == {"fuse", "state_dir", "index", "shared_root", "mounts", "health",
                           "tenant", "namespaces"}
    assert checks["health"]["status"] == "ok"
    assert checks["shared_root"]["status"] == "ok"
    assert checks["tenant"]["detail"].startswith(f"tenant u{os.geteuid()} (mode uid")
    assert r.returncode == (1 if any(c["status"] == "fail" for c in checks.values()) else 0)


def test_doctor_names_a_damaged_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "casfs.json").write_text("{not json")
    r = doctor(tmp_path, root)
    assert r.returncode == 1
    checks = {c["check"]: c for c in json.loads(r.stdout)}
    assert checks["shared_root"]["status"] == "fail"
    assert "casfs.json" in checks["shared_root"]["detail"]
