"""Dir mode never writes through a tenant's symlinks (issue 21, break 3), with a real user.

Before: casfsd (root) restored and refreshed a dir-mode cache on path strings
inside the tenant's directory (``mkdir -p``, a temp file, then ``link`` on
restore or ``rename`` on refresh). The tenant pointed a key directory at a
root-only directory and published into that key from another node: casfsd
wrote her bytes there as root (``/etc/cron.d`` made that root on the node).
Now every path is resolved beneath an fd of the directory with no symlink
followed (casfs.util.beneath), written with the tenant's fs credentials, and a
path through a symlink is skipped: a miss, logged at WARNING once with its path.

The mount is driven in this process (MountService in dir mode, as casfsd runs it:
root, the namespace's tenant a real user) through the same calls its refresh
makes; the attacker's moves are the user's own commands.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs.node.config import MountConfig
from casfs.node.mount import MountService
from casfs.store.entry import Entry
from casfs.store.generations import REPLACE
from casfs.store.root import SharedRoot
from casfs.tenants import DEFAULT_POLICY
from tests.users import RealUser, open_tmp, real_users

MTIME = 1_700_000_000_000_000_000


@pytest.fixture
def setting() -> Iterator[tuple[RealUser, Path]]:
    with open_tmp() as d, real_users(1, d) as users:
        yield users[0], d


def publish(root_dir: Path, ns: str, files: dict[str, bytes], mtime: int = MTIME) -> None:
    """Another node of the tenant publishes ``files`` (a generation each call)."""
    root = SharedRoot.open(root_dir, create=True)
    entries = [Entry(rel, root.objects.put_bytes(data).digest, len(data), 0o644, mtime,
                     {REPLACE: True} if rel.endswith(".best_config") else None)
               for rel, data in files.items()]
    res = root.generations().publish(ns, entries, node="other")
    assert res.conflicts == 0, res


def service(d: Path, user: RealUser, family: str, stable_after: float = 0.2) -> MountService:
    """A dir-mode mount of ``user``'s namespace ``<tenant>~ns``, as casfsd runs it."""
    tenant = user.tenant
    cfg = MountConfig(name=f"{tenant}/ns", family=family, namespace=f"{tenant}~ns",
                      mountpoint=d / "mnt" / tenant / "ns", root=d / "root",
                      state_dir=d / "state", mode="dir", tenant=tenant,
                      tenants=DEFAULT_POLICY.to_dict(), stable_after=stable_after)
    (d / "mnt" / tenant).mkdir(parents=True)
    return MountService(cfg, hosted=True)


def root_only(d: Path) -> Path:
    target = d / "rootonly"
    target.mkdir(mode=0o700)
    (target / "existing").write_bytes(b"root's\n")
    return target


def swap_for_symlink(user: RealUser, mp: Path, key: str, target: Path) -> None:
    r = user.sh(f"cd {mp} && mv {key} {key}.old && ln -s {target} {key}")
    assert r.returncode == 0, r.stderr
    assert (mp / key).is_symlink()


@pytest.mark.expect_log(r"not restoring KEY/cron: a symlink or a file in its path")
def test_restore_into_a_key_dir_swapped_for_a_symlink_writes_nothing_there(
        setting: tuple[RealUser, Path], caplog: pytest.LogCaptureFixture) -> None:
    user, d = setting
    ns = f"{user.tenant}~ns"
    target = root_only(d)
    publish(d / "root", ns, {"KEY/k.json": b"{}"})
    svc = service(d, user, "generic")
    try:
        svc.server.restore()  # type: ignore[attr-defined]  # what serving starts with
        mp = svc.cfg.mountpoint
        assert (mp / "KEY/k.json").read_bytes() == b"{}"
        swap_for_symlink(user, mp, "KEY", target)
        publish(d / "root", ns, {"KEY/cron": b"* * * * * root sh -c pwned\n"})
        with caplog.at_level(logging.WARNING):
            assert svc.refresh_once()["ok"]
            publish(d / "root", ns, {"OTHER/x": b"x"})
            assert svc.refresh_once()["ok"]  # tried again: still refused, not warned again
        assert sorted(os.listdir(target)) == ["existing"]
        assert (mp / "OTHER/x").read_bytes() == b"x"
        for p in ("KEY.old", "KEY.old/k.json", "OTHER", "OTHER/x"):  # written as the tenant
            assert (mp / p).stat().st_uid == user.uid, p
        warned = [r for r in caplog.records if "KEY/cron" in r.getMessage()
                  and r.levelno == logging.WARNING]
        assert len(warned) == 1, [r.getMessage() for r in caplog.records]
        assert svc.counters.get("restore_refused") == 2
    finally:
        svc.close()


def test_refresh_of_a_replaced_path_through_a_symlink_replaces_nothing(
        setting: tuple[RealUser, Path]) -> None:
    """A replaced path (inductor's ``*.best_config``: the newest version wins) whose key
    directory the tenant swapped for a symlink to a root-only directory holding a file
    of the published version's size and mtime: the refresh's rename stays out."""
    user, d = setting
    ns = f"{user.tenant}~ns"
    target = root_only(d)
    v1 = b'{"num_warps": 4}'
    publish(d / "root", ns, {"KEY/k.best_config": v1})
    svc = service(d, user, "inductor")
    try:
        svc.server.restore()  # type: ignore[attr-defined]
        mp = svc.cfg.mountpoint
        assert (mp / "KEY/k.best_config").read_bytes() == v1
        swap_for_symlink(user, mp, "KEY", target)
        victim = target / "k.best_config"  # a root file that looks like the published one
        victim.write_bytes(b"x" * len(v1))
        os.utime(victim, ns=(MTIME, MTIME))
        publish(d / "root", ns, {"KEY/k.best_config": b'{"num_warps": 8}'}, MTIME + 10**9)
        assert svc.refresh_once() == {"ok": True, "served_seq": 2}
        assert victim.read_bytes() == b"x" * len(v1)
        assert sorted(os.listdir(target)) == ["existing", "k.best_config"]
        # The tenant's own directory is refreshed as before once the link is gone.
        r = user.sh(f"cd {mp} && rm KEY && mv KEY.old KEY")
        assert r.returncode == 0, r.stderr
        publish(d / "root", ns, {"KEY/k.best_config": b'{"num_warps": 2}'}, MTIME + 2 * 10**9)
        assert svc.refresh_once()["ok"]
        assert (mp / "KEY/k.best_config").read_bytes() == b'{"num_warps": 2}'
    finally:
        svc.close()
        shutil.rmtree(target, ignore_errors=True)
