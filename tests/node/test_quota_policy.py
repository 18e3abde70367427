"""[quota]: parsing, the per-process count each tenant shares across its namespaces,
where a tenant's uppers live with mechanism "loopfs", and the default reserve."""

from __future__ import annotations

from pathlib import Path

import pytest

from casfs.daemon import config
from casfs.errors import ConfigError
from casfs.node import quota
from casfs.node.config import HostConfig, MountConfig
from casfs.util import diskroom


def load(tmp_path: Path, text: str) -> config.DaemonConfig:
    p = tmp_path / "casfs.toml"
    p.write_text(f'[node]\nstate_dir = "{tmp_path}/state"\n{text}')
    return config.load(p)


def test_quota_keys(tmp_path: Path) -> None:
    c = load(tmp_path, '[quota]\nbytes = "5%"\ninodes = 1000\nreserve = "2GiB"\n')
    assert c.quota == quota.QuotaPolicy(bytes=0.05, inodes=1000, reserve=2 << 30)
    hc = c.host_config()
    assert hc is not None and hc.quota == c.quota.to_dict()
    assert hc.ns_config("u1", "generic", "ns").quota == c.quota.to_dict()
    off = load(tmp_path, '[quota]\nbytes = 0\ninodes = "off"\nreserve = 0\n').quota
    assert (off.bytes, off.inodes, off.reserve_bytes(tmp_path)) == (None, None, 0)
    assert load(tmp_path, "").quota == quota.QuotaPolicy()  # the defaults: 10%, 1M, auto
    for bad, key in (('bytes = "150%"', "quota.bytes"), ('mechanism = "xfs"', "quota.mechanism"),
                     ("inodes = -1", "quota.inodes"), ("color = 1", "quota.color"),
                     ('bytes = 0\nmechanism = "loopfs"', "quota.bytes")):
        with pytest.raises(ConfigError, match=key):
            load(tmp_path, f"[quota]\n{bad}\n")


def cfg(tmp_path: Path, tenant: str, ns: str, **kw: object) -> MountConfig:
    return MountConfig(name=ns, family="generic", namespace=f"{tenant}~{ns}",
                       mountpoint=tmp_path / "mnt" / ns, root=tmp_path / "root",
                       state_dir=tmp_path / "state", tenant=tenant, **kw)  # type: ignore[arg-type]


def test_a_tenant_shares_one_count_in_a_process(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    q = {"bytes": 1 << 20, "inodes": 10}
    a1 = quota.tenant_quota(cfg(tmp_path, "ua", "one", quota=q))
    a2 = quota.tenant_quota(cfg(tmp_path, "ua", "two", quota=q))
    b = quota.tenant_quota(cfg(tmp_path, "ub", "one", quota=q))
    assert a1 is a2 and a1 is not b
    assert a1 is not None and a1.max_bytes == 1 << 20 and a1.max_inodes == 10
    assert b is not None and a1.reserve is b.reserve  # the state filesystem's: one for all
    none = {"bytes": None, "inodes": None, "reserve": 0}
    assert quota.tenant_quota(cfg(tmp_path, "uc", "x", quota=none)) is None


def test_loopfs_puts_a_tenants_uppers_on_its_filesystem(tmp_path: Path) -> None:
    c = cfg(tmp_path, "ua", "one", quota={"mechanism": "loopfs", "bytes": 1 << 30})
    fs = tmp_path / "state" / "quota" / "ua"
    assert c.quota_fs == fs and c.upper == fs / "upper" / "ua~one"
    assert c.overlay_work == fs / "work" / "ua~one"  # overlayfs: work beside the upper
    plain = cfg(tmp_path, "ua", "one")
    assert plain.upper == tmp_path / "state" / "upper" / "ua~one"
    assert HostConfig(base=tmp_path, root=tmp_path, state_dir=tmp_path,
                      quota={"mechanism": "loopfs"}).ns_config("u1", "g", "n").quota_fs


def test_default_reserve() -> None:
    gib = 1 << 30
    sizes = {64 << 20: (64 << 20) // 10, 15 * gib: gib, 100 * gib: 5 * gib}
    for size, want in sizes.items():
        assert min(max(gib, size // 20), size // 10) == want
    assert diskroom.default_reserve("/") > 0
