"""Misses that name their cause, per entry (casfs.cli.misscause): a job's missed
entries, looked up in the other namespaces of its family, are said to exist in
the one(s) holding them, with the ingredients that differ, or in none; in the
summary line, in ``--report`` and in ``casfs explain``. The names come from a
node-local cache of the namespaces' manifests (casfs.index.entrynames): a
namespace nothing was published to since costs no manifest read."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from casfs.cli.misscause import causes
from casfs.fingerprint import Fingerprint, fingerprint, job_env
from casfs.index.entrynames import EntryNameIndex, name_hash
from casfs.node.compiletime import NAMED_CAP, MissClock
from casfs.node.tenant import load_tenants, own_tenant
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot
from casfs.util.counters import Counters

Cli = Callable[..., Any]

# Triton kernel keys (52 base32 characters): the entry is the key directory.
K = [f"{c * 4}ABCDEFGHIJKLMNOPQRSTUVWXYZ234567ABCDEFGHIJKLMNOP" for c in "BCDEFG"]
assert all(len(k) == 52 for k in K)


def _publish(root: SharedRoot, ns: str, fp: Fingerprint, keys: list[str]) -> None:
    entries = []
    for k in keys:
        for name in ("k.cubin", "__grp__k.json"):
            put = root.objects.put_bytes(f"{ns}/{k}/{name}".encode())
            entries.append(Entry(f"{k}/{name}", put.digest, put.size, 0o644, 1))
    root.generations().publish(ns, entries, node="n", fingerprint=fp.ingredients)


def _store_ns(fp: Fingerprint) -> str:
    return own_tenant(load_tenants()).store_namespace(fp.namespace)


@pytest.fixture
def three(casfs_env: dict[str, Path]) -> dict[str, Any]:
    """This job's fingerprint; a namespace a torch release away holding K0-K2, one
    further (torch and GPU) holding K0 and K4. K3 and K5 are in none."""
    mine = fingerprint("triton", job_env(python=sys.executable))
    root = SharedRoot.open(casfs_env["root"], create=True)
    near = Fingerprint("triton", {**mine.ingredients, "torch": "2.12.1"})
    far = Fingerprint("triton", {**mine.ingredients, "torch": "2.11.0",
                                 "gpu": "NVIDIA H200/9.0"})
    _publish(root, _store_ns(near), near, K[0:3])
    _publish(root, _store_ns(far), far, [K[0], K[4]])
    # another family holding K3: never a cause of a Triton miss
    inductor = Fingerprint("inductor", {**mine.ingredients, "torch": "2.12.1"})
    _publish(root, _store_ns(inductor), inductor, [K[3]])
    return {"mine": mine, "root": root, "near": _store_ns(near), "far": _store_ns(far)}


def test_misses_are_given_to_the_namespaces_holding_them(three: dict[str, Any],
                                                         casfs_env: dict[str, Path]) -> None:
    mine, gens = three["mine"], three["root"].generations()
    tenant = own_tenant(load_tenants()).id
    mc = causes(gens, mine, K[:5], tenant=tenant, state_dir=casfs_env["state"])
    assert [(h.where.namespace, h.entries) for h in mc.held] == [
        (three["near"], K[0:3]), (three["far"], [K[4]])]
    assert mc.nowhere == [K[3]] and (mc.checked, mc.namespaces) == (2, 2)
    torch = mine.ingredients["torch"]
    assert mc.line() == (
        f"triton: 3 of this job's 5 missed entries exist in {three['near']}"
        f" (torch {torch} here vs 2.12.1); 1 more in {three['far']}"
        f" (gpu {mine.ingredients.get('gpu')} here vs NVIDIA H200/9.0, torch {torch} here"
        " vs 2.11.0); 1 was compiled in no other namespace of this root")
    assert mc.parts_read == 2  # one manifest part per namespace, then cached
    # Cached: the same question reads no manifest.
    again = causes(gens, mine, K[:5], tenant=tenant, state_dir=casfs_env["state"])
    assert again.parts_read == 0 and again.nowhere == [K[3]]
    # A delta published to the near namespace: only it is read.
    near_fp = Fingerprint("triton", {**mine.ingredients, "torch": "2.12.1"})
    _publish(three["root"], three["near"], near_fp, [K[3]])
    gens = three["root"].generations()
    third = causes(gens, mine, K[:5], tenant=tenant, state_dir=casfs_env["state"])
    assert third.parts_read == 1 and third.nowhere == []
    assert [len(h.entries) for h in third.held] == [4, 1]
    # Another tenant's namespaces are not this job's to be served from.
    _publish(three["root"], f"someone~{near_fp.namespace}", near_fp, [K[5]])
    gens = three["root"].generations()
    assert causes(gens, mine, [K[5]], tenant=tenant, state_dir=None).line() == (
        "triton: this job's 1 missed entry was compiled in no other namespace of this root")


def test_bounded_namespaces_and_time(three: dict[str, Any],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the nearest MAX_NAMESPACES are read, none past the time budget; the line
    says a miss is in none of those read, not in none at all."""
    from casfs.cli import misscause

    gens = three["root"].generations()
    monkeypatch.setattr(misscause, "MAX_NAMESPACES", 1)
    mc = causes(gens, three["mine"], [K[4]], tenant=None, state_dir=None)
    assert (mc.checked, mc.namespaces, mc.nowhere) == (1, 2, [K[4]])
    assert mc.line() == ("triton: this job's 1 missed entry was compiled in none of the"
                         " 1 namespaces read (of 2)")
    monkeypatch.setattr(misscause, "MAX_NAMESPACES", 16)
    mc = causes(gens, three["mine"], [K[4]], tenant=None, state_dir=None, budget_s=-1)
    assert (mc.checked, mc.parts_read) == (0, 0) and "none of the 0 namespaces read" in str(
        mc.line())


def test_the_namespaces_are_read_at_once(three: dict[str, Any]) -> None:
    """A cold node reads each related namespace's manifest: several at a time, not one
    after the other (a barrier only both reads reach together)."""
    import threading

    from casfs.cli.misscause import entry_index

    gens = three["root"].generations()
    real = entry_index(gens, "triton", None)
    meet = threading.Barrier(2, timeout=10)

    class Meeting:
        parts_read = 0

        def names(self, rec: Any) -> Any:
            meet.wait()
            return real.names(rec)

    mc = causes(gens, three["mine"], [K[1], K[4]], tenant=None, state_dir=None,
                index=Meeting())  # type: ignore[arg-type]
    assert (mc.checked, mc.unreadable, mc.nowhere) == (2, 0, [])
    assert [(h.where.namespace, h.entries) for h in mc.held] == [
        (three["near"], [K[1]]), (three["far"], [K[4]])]


def test_past_the_name_cap_the_line_says_how_many_went_unnamed() -> None:
    from casfs.cli.misscause import MissCauses

    mc = MissCauses("triton", NAMED_CAP, NAMED_CAP + 904, nowhere=["x"] * NAMED_CAP,
                    checked=2, namespaces=2)
    assert mc.line() == (f"triton: the first {NAMED_CAP} of this job's {NAMED_CAP + 904}"
                         " missed entries were compiled in no other namespace of this root")


def test_a_damaged_or_foreign_cache_file_is_read_over(three: dict[str, Any],
                                                      tmp_path: Path) -> None:
    gens = three["root"].generations()
    rec = gens.latest(three["near"])
    idx = EntryNameIndex(tmp_path, gens, "triton@x", lambda p: p.partition("/")[0])
    assert K[0] in idx.names(rec) and K[3] not in idx.names(rec)
    (tmp_path / three["near"]).write_bytes(b'{"casfs_entrynames": 1}\n' + b"\0" * 8)
    assert len(idx.names(rec)) == 3 and idx.parts_read == 2
    other = EntryNameIndex(tmp_path, gens, "triton@y", lambda p: p)  # another rule: rebuilt
    assert K[0] not in other.names(rec) and f"{K[0]}/k.cubin" in other.names(rec)
    head, _, body = (tmp_path / three["near"]).read_bytes().partition(b"\n")
    assert json.loads(head)["count"] == 6 and len(body) == 48
    assert name_hash(f"{K[0]}/k.cubin") in [int.from_bytes(body[i:i + 8], "little")
                                            for i in range(0, 48, 8)]


def test_the_mount_names_its_missed_entries_boundedly() -> None:
    from casfs import families

    clock = MissClock(families.rules("triton"), Counters())
    for k in [K[1], K[0], K[1], "not-a-key"]:
        clock.missed(k + "/__grp__k.json")
    assert clock.named() == [K[1], K[0]]
    for i in range(NAMED_CAP + 10):
        clock.missed(f"{i:064x}")
    assert len(clock.named()) == NAMED_CAP and clock.named()[:2] == [K[1], K[0]]


LOOKUPS = """
import os, sys
for key in sys.argv[1:]:
    assert not os.path.exists(os.path.join(os.environ["TRITON_CACHE_DIR"], key))
"""


@pytest.mark.fuse
def test_run_and_explain_name_where_the_misses_exist(
        cli: Cli, three: dict[str, Any], casfs_env: dict[str, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A real `casfs run` (fuse mode) whose job misses five kernels: its summary line
    and report say which namespace holds which; `casfs explain` says it afterwards
    from the namespace's outcome records."""
    monkeypatch.setenv("CASFS_MOUNT_BASE", str(tmp_path / "mnt"))
    monkeypatch.setenv("CASFS_SOCKET", str(tmp_path / "no-daemon.sock"))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    mine, near, far = three["mine"], three["near"], three["far"]
    torch = mine.ingredients["torch"]
    report = tmp_path / "report.json"
    res = cli("run", "--family", "triton", "--python", sys.executable, "--report", report,
              "--", sys.executable, "-c", LOOKUPS, *K[:5], check=True)
    want = (f"casfs: triton: 3 of this job's 5 missed entries exist in {near}"
            f" (torch {torch} here vs 2.12.1); 1 more in {far}")
    assert want in res.err, res.err
    assert "; 1 was compiled in no other namespace of this root" in res.err
    (fam,) = json.loads(report.read_text())["families"]
    mc = fam["miss_causes"]
    assert [(e["namespace"], e["missed_entries"], e["examples"]) for e in mc["elsewhere"]] == [
        (near, 3, K[0:3]), (far, 1, [K[4]])]
    assert mc["elsewhere"][0]["differs"] == [
        {"ingredient": "torch", "here": torch, "there": "2.12.1"}]
    assert (mc["missed_entries"], mc["nowhere"], mc["nowhere_examples"]) == (5, 1, [K[3]])

    # casfs explain, later: the namespace's outcome records hold its misses.
    doc = cli("explain", "--family", "triton", "--python", sys.executable, "--json",
              check=True).json()
    mc = doc["families"][0]["miss_causes"]
    assert [(e["namespace"], e["missed_entries"]) for e in mc["elsewhere"]] == [
        (near, 3), (far, 1)]
    assert mc["nowhere_examples"] == [K[3]] and mc["manifest_parts_read"] == 0  # cached
    text = cli("explain", "--family", "triton", "--python", sys.executable, check=True).out
    assert (f"  misses: 3 of the 5 missed entries of the last 7 days exist in {near}"
            f" (torch {torch} here vs 2.12.1)") in text, text
    assert f"    1 in no namespace: e.g. {K[3]}" in text
