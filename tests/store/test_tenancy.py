"""Tenants on the shared root: ownership checks and signed records, with real users."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs.errors import HostileManifestError, UntrustedError
from casfs.store import maintenance, tenancy
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot, open_to_users
from casfs.tenants import Domain, TenantPolicy, store_namespace
from tests.users import RealUser, open_tmp, real_users

PUBLISH = """
import sys
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot
from casfs.daemon.config import load_tenants
# "open": a writer that ignores tenants (an attacker need not use casfs's checks)
root = SharedRoot.open(sys.argv[1], tenants=None if sys.argv[5:] else load_tenants())
ns, path, data = sys.argv[2], sys.argv[3], sys.argv[4].encode()
res = root.objects.put_bytes(data)
r = root.generations().publish(ns, [Entry(path, res.digest, len(data), 0o644, 0)], node="n")
print(r.seq)
"""


def publish_as(user: RealUser, root: Path, ns: str, path: str, data: str,
               *, open_writer: bool = False, config: Path | None = None) -> str:
    py_args = ["-c", PUBLISH, str(root), ns, path, data, *(["open"] if open_writer else [])]
    from tests.users import user_python

    env = user.env(**({"CASFS_CONFIG": str(config)} if config else {}))
    r = user.run([user_python()[0], *py_args], env=env)
    return r.stdout + r.stderr if r.returncode else ""


def put(root: SharedRoot, ns: str, path: str, data: bytes) -> int | None:
    res = root.objects.put_bytes(data)
    return root.generations().publish(
        ns, [Entry(path, res.digest, len(data), 0o644, 0)], node="n").seq


@pytest.fixture
def shared() -> Iterator[Path]:
    with open_tmp() as d:
        SharedRoot.open(d / "root", create=True)
        open_to_users(d / "root")
        yield d


@pytest.mark.expect_log(
    r"not serving namespace u\d+~inductor-y: .* is owned by uid \d+, outside tenant",
    r"moved namespace directory .* planted outside its tenant",
)
def test_a_tenants_namespace_is_its_own(shared: Path) -> None:
    """u1 cannot write into u2's namespace, nor pass off a directory of its own as u2's."""
    root_path = shared / "root"
    with real_users(2, shared) as (u1, u2):
        ns2 = store_namespace(u2.tenant, "triton-x")
        assert publish_as(u2, root_path, ns2, "k/kernel.so", "good") == ""
        d = root_path / "namespaces" / ns2
        st = d.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (u2.uid, 0o700)
        assert stat.S_IMODE((d / "generations").stat().st_mode) == 0o700

        # u1 can neither publish there nor even list it.
        out = publish_as(u1, root_path, ns2, "k/evil.so", "evil")
        assert "Permission denied" in out
        # u1 squats a name u2 has not used yet: neither u2's node nor u2 serves it...
        squat = store_namespace(u2.tenant, "inductor-y")
        assert publish_as(u1, root_path, squat, "k/kernel.so", "evil", open_writer=True) == ""
        node = root = SharedRoot.open(root_path, tenants=TenantPolicy())
        with pytest.raises(UntrustedError, match=f"uid {u1.uid}"):
            node.generations().latest_seq(squat)
        assert node.counters.get("untrusted_namespaces") == 1
        assert "owned by uid" in publish_as(u2, root_path, squat, "k/kernel.so", "good")
        # ...and casfsd (root) moves the planted directory aside when it publishes there.
        assert put(node, squat, "k/kernel.so", b"good") == 1
        snap = node.generations().entries(squat)
        assert root.objects.get_bytes(snap.entries["k/kernel.so"].digest) == b"good"
        # ...and u2's own namespace is served to u2's jobs by the node.
        gens = node.generations()
        rec = gens.latest(ns2)
        assert rec is not None
        assert set(gens.snapshot(rec).entries) == {"k/kernel.so"}
        # u1 publishing into its own namespace works as ever.
        assert publish_as(u1, root_path, store_namespace(u1.tenant, "triton-x"), "a", "b") == ""


@pytest.mark.expect_log(r"not serving namespace .*: .* is (writable by|owned by uid)")
def test_a_namespace_writable_by_others_is_not_served(shared: Path) -> None:
    node = SharedRoot.open(shared / "root", tenants=TenantPolicy())
    ns = store_namespace("u4242", "ns")
    put(SharedRoot.open(shared / "root"), ns, "f", b"x")  # an open (no-policy) writer
    d = shared / "root" / "namespaces" / ns
    os.chown(d, 4242, 4242)
    os.chmod(d, 0o777)
    with pytest.raises(UntrustedError, match="writable by every user"):
        node.generations().latest_seq(ns)
    os.chmod(d, 0o770)  # group 4242 is not a domain of u4242's
    with pytest.raises(UntrustedError, match="writable by group"):
        node.generations().latest_seq(ns)
    os.chmod(d, 0o700)
    os.chown(d / "generations", 4242, 4242)
    assert node.generations().latest_seq(ns) == 1
    # Plain (legacy) names belong to root in uid mode; anyone's in cluster mode.
    legacy = shared / "root" / "namespaces" / "plain"
    put(SharedRoot.open(shared / "root"), "plain", "f", b"x")
    assert node.generations().latest_seq("plain") == 1
    os.chown(legacy, 4242, 4242)
    with pytest.raises(UntrustedError):
        node.generations().latest_seq("plain")
    cluster = SharedRoot.open(shared / "root", tenants=TenantPolicy(mode="cluster"))
    assert cluster.generations().latest_seq("plain") == 1


def test_group_domain_shares_one_namespace(shared: Path) -> None:
    root_path = shared / "root"
    with real_users(3, shared, in_group=(0, 1)) as (a, b, outsider):
        import grp

        gname = a.name.rsplit("u", 1)[0] + "g"
        gid = grp.getgrnam(gname).gr_gid
        cfg = shared / "casfs.toml"  # the node's config, as users' processes read it
        cfg.write_text(f'[[tenants.domains]]\nname = "team"\ngroups = ["{gname}"]\n')
        from casfs.daemon.config import load_tenants

        policy = load_tenants(cfg)
        assert policy.domains == (Domain("team", gids=frozenset({gid})),)
        node = SharedRoot.open(root_path, tenants=policy)
        ns = store_namespace("team", "triton-x")
        # The first member to publish creates the directory, for the whole group.
        assert publish_as(a, root_path, ns, "one", "1", config=cfg) == ""
        d = root_path / "namespaces" / ns
        st = d.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (a.uid, gid, 0o2770)
        for sub in ("generations", "pins", "reads"):  # every member writes all of them
            assert stat.S_IMODE((d / sub).stat().st_mode) == 0o2770
        assert publish_as(b, root_path, ns, "two", "2", config=cfg) == ""
        assert "Permission denied" in publish_as(outsider, root_path, ns, "three", "3",
                                                 config=cfg)
        gens = node.generations()
        rec = gens.latest(ns)
        assert rec is not None and set(gens.snapshot(rec).entries) == {"one", "two"}


def test_gc_by_one_tenant_never_removes_anothers_objects(shared: Path) -> None:
    root_path = shared / "root"
    with real_users(2, shared) as (u1, u2):
        ns2 = store_namespace(u2.tenant, "triton-x")
        assert publish_as(u2, root_path, ns2, "k/kernel.so", "u2 bytes") == ""
        objects = sorted(p for p in (root_path / "objects").rglob("*") if p.is_file())
        assert objects
        for p in objects:  # old enough for any grace period
            os.utime(p, (1, 1))
        r = u1.casfs("gc", "--grace", "0", env=u1.env(CASFS_ROOT=str(root_path)))
        assert r.returncode != 0
        assert "nothing deleted" in r.stderr and "Permission denied" in r.stderr
        assert all(p.exists() for p in objects)
        # u1 lists only what it may read; u2's namespace is not its to list.
        r = u1.casfs("namespaces", "--json", env=u1.env(CASFS_ROOT=str(root_path)))
        assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr
        # root's gc sees every tenant's generations and keeps their objects.
        rep = maintenance.gc(SharedRoot.open(root_path), grace=0)
        assert rep.removed_objects == 0 and all(p.exists() for p in objects)


# --- signatures ------------------------------------------------------------------
@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, str, Path, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    out = []
    for name in ("a", "b"):
        k = Ed25519PrivateKey.generate()
        p = tmp_path / f"{name}.key"
        p.write_bytes(k.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
        out += [p, tenancy.public_key_b64(k)]
    return out[0], out[1], out[2], out[3]


@pytest.mark.expect_log(
    r"skipping damaged generation team~ns@\d+: .*no signature by a key trusted",
    r"skipping statement team~ns/\S+: no signature by a key trusted",
)
def test_signed_records_are_served_only_with_a_trusted_key(
        tmp_path: Path, keys: tuple[Path, str, Path, str]) -> None:
    key_a, pub_a, key_b, pub_b = keys
    path = tmp_path / "root"
    SharedRoot.open(path, create=True)
    writer = SharedRoot.open(path, tenants=TenantPolicy(trust="signature", signing_key=key_a,
                                                        trusted_keys=(pub_a,)))
    reader = SharedRoot.open(path, tenants=TenantPolicy(
        trust="signature", domains=(Domain("team", uids=frozenset({7}), keys=(pub_a,)),)))
    ns = store_namespace("team", "ns")
    assert put(writer, ns, "f", b"good") == 1
    doc = json.loads((path / "namespaces" / ns / "generations" / "000000000001").read_bytes())
    assert doc["tenant"] == "team" and doc["signature"]["key"] == pub_a
    gens = reader.generations()
    assert gens.record(ns, 1).entries == 1

    # A record written by a node without a trusted key (a user's own process on a
    # root-squashed NFS): damage, skipped; the signed generation stays served.
    assert put(SharedRoot.open(path), ns, "g", b"evil") == 2
    assert gens.newest_valid(ns)[1].seq == 1  # type: ignore[union-attr]
    assert reader.counters.get("untrusted_records") >= 1
    # Signed, but by a key not trusted for this tenant.
    other = SharedRoot.open(path, tenants=TenantPolicy(trust="signature", signing_key=key_b,
                                                       trusted_keys=(pub_b,)))
    assert put(other, ns, "h", b"evil") == 3
    with pytest.raises(HostileManifestError, match="no signature by a key trusted"):
        gens.record(ns, 3)
    # Tampered after signing (an entry count changed): the signature no longer holds.
    rec1 = path / "namespaces" / ns / "generations" / "000000000001"
    bad = json.loads(rec1.read_bytes())
    bad["bytes"] += 1
    p4 = path / "namespaces" / ns / "generations" / "000000000004"
    p4.write_text(json.dumps({**bad, "seq": 4}))
    with pytest.raises(HostileManifestError):
        gens.record(ns, 4)
    # A record copied from another tenant's namespace names that tenant: refused.
    ns_other = store_namespace("u7", "ns")
    assert put(writer, ns_other, "f", b"good") == 1
    src = json.loads((path / "namespaces" / ns_other / "generations" / "000000000001")
                     .read_bytes())
    assert src["tenant"] == "u7"
    with pytest.raises(HostileManifestError):
        tenancy.TenantTrust(TenantPolicy(trust="signature", trusted_keys=(pub_a,)), path
                            ).check_record(ns, json.dumps(src).encode())


def test_bad_signing_key_is_refused(tmp_path: Path) -> None:
    from casfs.errors import ConfigError

    p = tmp_path / "k"
    p.write_text("not a key")
    with pytest.raises(ConfigError, match=r"tenants\.signing_key"):
        tenancy.load_signing_key(p)
    with pytest.raises(ConfigError, match="ed25519 public key"):
        tenancy.check_public_key("abc", "tenants.trusted_keys[0]")


@pytest.mark.expect_log(
    r"not serving namespace triton-x: .* outside tenant root",
    r"moved namespace directory .* planted outside its tenant",
)
def test_root_moves_aside_a_plain_namespace_a_user_made_before_tenants(shared: Path) -> None:
    """Before tenants users published under plain names; in uid mode those are root's:
    root's daemon must keep publishing there, not fail on the user's directory forever."""
    ns = "triton-x"
    put(SharedRoot.open(shared / "root"), ns, "old", b"users' bytes")
    d = shared / "root" / "namespaces" / ns
    for p in (d, d / "generations"):
        os.chown(p, 4242, 4242)
    node = SharedRoot.open(shared / "root", tenants=TenantPolicy())
    with pytest.raises(UntrustedError):
        node.generations().latest_seq(ns)
    assert put(node, ns, "new", b"root's bytes") == 1  # a fresh, root-owned namespace
    assert set(node.generations().entries(ns).entries) == {"new"}
    assert d.stat().st_uid == 0
    (aside,) = (shared / "root" / "tmp").glob("untrusted-*")
    assert (aside / "generations" / "000000000001").exists()
    os.utime(aside, (1, 1))
    maintenance.gc(SharedRoot.open(shared / "root"), grace=3600)  # gc removes it after grace
    assert not aside.exists()


def test_records_rewritten_by_retention_are_sealed_too(
        tmp_path: Path, keys: tuple[Path, str, Path, str]) -> None:
    """Retention by use writes generations too: they carry the tenant and the node's
    signature like publications, or signature-checking nodes would not serve them."""
    key_a, pub_a, _, _ = keys
    path = tmp_path / "root"
    SharedRoot.open(path, create=True)
    node = SharedRoot.open(path, tenants=TenantPolicy(trust="signature", signing_key=key_a,
                                                      trusted_keys=(pub_a,)))
    ns = store_namespace("u7", "ns")
    put(node, ns, "keep", b"1")
    put(node, ns, "drop", b"2")
    gens = node.generations()
    seq, gone = gens.drop(ns, lambda snap: {"drop"}, node="n")
    assert (seq, gone) == (3, ["drop"])
    doc = json.loads((path / "namespaces" / ns / "generations" / "000000000003").read_bytes())
    assert doc["casfs_generation"] == 2 and doc["tenant"] == "u7"
    assert tenancy.signature_ok(doc, (pub_a,))
    assert set(gens.entries(ns).entries) == {"keep"}
