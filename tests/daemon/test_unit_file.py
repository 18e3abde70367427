"""The shipped systemd unit passes ``systemd-analyze verify`` and keeps the properties
the daemon relies on; the example config and install script are valid."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import VENV_BIN

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "daemon" / "casfsd.service"

# Each of these makes systemd unshare the unit's mount namespace, which hides the
# FUSE mounts from every job on the node.
NAMESPACING = ("ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices",
               "ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths", "ProtectKernelTunables",
               "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups",
               "PrivateMounts", "TemporaryFileSystem", "BindPaths", "MountFlags")


def unit_settings() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";")):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.fail("systemd-analyze is missing (Debian package systemd)")
    unit = tmp_path / "casfsd.service"
    config = tmp_path / "casfs.toml"
    shutil.copy(REPO / "daemon" / "casfs.toml", config)
    text = re.sub(r"(?m)^ExecStart=\S+ --config \S+",
                  f"ExecStart={VENV_BIN / 'casfsd'} --config {config}", UNIT.read_text())
    assert text != UNIT.read_text()
    unit.write_text(text)
    r = subprocess.run([exe, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    problems = [ln for ln in (r.stdout + r.stderr).splitlines() if "casfsd.service" in ln]
    assert r.returncode == 0, r.stdout + r.stderr
    assert not problems, problems


def test_unit_keeps_what_casfsd_needs() -> None:
    s = unit_settings()
    assert s["Type"] == "notify"
    assert s["ExecStart"] == "/usr/local/bin/casfsd --config /etc/casfs/casfs.toml"
    assert s["KillMode"] == "process"  # mount processes outlive a restart: adopted
    assert s["Restart"] == "on-failure"
    assert "ExecStop" not in s
    assert s["DeviceAllow"] == "/dev/fuse rw"
    assert "CAP_SYS_ADMIN" in s["CapabilityBoundingSet"].split()
    assert "@mount" in s["SystemCallFilter"].split()
    assert "pidfd_getfd" in s["SystemCallFilter"].split()  # crash adoption (fuseconn)
    # longer than the default shutdown_timeout (30 s) plus the worker's 15 s grace
    assert int(s["TimeoutStopSec"]) > 45
    assert not [k for k in NAMESPACING if k in s]


def test_example_config_checks(tmp_path: Path) -> None:
    """daemon/casfs.toml parses; only its machine-specific paths are swapped for tmp ones."""
    text = (REPO / "daemon" / "casfs.toml").read_text()
    text = text.replace("/shared/casfs", str(tmp_path / "root"))
    text = text.replace("/var/lib/casfs", str(tmp_path / "state"))
    text = text.replace("/run/casfs", str(tmp_path / "mnt"))
    cfg = tmp_path / "casfs.toml"
    cfg.write_text(text)
    r = subprocess.run([str(VENV_BIN / "casfsd"), "--config", str(cfg), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    names = [ln.split(":")[0] for ln in r.stdout.splitlines()[:-1]]
    assert names == ["triton", "inductor", "vllm"]
    assert "configuration OK: 3 mounts" in r.stdout


def test_install_script_and_tmpfiles_parse() -> None:
    r = subprocess.run(["sh", "-n", str(REPO / "daemon" / "install.sh")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    tmpfiles = REPO / "daemon" / "casfs-tmpfiles.conf"
    entries = [ln.split() for ln in tmpfiles.read_text().splitlines()
               if ln.strip() and not ln.startswith("#")]
    assert {e[1] for e in entries} >= {"/var/lib/casfs", "/run/casfs/triton"}
    assert all(len(e) >= 5 and e[0] == "d" for e in entries), entries
