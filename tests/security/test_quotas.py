"""Quotas a tenant cannot exceed (issue 21): one tenant's writes never fill the disk
another tenant or the node index writes to.

Before: nothing bounded a tenant's uppers (written as root, so user quotas did not
apply; ``namespace_max_bytes`` bounds publication only), nor dir-mode directories:
another tenant's write got ENOSPC and LMDB failed to commit. Now:

* fuse mode: the view counts each tenant's upper bytes and inodes; past the bound
  the writer gets EDQUOT (at write, or at close with the writeback cache), and no
  upper growth may take the state filesystem below its reserve (ENOSPC);
* overlay and dir modes (the kernel writes, casfs sees nothing): [quota] mechanism
  "loopfs" puts each tenant's uppers and directories on its own filesystem, made
  by the node on a loop device: past its size the writer gets ENOSPC, and the
  other tenant and the state filesystem (the index) do not notice.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from casfs.node import quota
from casfs.tenants import TenantPolicy
from casfs.view import overlay
from tests.node.conftest import Node, require_fuse
from tests.node.test_two_nodes import published
from tests.users import RealUser, open_tmp, real_users

pytestmark = [pytest.mark.fuse, pytest.mark.slow]
MiB = 1 << 20


def write_as(user: RealUser, path: Path, nbytes: int) -> int:
    """``user`` writes ``nbytes`` to ``path`` 1 MiB at a time and closes it: 0, or the
    errno of the write or close that failed (the job's view of a full disk)."""
    code = (f"import os\ntry:\n  f = open({str(path)!r}, 'wb')\n"
            f"  for _ in range({max(1, nbytes // MiB)}):\n"
            f"    f.write(b'x' * {min(nbytes, MiB)})\n"
            "  f.close()\n  print(0)\n"
            "except OSError as e:\n  print(e.errno)\n")
    r = user.python(code)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip().splitlines()[-1])


def mkdirs_as(user: RealUser, top: Path, n: int) -> int:
    """``user`` makes ``n`` directories under ``top``: 0, or the errno that stopped it."""
    code = (f"import os\ntry:\n  [os.mkdir(os.path.join({str(top)!r}, f'd{{i}}'))"
            f" for i in range({n})]\n  print(0)\n"
            "except OSError as e:\n  print(e.errno)\n")
    r = user.python(code)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip().splitlines()[-1])


def free(path: Path) -> int:
    s = os.statvfs(path)
    return s.f_bavail * s.f_frsize


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True, timeout=30)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)


@contextlib.contextmanager
def two_tenants(tmp_path: Path) -> Iterator[tuple[Path, RealUser, RealUser]]:
    require_fuse()
    with open_tmp() as shared, real_users(2, shared) as (victim, attacker):
        yield shared, victim, attacker


def mount_for(node: Node, user: RealUser, mp: Path, **kw: Any) -> Any:
    return node.mount(name=f"m-{user.tenant}", mountpoint=mp,
                      namespace=f"{user.tenant}~testns", tenant=user.tenant,
                      tenants=TenantPolicy().to_dict(), allow_other=True, **kw)


def test_fuse_mode_bounds_a_tenants_bytes_and_inodes(tmp_path: Path) -> None:
    with two_tenants(tmp_path) as (shared, victim, attacker):
        node = Node("a", tmp_path / "root", tmp_path / "state", shared / "mnt")
        q = {"bytes": 4 * MiB, "inodes": 64}
        try:
            wa = mount_for(node, attacker, shared / "mnt" / "a", quota=q)
            wv = mount_for(node, victim, shared / "mnt" / "v", quota=q)
            a, v = wa.cfg.mountpoint, wv.cfg.mountpoint
            # Inodes: EDQUOT, at once.
            assert mkdirs_as(attacker, a, 1000) == errno.EDQUOT
            upper = wa.cfg.upper
            assert sum(len(files) + len(dirs) for _, dirs, files in os.walk(upper)) == 64
            attacker.sh(f"rmdir {a}/d*")
            # Bytes: ENOSPC (at write or close: the kernel keeps only that errno through
            # its writeback cache).
            assert write_as(attacker, a / "small.so", MiB) == 0
            assert write_as(attacker, a / "big.so", 8 * MiB) == errno.ENOSPC
            assert write_as(attacker, a / "more.so", 4 * MiB) == errno.ENOSPC
            assert sum(f.stat().st_size for f in upper.iterdir()) <= 4 * MiB
            # The other tenant is untouched, and the node index commits its files.
            assert write_as(victim, v / "kernel.so", 3 * MiB) == 0
            assert mkdirs_as(victim, v, 50) == 0
            assert node.ask(wv, "publish")["ok"] is True
            assert "kernel.so" in published(node.root, f"{victim.tenant}~testns")
            # Removing gives back: the attacker writes again.
            attacker.sh(f"rm -f {a}/big.so {a}/more.so")
            assert write_as(attacker, a / "again.so", 2 * MiB) == 0
        finally:
            node.stop_all()


def test_fuse_mode_keeps_the_state_filesystems_reserve(tmp_path: Path) -> None:
    """Without per-tenant bounds, the reserve alone: a tenant writing without end gets
    ENOSPC while the state filesystem still has its reserve free, and the node index
    still commits (a publication of what was written before)."""
    with two_tenants(tmp_path) as (shared, _victim, attacker), \
            tmpfs(tmp_path / "state", "64m") as state:
        node = Node("a", tmp_path / "root", state, shared / "mnt")
        try:
            w = mount_for(node, attacker, shared / "mnt" / "a",
                          quota={"bytes": None, "inodes": None})
            mp = w.cfg.mountpoint
            assert write_as(attacker, mp / "first.so", MiB) == 0
            assert write_as(attacker, mp / "fill.so", 200 * MiB) == errno.ENOSPC
            assert write_as(attacker, mp / "fill2.so", 200 * MiB) == errno.ENOSPC
            reserve = quota.QuotaPolicy().reserve_bytes(state)  # 6.4 MiB of 64
            assert free(state) >= reserve - MiB, (free(state), reserve)
            assert node.ask(w, "publish")["ok"] is True
            assert "first.so" in published(node.root, f"{attacker.tenant}~testns")
        finally:
            node.stop_all()


# 24 MiB: what is left after ext4's journal (4 MiB at this size) and inode tables
LOOPFS = {"bytes": 24 * MiB, "inodes": 256, "mechanism": "loopfs"}


# dir mode copies published files into the directory; on the attacker's full filesystem
# that copy fails (a miss for its jobs), which is the bound working.
@pytest.mark.expect_log(r"not restoring \S+: \[Errno 28\] No space left on device")
@pytest.mark.parametrize("mode", ["overlay", "dir"])
def test_loopfs_bounds_what_the_kernel_writes(tmp_path: Path, mode: str) -> None:
    """overlay and dir modes: the kernel (or the job) writes the upper directly, so the
    tenant's own filesystem (a loop device the node makes) is the bound."""
    if (why := quota.loopfs_unavailable()) is not None:
        pytest.fail(f"loopfs is unavailable here: {why}")
    if mode == "overlay" and (why := overlay.unavailable_reason()) is not None:
        pytest.fail(f"overlay mode is unavailable here: {why}")
    # The state dir on its own small filesystem: what reaches it is measured exactly.
    with two_tenants(tmp_path) as (shared, victim, attacker), \
            tmpfs(tmp_path / "state", "128m") as state:
        node = Node("a", tmp_path / "root", state, shared / "mnt")
        try:
            wa = mount_for(node, attacker, shared / "mnt" / "a", quota=LOOPFS, mode=mode)
            wv = mount_for(node, victim, shared / "mnt" / "v", quota=LOOPFS, mode=mode)
            a, v = wa.cfg.mountpoint, wv.cfg.mountpoint
            fs = state / "quota" / attacker.tenant
            assert os.path.ismount(fs) and os.path.ismount(state / "quota" / victim.tenant)
            assert wa.cfg.writable_dir.stat().st_dev == fs.stat().st_dev
            before = free(state)
            assert write_as(attacker, a / "big.so", 64 * MiB) == errno.ENOSPC
            assert mkdirs_as(attacker, a, 2000) == errno.ENOSPC
            assert free(state) >= before - MiB  # the state filesystem did not notice
            assert write_as(victim, v / "kernel.so", 4 * MiB) == 0
            assert mkdirs_as(victim, v, 100) == 0
            assert node.ask(wv, "publish")["ok"] is True
            assert "kernel.so" in published(node.root, f"{victim.tenant}~testns")
            attacker.sh(f"rm -rf {a}/big.so {a}/d*")
            # Her space comes back once nothing holds the deleted file open (promotion
            # may be reading it right now: a large file is read twice, up to seconds
            # on a loaded machine).
            deadline = time.monotonic() + 60
            while (err := write_as(attacker, a / "again.so", 2 * MiB)) == errno.ENOSPC \
                    and time.monotonic() < deadline:
                time.sleep(0.5)
            assert err == 0
        finally:
            node.stop_all()
            quota.unmount_all(state)
