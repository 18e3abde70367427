"""Freshness in signature mode (casfs.store.freshness): signed statements of the newest
generation, so deleting records rolls nothing back silently and junk freezes nothing.

On a POSIX root and an S3 root (SeaweedFS), through the backend's verbs only: what
anyone with write access to the root can do (create names, delete names).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from casfs.errors import PublishDeferredError
from casfs.store import freshness, generations, maintenance, tenancy
from casfs.store.entry import Entry
from casfs.store.freshness import RolledBackError
from casfs.store.generations import GenerationStore, seq_name
from casfs.store.root import SharedRoot
from casfs.tenants import TenantPolicy, store_namespace

NS = store_namespace("u7", "triton")
GENS = f"namespaces/{NS}/generations"
HEADS = f"namespaces/{NS}/heads"


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, str, Path, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    out: list[Any] = []
    for name in ("a", "b"):
        k = Ed25519PrivateKey.generate()
        p = tmp_path / f"{name}.key"
        p.write_bytes(k.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
        out += [p, tenancy.public_key_b64(k)]
    return out[0], out[1], out[2], out[3]


@pytest.fixture(params=["posix", "s3"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "s3":
        return str(request.getfixturevalue("s3_url"))
    return str(tmp_path / "root")


class Nodes:
    """Opens the root as a signing node (key a), a reading node, or a plain writer."""

    def __init__(self, location: str, keys: tuple[Path, str, Path, str]) -> None:
        self.location = location
        self.key_a, self.pub_a, self.key_b, self.pub_b = keys
        SharedRoot.open(location, create=True)

    def writer(self, **kw: Any) -> SharedRoot:
        return SharedRoot.open(self.location, tenants=TenantPolicy(
            trust="signature", signing_key=self.key_a, trusted_keys=(self.pub_a,), **kw))

    def reader(self, **kw: Any) -> SharedRoot:
        return SharedRoot.open(self.location, tenants=TenantPolicy(
            trust="signature", trusted_keys=(self.pub_a,), **kw))

    def plain(self) -> SharedRoot:
        """A writer that ignores tenants, signs nothing (an attacker need not use casfs)."""
        return SharedRoot.open(self.location)


@pytest.fixture
def nodes(location: str, keys: tuple[Path, str, Path, str]) -> Nodes:
    return Nodes(location, keys)


@pytest.fixture
def old(monkeypatch: pytest.MonkeyPatch) -> None:
    """Statements are older than the grace in which a missing record counts as unresolved."""
    monkeypatch.setattr(generations, "MISSING_GRACE", 0.0)


def put(root: SharedRoot, gens: GenerationStore, path: str, data: bytes) -> int | None:
    res = root.objects.put_bytes(data)
    return gens.publish(NS, [Entry(path, res.digest, len(data), 0o644, 0)], node="n").seq


def paths(gens: GenerationStore) -> set[str] | None:
    _, rec, snap = gens.newest_valid(NS)
    return None if rec is None else set(snap.entries)


def rolled_back(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.getMessage().startswith("rolled back: ")]


def heads(root: SharedRoot) -> list[tuple[int, int]]:
    return sorted(p for p in map(freshness.parse_head_name, root.backend.list(HEADS))
                  if p is not None)


# --- deletion of the newest record ---------------------------------------------------
@pytest.mark.expect_log(
    r"rolled back: namespace \S+: its statement .* names generation \d+, which is unreadable",
    r"skipping damaged generation \S+: .*(no signature by a key trusted|not valid JSON)",
)
def test_deleting_the_newest_record_is_detected_never_silently_served_older(
        nodes: Nodes, old: None, caplog: pytest.LogCaptureFixture) -> None:
    """Each publication writes a statement; after record 2 is deleted, a node that served
    it keeps serving it (warned once, counted), a fresh node serves a miss with the
    reason, and publication goes on above the statement. Before statements, both
    nodes silently served generation 1."""
    writer = nodes.writer()
    wg = writer.generations()
    assert put(writer, wg, "a.so", b"A") == 1
    assert put(writer, wg, "b.so", b"B") == 2
    assert [s for s, _ in heads(writer)] == [1, 2]
    doc = json.loads(writer.backend.open(f"{HEADS}/{writer.backend.list(HEADS).__next__()}")
                     .read())
    assert doc["tenant"] == "u7" and doc["signature"]["key"] == nodes.pub_a

    serving = nodes.reader()
    sg = serving.generations()
    assert paths(sg) == {"a.so", "b.so"}

    writer.backend.delete(f"{GENS}/{seq_name(2)}")  # the attack: rolls the namespace back
    caplog.set_level(logging.WARNING)

    # The node that served generation 2 keeps serving it: through newest_valid...
    _, rec, snap = sg.newest_valid(NS)
    assert rec is not None and rec.seq == 2 and set(snap.entries) == {"a.so", "b.so"}
    # ...and through latest_seq with the seq it read as hint (a mount's refresh).
    assert sg.latest_seq(NS, hint=2) == 1
    assert len(rolled_back(caplog)) == 1, caplog.text  # once, not per refresh
    assert "generation 2" in rolled_back(caplog)[0]
    assert serving.counters.get("rolled_back_generations") == 1
    sg.newest_valid(NS)
    assert len(rolled_back(caplog)) == 1 and serving.counters.get("rolled_back_generations") == 1

    # A fresh node serves nothing older: a miss, with the reason for the CLI.
    fresh = nodes.reader()
    fg = fresh.generations()
    newest, rec, snap = fg.newest_valid(NS)
    assert (newest, rec, snap.entries) == (2, None, {})
    assert fresh.counters.get("rolled_back_generations") == 1
    plant_junk(nodes, writer, 3, 2)  # (junk above does not hide the reason)
    with pytest.raises(RolledBackError, match="rolled back"):
        fg.readable(NS)

    # Publication is not frozen. The node that published generation 2 builds on it
    # (its manifests are still there), above the statement and the junk: nothing is
    # lost...
    assert put(writer, wg, "c.so", b"C") == 5
    assert paths(nodes.reader().generations()) == {"a.so", "b.so", "c.so"}
    # ...and a fresh writer, finding the head deleted again, publishes above it (never
    # re-creating its seq) on the newest valid record below (1: record 2 is gone too):
    # what only the deleted records held is lost (misses, never wrong bytes).
    writer.backend.delete(f"{GENS}/{seq_name(5)}")
    assert put(writer, nodes.writer().generations(), "d.so", b"D") == 6
    assert paths(nodes.reader().generations()) == {"a.so", "d.so"}
    assert heads(writer)[-1][0] == 6


@pytest.mark.expect_log(r"skipping unresolved \(young, object missing\) generation ")
def test_a_young_statement_whose_record_is_missing_is_unresolved_not_a_rollback(
        nodes: Nodes, caplog: pytest.LogCaptureFixture) -> None:
    """NFS may hide a fresh record a while: within the grace readers serve the older
    generation (no rollback reported) and publishers wait, as for a fresh manifest."""
    writer = nodes.writer()
    wg = writer.generations()
    put(writer, wg, "a.so", b"A")
    put(writer, wg, "b.so", b"B")
    writer.backend.delete(f"{GENS}/{seq_name(2)}")
    caplog.set_level(logging.WARNING)
    reader = nodes.reader()
    assert paths(reader.generations()) == {"a.so"}
    assert rolled_back(caplog) == []
    assert reader.counters.get("unresolved_generations") >= 1
    with pytest.raises(PublishDeferredError):
        put(writer, nodes.writer().generations(), "c.so", b"C")


@pytest.mark.expect_log(r"rolled back: namespace \S+: .*not the record its statement names")
def test_a_record_put_in_the_place_of_the_named_one_is_a_rollback(
        nodes: Nodes, old: None, caplog: pytest.LogCaptureFixture) -> None:
    """The statement names the record's bytes: another validly signed record at the same
    seq (re-created after a deletion by a node that did not see the statement) is not it."""
    writer = nodes.writer()
    wg = writer.generations()
    put(writer, wg, "a.so", b"A")
    put(writer, wg, "b.so", b"B")
    rec1 = writer.backend.open(f"{GENS}/{seq_name(1)}").read()
    writer.backend.delete(f"{GENS}/{seq_name(2)}")
    doc = json.loads(rec1)
    doc.pop("signature")
    doc |= {"seq": 2, "parent": 1}
    signed = tenancy.sign(doc, tenancy.load_signing_key(nodes.key_a))
    assert writer.backend.create_exclusive(f"{GENS}/{seq_name(2)}", json.dumps(signed).encode())
    caplog.set_level(logging.WARNING)
    fresh = nodes.reader().generations()
    assert fresh.record(NS, 2).seq == 2  # a valid record by itself...
    assert paths(fresh) is None  # ...but not the one the statement names
    assert "another one was put in its place" in rolled_back(caplog)[0]


# --- junk records ------------------------------------------------------------------
def plant_junk(nodes: Nodes, root: SharedRoot, first: int, count: int,
               kinds: tuple[int, ...] = (0, 1, 2, 3)) -> None:
    """Records no reader may serve: garbage, unsigned, another tenant's, mis-signed."""
    rec1 = json.loads(root.backend.open(f"{GENS}/{seq_name(1)}").read())
    body = {k: v for k, v in rec1.items() if k != "signature"}
    key_b = tenancy.load_signing_key(nodes.key_b)
    for i, seq in zip(kinds * count, range(first, first + count), strict=False):
        doc = {**body, "seq": seq, "parent": seq - 1}
        data = [b"{not json",
                json.dumps(doc).encode(),
                json.dumps(tenancy.sign({**doc, "tenant": "u8"},
                                        tenancy.load_signing_key(nodes.key_a))).encode(),
                json.dumps(tenancy.sign(doc, key_b)).encode()][i]
        assert root.backend.create_exclusive(f"{GENS}/{seq_name(seq)}", data)


class Counting:
    """Wraps a backend to count the generation records opened and names looked up."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.opened: list[str] = []
        self.infos = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def open(self, key: str) -> Any:
        if key.startswith(GENS):
            self.opened.append(key)
        return self.backend.open(key)

    def info(self, key: str) -> Any:
        self.infos += 1
        return self.backend.info(key)


@pytest.mark.expect_log(
    r"skipping damaged generation \S+: .*(no signature by a key trusted|its record names tenant"
    r"|not valid JSON)",
)
def test_junk_records_above_the_head_freeze_nothing_and_cost_bounded_work(
        nodes: Nodes) -> None:
    """200 junk records above the newest valid one: a reader examines at most JUNK_SCAN of
    them (and a bounded number of names), serves the real head; a writer publishes past
    them on the real head's snapshot and its statement names it. Before statements a
    reader examined 65 records and served nothing, and the writer's next generation lost
    every published entry (built on nothing)."""
    writer = nodes.writer()
    put(writer, writer.generations(), "a.so", b"A")
    plant_junk(nodes, writer, 2, 200)

    reader = nodes.reader()
    counting = Counting(reader.backend)
    reader.backend = counting
    gens = reader.generations()
    assert paths(gens) == {"a.so"}
    assert len(counting.opened) <= freshness.JUNK_SCAN + 1, counting.opened
    assert counting.infos <= 3 * generations.PROBE_STEPS
    # A mount's refresh (latest_seq from the seq it serves) probes a bounded run too.
    counting.infos = 0
    assert gens.latest_seq(NS, hint=1) == 201
    assert counting.infos <= 3 * (generations.PROBE_STEPS + 1), counting.infos

    fresh_writer = nodes.writer()
    assert put(fresh_writer, fresh_writer.generations(), "b.so", b"B") == 202
    assert heads(writer)[-1][0] == 202
    assert paths(nodes.reader().generations()) == {"a.so", "b.so"}


@pytest.mark.expect_log(
    r"skipping statement \S+: (no signature by a key trusted|statement: not valid JSON)")
def test_junk_statements_are_skipped_within_a_bound(nodes: Nodes) -> None:
    """Statements no key signed are skipped (counted); more than HEAD_SCAN of them above
    the real one hide it, and the namespace reads as if it had none (as before)."""
    writer = nodes.writer()
    put(writer, writer.generations(), "a.so", b"A")
    real = writer.backend.open(f"{HEADS}/{next(iter(writer.backend.list(HEADS)))}").read()
    doc = {k: v for k, v in json.loads(real).items() if k != "signature"}
    for i in range(3):  # unsigned, naming a seq above the head
        name = freshness.head_name(50 + i, doc["issued"])
        assert writer.backend.create_exclusive(f"{HEADS}/{name}", json.dumps(
            {**doc, "seq": 50 + i}).encode())
    reader = nodes.reader()
    head = reader.generations().heads.newest(NS)
    assert head is not None and head.seq == 1
    assert reader.counters.get("untrusted_heads") == 3
    assert paths(reader.generations()) == {"a.so"}
    for i in range(freshness.HEAD_SCAN):
        name = freshness.head_name(60 + i, doc["issued"])
        writer.backend.create_exclusive(f"{HEADS}/{name}", b"junk")
    assert nodes.reader().generations().heads.newest(NS) is None
    assert paths(nodes.reader().generations()) == {"a.so"}


@pytest.mark.expect_log(r"skipping statement \S+: statement: not valid JSON")
@pytest.mark.parametrize("value", ["Infinity", "-Infinity", "NaN", "1e400"])
def test_statements_with_times_past_any_number_are_skipped(nodes: Nodes, value: str) -> None:
    """Python's json reads these (1e400 as infinity); int() of one raised out of newest()
    and failed every mount and publication of the namespace. Skipped like any junk."""
    writer = nodes.writer()
    put(writer, writer.generations(), "a.so", b"A")
    name = freshness.head_name(99, 1700000000)
    doc = {"casfs_head": 1, "namespace": NS, "tenant": "u7", "seq": 99, "published": 1,
           "issued": 0, "expires": 0, "record": "0" * 64}
    body = json.dumps(doc).replace('"issued": 0', f'"issued": {value}')
    assert writer.backend.create_exclusive(f"{HEADS}/{name}", body.encode())
    reader = nodes.reader()
    head = reader.generations().heads.newest(NS)
    assert head is not None and head.seq == 1
    assert reader.counters.get("untrusted_heads") == 1
    assert paths(reader.generations()) == {"a.so"}
    assert put(writer, nodes.writer().generations(), "b.so", b"B") == 2


# --- expiry --------------------------------------------------------------------------
@pytest.mark.expect_log(
    r"freshness unknown: namespace \S+: its statement .* expired",
    r"rolled back: namespace \S+: its statement .* which is unreadable",
)
def test_an_expired_statement_warns_and_still_sets_the_floor(
        nodes: Nodes, old: None, caplog: pytest.LogCaptureFixture) -> None:
    """Expired (nothing published for head_expiry): logged once and counted, the newest
    valid record at or above it is served; its seq stays a floor (a deletion below an
    expired statement is still a rollback, never served older)."""
    writer = nodes.writer(head_expiry=0.0)
    wg = writer.generations()
    put(writer, wg, "a.so", b"A")
    put(writer, wg, "b.so", b"B")
    caplog.set_level(logging.WARNING)
    caplog.clear()  # (the writer found statement 1 expired when it published 2)
    reader = nodes.reader()
    rg = reader.generations()
    head = rg.heads.newest(NS)
    assert head is not None and head.expired()
    assert paths(rg) == {"a.so", "b.so"}
    assert paths(rg) == {"a.so", "b.so"}
    expired = [m for m in caplog.messages if m.startswith("freshness unknown")]
    assert len(expired) == 1 and reader.counters.get("expired_heads") == 1
    writer.backend.delete(f"{GENS}/{seq_name(2)}")
    assert paths(nodes.reader().generations()) is None
    assert rolled_back(caplog)


# --- migration -----------------------------------------------------------------------
def test_a_namespace_without_statements_reads_and_publishes_as_before(
        nodes: Nodes, old: None, caplog: pytest.LogCaptureFixture) -> None:
    """An older release's namespace (signed records, no heads/): served as before,
    including silently serving the older generation when the newest is deleted (nothing
    says it existed); the next publication adds the first statement. Readers that do not
    check statements (cluster mode, older releases) and gc are not disturbed by them."""
    writer = nodes.writer()
    wg = writer.generations()
    put(writer, wg, "a.so", b"A")
    put(writer, wg, "b.so", b"B")
    for name in list(writer.backend.list(HEADS)):
        writer.backend.delete(f"{HEADS}/{name}")
    caplog.set_level(logging.WARNING)
    assert paths(nodes.reader().generations()) == {"a.so", "b.so"}
    writer.backend.delete(f"{GENS}/{seq_name(2)}")
    assert paths(nodes.reader().generations()) == {"a.so"}
    assert rolled_back(caplog) == []
    fresh = nodes.writer()
    assert put(fresh, fresh.generations(), "c.so", b"C") == 2
    assert [s for s, _ in heads(fresh)] == [2]
    # A signing node in owner mode, and an open reader, neither write nor need statements.
    assert paths(nodes.plain().generations()) == {"a.so", "c.so"}
    owner = SharedRoot.open(nodes.location, tenants=TenantPolicy(signing_key=nodes.key_a))
    assert owner.generations().heads.newest(NS) is None


# the junk records planted above the head have no trusted signature
@pytest.mark.expect_log(r"skipping damaged generation \S+: .*no signature by a key trusted")
def test_gc_keeps_records_statements_name_and_drops_old_statements(
        nodes: Nodes, keys: tuple[Path, str, Path, str]) -> None:
    """gc keeps the newest statements and every record at or above the seq they name
    (junk above the head must not push the real head out of --keep), and deletes
    statements of generations it removed."""
    writer = nodes.writer()
    wg = writer.generations()
    for i in range(4):
        put(writer, wg, f"{i}.so", b"%d" % i)
    plant_junk(nodes, writer, 5, 2, kinds=(1, 3))  # records that parse (gc checks no key)
    maintenance.gc(SharedRoot.open(nodes.location), keep=1, grace=0)
    left = set(writer.generations().seqs(NS))
    assert {4, 5, 6} <= left and 1 not in left
    assert [s for s, _ in heads(writer)] == [4]
    assert paths(nodes.reader().generations()) == {"0.so", "1.so", "2.so", "3.so"}



def test_head_expiry_is_configured_in_days(tmp_path: Path) -> None:
    from casfs.daemon.config import load_tenants

    cfg = tmp_path / "casfs.toml"
    cfg.write_text('[tenants]\ntrust = "signature"\ntrusted_keys = ["%s"]\n'
                   'head_expiry_days = 2\n' % ("A" * 43 + "="))
    policy = load_tenants(cfg)
    assert policy.head_expiry == 2 * 86400.0
    assert TenantPolicy.from_dict(policy.to_dict()).head_expiry == 2 * 86400.0
    cfg.write_text("[tenants]\n")
    assert load_tenants(cfg).head_expiry == 7 * 86400.0
    # past a century: refused in one line (a review: 2e13 days made every statement's
    # expiry past what readers take, and rollback protection silently off)
    from casfs.errors import ConfigError

    cfg.write_text('[tenants]\ntrust = "signature"\ntrusted_keys = ["%s"]\n'
                   'head_expiry_days = 2e13\n' % ("A" * 43 + "="))
    with pytest.raises(ConfigError, match="head_expiry_days: at most 36500 days"):
        load_tenants(cfg)
