"""Tenant resolution (casfs.tenants) and the [tenants] configuration."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from casfs.daemon import config as dconfig
from casfs.errors import ConfigError, UsageError
from casfs.store.generations import check_name
from casfs.tenants import (
    Credentials,
    Domain,
    TenantPolicy,
    pod_uid,
    split_store_namespace,
)

POD = "0f5d3c1e-8a2b-4c6d-9e0f-1a2b3c4d5e6f"
SYSTEMD_POD = ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
               f"{POD.replace('-', '_')}.slice/cri-containerd-abc.scope")
CGROUPFS_POD = f"/kubepods/besteffort/pod{POD}/0123456789abcdef"


def creds(uid: int, *groups: int, cgroup: str = "") -> Credentials:
    return Credentials(uid, uid, frozenset({uid, *groups}), cgroup)


def test_default_tenant_is_the_uid_and_root_keeps_plain_names() -> None:
    p = TenantPolicy()
    t = p.resolve(creds(1234))
    assert t.id == "u1234" and t.uid == 1234 and t.dir_mode == 0o700
    assert t.store_namespace("triton-abc") == "u1234~triton-abc"
    assert p.resolve(creds(0)).store_namespace("triton-abc") == "triton-abc"
    assert split_store_namespace("u1234~triton-abc") == ("u1234", "triton-abc")
    assert split_store_namespace("triton-abc") == (None, "triton-abc")
    assert check_name("u1234~triton-abc") and check_name("ml-team~vllm-0.8")
    for bad in ("~x", "U1~x", "a~b~c", "u1~.x"):
        with pytest.raises(UsageError):
            check_name(bad)


def test_domains_by_uid_group_and_cluster_mode() -> None:
    p = TenantPolicy(domains=(Domain("alice", uids=frozenset({1001})),
                              Domain("ml", gids=frozenset({500}))))
    assert p.resolve(creds(1001, 500)).id == "alice"  # uid rules first
    ml = p.resolve(creds(1002, 500))
    assert (ml.id, ml.uid, ml.gid, ml.dir_mode) == ("ml", 0, 500, 0o2770)
    assert p.resolve(creds(1003, 501)).id == "u1003"
    assert p.may_write("ml", 0) and not p.may_write("ml", 1003)
    assert p.group_may_write("ml", 500) and not p.group_may_write("ml", 501)
    assert not p.may_write("u1003", 1002) and p.may_write("u1003", 1003)
    assert not p.may_write(None, 1003)  # plain names are root's in uid mode
    cluster = TenantPolicy(mode="cluster")
    t = cluster.resolve(creds(1003))
    assert t.id == "cluster" and t.store_namespace("ns") == "ns" and t.dir_mode == 0o1777
    assert cluster.may_write(None, 1003)


def test_pods_are_told_apart_by_cgroup_not_uid(tmp_path: Path) -> None:
    assert pod_uid(SYSTEMD_POD) == POD and pod_uid(CGROUPFS_POD) == POD
    assert pod_uid("/user.slice/user-1000.slice") is None
    labels = tmp_path / "pods.json"
    p = TenantPolicy(domains=(Domain("vision", cgroups=("*pod11111111*",)),
                              Domain("nlp", gids=frozenset({77}))), pod_tenants=labels)
    # Unlabelled pod: no tenant (never "whoever runs as root").
    with pytest.raises(UsageError, match="has no casfs tenant"):
        p.resolve(creds(0, cgroup=SYSTEMD_POD))
    labels.write_text(json.dumps({POD: "nlp"}))
    assert p.resolve(creds(0, cgroup=SYSTEMD_POD)).id == "nlp"
    assert p.resolve(creds(1000, cgroup=CGROUPFS_POD)).id == "nlp"  # uid says nothing
    other = CGROUPFS_POD.replace(POD, "11111111-2222-3333-4444-555555555555")
    assert p.resolve(creds(0, cgroup=other)).id == "vision"
    labels.write_text(json.dumps({POD: "not-declared"}))  # labels name declared domains only
    with pytest.raises(UsageError):
        p.resolve(creds(0, cgroup=SYSTEMD_POD))


def test_credentials_of_a_process() -> None:
    c = Credentials.of_pid(os.getpid(), os.getuid(), os.getgid())
    assert c.uid == os.getuid() and os.getgid() in c.groups
    assert Credentials.of_self().cgroup == ""  # pod rules never apply to oneself


def test_policy_round_trips_to_workers() -> None:
    p = TenantPolicy(trust="owner", domains=(Domain("ml", frozenset({1}), frozenset({2}),
                                                    ("*x*",), ()),))
    assert TenantPolicy.from_dict(p.to_dict()) == p


# --- configuration ---------------------------------------------------------------------
def load(tmp: Path, tenants: str, mount_extra: str = "") -> dconfig.DaemonConfig:
    p = tmp / "casfs.toml"
    p.write_text(f'[store]\nroot = "{tmp}/root"\n[node]\nstate_dir = "{tmp}/state"\n'
                 f'{tenants}\n[[mounts]]\nname = "kern"\nnamespace = "kern-ns"\n{mount_extra}\n')
    return dconfig.load(p)


def test_tenants_config(tmp_path: Path) -> None:
    cfg = load(tmp_path, '[tenants]\nmode = "uid"\n[[tenants.domains]]\nname = "ml"\n'
                         'groups = [0]\ncgroups = ["*pod*"]\n', 'tenant = "ml"')
    assert cfg.tenants.domains == (Domain("ml", gids=frozenset({0}), cgroups=("*pod*",)),)
    (m,) = cfg.mount_configs()
    assert m.tenant == "ml" and m.namespace == "ml~kern-ns"
    assert TenantPolicy.from_dict(m.tenants) == cfg.tenants
    # No tenant on a static mount: the daemon's own (root: the plain name, as before).
    (m,) = load(tmp_path, "").mount_configs()
    assert m.tenant == f"u{os.geteuid()}"
    (m,) = load(tmp_path, '[tenants]\nmode = "cluster"\n').mount_configs()
    assert m.tenant == "cluster" and m.namespace == "kern-ns"


@pytest.mark.parametrize(("tenants", "mount_extra", "key"), [
    ('[tenants]\nmode = "everyone"', "", "tenants.mode: expected one of uid, cluster"),
    ('[tenants]\ntrust = "vibes"', "", "tenants.trust: expected one of owner, signature"),
    ('[tenants]\ntrust = "signature"', "", 'tenants.trust: "signature" needs'),
    ('[tenants]\ntrusted_keys = ["abc"]', "", "tenants.trusted_keys[0]: expected an ed25519"),
    ('[tenants]\nsigning_key = "/nonexistent/k"', "", "tenants.signing_key: cannot read"),
    ("[tenants]\nfoo = 1", "", "tenants.foo: unknown key"),
    ('[[tenants.domains]]\nname = "u12"\nusers = [1]', "", "tenants.domains[0].name:"),
    ('[[tenants.domains]]\nname = "x"\nusers = [1, 2]', "", "tenants.domains[0].groups: a domain"),
    ('[[tenants.domains]]\nname = "x"', "", "has no users, groups or cgroups"),
    ('[[tenants.domains]]\nname = "x"\ngroups = ["no-such-group-xyz"]', "",
     "tenants.domains[0].groups[0]: unknown group"),
    ('[[tenants.domains]]\nname = "x"\nusers = [true]', "", "tenants.domains[0].users: expected"),
    ('[[tenants.domains]]\nname = "x"\nusers = [1]\n[[tenants.domains]]\nname = "x"\nusers = [2]',
     "", "tenants.domains[1].name: 'x' is declared twice"),
    ("", 'tenant = "nobody-declared"', "mounts[0].tenant: unknown tenant"),
    ('[tenants]\nmode = "cluster"', 'tenant = "u5"', 'mounts[0].tenant: tenants.mode is "cluster"'),
])
def test_bad_tenants_config(tmp_path: Path, tenants: str, mount_extra: str, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, tenants, mount_extra)
    assert key in e.value.message and "\n" not in e.value.message


def test_proc_is_not_believed_for_another_uid() -> None:
    """A pid reused by another user's process must not lend its groups or pod."""
    me = os.getpid()
    other = Credentials.of_pid(me, os.getuid() + 12345, 777)
    assert other.groups == frozenset({777}) and other.cgroup == ""


def test_a_users_command_drops_a_signing_key_it_cannot_read(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from casfs.store.tenancy import public_key_b64

    key = Ed25519PrivateKey.generate()
    cfg = tmp_path / "casfs.toml"
    cfg.write_text(f'[tenants]\ntrust = "signature"\nsigning_key = "{tmp_path}/none.key"\n'
                   f'trusted_keys = ["{public_key_b64(key)}"]\n')
    p = dconfig.load_tenants(cfg)  # casfs run as a user: unsigned records, never a failure
    assert p.signing_key is None and p.trust == "signature"
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path, cfg.read_text())  # casfsd itself refuses a key it cannot read
