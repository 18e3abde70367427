"""Overlay mode gives no other user a way in (issue 21, break 2).

Before: serving a namespace in overlay mode chmodded the upper (the merged root)
to 1777 after it was given to the tenant, and the links layer's directories were
0777: any local user planted ``KEYDIR/kernel.so`` in a tenant's cache, the
tenant's jobs loaded it, and casfsd published it to every node. Now every
directory of the merged view and of the links layer is the tenant's, with the
tenant's mode, and another user's write is refused by the kernel."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from casfs.tenants import TenantPolicy
from casfs.view import overlay
from tests.node.conftest import Node, require_fuse
from tests.node.test_two_nodes import seed
from tests.users import open_tmp, real_users

pytestmark = [pytest.mark.fuse, pytest.mark.slow]


def _wide_dirs(top: Path) -> list[str]:
    """Directories under ``top`` (itself included) that others may write."""
    out = []
    for dirpath, _, _ in os.walk(top):
        mode = os.lstat(dirpath).st_mode
        if stat.S_IMODE(mode) & 0o002:
            out.append(f"{dirpath} {stat.S_IMODE(mode):04o}")
    return out


def test_no_user_but_the_tenant_writes_an_overlay_cache(tmp_path: Path) -> None:
    require_fuse()
    if (why := overlay.unavailable_reason()) is not None:
        pytest.fail(f"overlay mode is unavailable here: {why}")
    with open_tmp() as shared, real_users(2, shared) as (victim, attacker):
        ns = f"{victim.tenant}~testns"
        root = tmp_path / "root"
        seed(root, {"K0/k.cubin": b"published kernel", "K1/deep/k.so": b"x" * 100}, ns=ns,
             tmp=tmp_path)
        node = Node("a", root, tmp_path / "state", shared / "mnt")
        # Read once through FUSE so K0's object is local: the links layer then holds K0/.
        w = node.mount(namespace=ns, tenant=victim.tenant,
                       tenants=TenantPolicy().to_dict(), allow_other=True)
        assert victim.sh(f"cat {w.cfg.mountpoint}/K0/k.cubin").stdout == "published kernel"
        node.stop(w)
        w = node.mount(namespace=ns, tenant=victim.tenant, tenants=TenantPolicy().to_dict(),
                       mode="overlay", allow_other=True)
        try:
            mnt = w.cfg.mountpoint
            links = overlay.OverlayPaths(w.cfg.upper, w.cfg.overlay_base).links
            assert (links / "K0").is_dir()  # the test means what it says: K0/ is linked
            # The attacker plants a kernel at the top, in a linked dir, in a FUSE-only dir.
            for target in ("KEYDIR", "K0", "K1/deep"):
                r = attacker.sh(f"mkdir -p {mnt}/{target} && echo evil > {mnt}/{target}/x.so")
                assert r.returncode != 0, (target, r.stdout, r.stderr)
            assert not (w.cfg.upper / "KEYDIR").exists()
            # The tenant still writes everywhere, and owns what overlayfs copied up.
            for target in ("NEW", "K0", "K1/deep"):
                r = victim.sh(f"mkdir -p {mnt}/{target} && echo mine > {mnt}/{target}/y.so")
                assert r.returncode == 0, (target, r.stderr)
            assert (w.cfg.upper / "K0").stat().st_uid == victim.uid
            assert _wide_dirs(links) == []
            assert _wide_dirs(w.cfg.upper) == []
            assert _wide_dirs(mnt) == []
        finally:
            node.stop_all()
