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


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone meanwhile
        return b""


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


def test_doctor_finds_the_dead_mount_a_killed_casfs_run_left(tmp_path: Path) -> None:
    """kill -9 of casfs run, its job and its mount process leaves a FUSE mount in no
    registry (ENOTCONN): doctor said "OK 0 running mounts" (a review). It names it now."""
    import signal
    import time

    import pytest

    from casfs.node import control
    from tests.fusehelpers import require_fuse

    require_fuse()
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"),
               CASFS_STATE_DIR=str(tmp_path / "state"), CASFS_MOUNT_BASE=str(tmp_path / "mnt"),
               CASFS_SERVE_BASE=str(tmp_path / "serve"),
               CASFS_SOCKET=str(tmp_path / "no-daemon.sock"))
    flag = tmp_path / "job-running"
    run = subprocess.Popen(
        [sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic", "--python",
         sys.executable, "--", sys.executable, "-c",
         f"import time; open({str(flag)!r}, 'w'); time.sleep(120)"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    mounts: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while not flag.exists():
            assert run.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        pids = [int(m["pid"]) for m in control.registered(tmp_path / "state" / "run")]
        assert pids
        job = [int(p) for p in os.listdir("/proc") if p.isdigit()
               and str(flag).encode() in _cmdline(p)]
        for pid in [run.pid, *job, *pids]:
            os.kill(pid, signal.SIGKILL)
        run.wait(30)
        time.sleep(0.5)
        mounts = [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()
                  if str(tmp_path / "serve") in ln.split()[4]]
        if not mounts:
            pytest.skip("the kernel ended the mount with its process (nothing left to find)")
        r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "doctor", "--json"],
                           env=env, capture_output=True, text=True, check=False, timeout=120)
        checks = {c["check"]: c for c in json.loads(r.stdout)}
        assert checks["mounts"]["status"] == "fail", checks["mounts"]
        assert "dead mounts (ENOTCONN)" in checks["mounts"]["detail"]
        assert mounts[0] in checks["mounts"]["detail"]
    finally:
        if run.poll() is None:
            run.kill()
        for mp in mounts:
            subprocess.run(["umount", "-l", mp], check=False, capture_output=True)
