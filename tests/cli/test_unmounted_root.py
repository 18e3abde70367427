"""A shared root under a filesystem /etc/fstab lists but that is not mounted (NFS down
at boot, not up yet): casfs must not create the root on the local disk beneath it,
where the node would silently share with nobody."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from casfs.store.root import SharedRoot

pytestmark = pytest.mark.fuse


def cli(tmp: Path, *args: str, root: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CASFS_ROOT=str(root), CASFS_STATE_DIR=str(tmp / "state"),
               CASFS_MOUNT_BASE=str(tmp / "mnt"), CASFS_SOCKET=str(tmp / "no-daemon.sock"),
               CASFS_FSTAB=str(tmp / "fstab"))
    return subprocess.run([sys.executable, "-m", "casfs.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.expect_log(
    r"shared root unavailable, serving local state only: not creating a shared root at .*"
    r" is in the fstab but not mounted",
)
def test_no_root_is_created_under_an_unmounted_shared_filesystem(tmp_path: Path) -> None:
    shared = tmp_path / "shared"  # the mount point of the cluster's NFS export
    shared.mkdir()
    (tmp_path / "fstab").write_text(f"# test\nnfs1:/export {shared} nfs4 defaults,_netdev 0 0\n")
    root = shared / "casfs"
    r = cli(tmp_path, "init", str(root), root=root)
    assert r.returncode != 0
    assert f"{shared} is in the fstab but not mounted" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    # A job still runs (its cache is this node's alone) and nothing lands on the local disk.
    r = cli(tmp_path, "run", "--family", "generic", "--python", sys.executable, "--", "sh",
            "-c", 'mkdir -p "$CASFS_CACHE_DIR/k" && echo x > "$CASFS_CACHE_DIR/k/f"',
            root=root)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not root.exists()
    # Once the filesystem is mounted (a bind mount stands in for NFS), the root is made there.
    real = tmp_path / "export"
    real.mkdir()
    subprocess.run(["mount", "--bind", str(real), str(shared)], check=True)
    try:
        r = cli(tmp_path, "run", "--family", "generic", "--python", sys.executable, "--", "sh",
                "-c", 'mkdir -p "$CASFS_CACHE_DIR/k2" && echo y > "$CASFS_CACHE_DIR/k2/g"',
                root=root)
        assert r.returncode == 0, r.stderr[-3000:]
        gens = SharedRoot.open(real / "casfs").generations()
        (ns,) = gens.namespaces()
        assert "k2/g" in gens.snapshot(gens.latest(ns)).entries
    finally:
        subprocess.run(["umount", "-l", str(shared)], check=False)
