"""Format versions: v1 and v2 records/manifests are read, newer ones are not damage."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from casfs.errors import HostileManifestError, NewerFormatError
from casfs.store import manifest
from casfs.store.entry import Entry
from casfs.store.generations import seq_name
from casfs.store.root import SharedRoot
from casfs.util.counters import Counters


def _put(root: SharedRoot, path: str, data: bytes, **extras: Any) -> Entry:
    r = root.objects.put_bytes(data)
    return Entry(path, r.digest, r.size, 0o644, 1, extras or None)


def _raw_record(root: SharedRoot, ns: str, seq: int) -> dict[str, Any]:
    path = root.path / f"namespaces/{ns}/generations/{seq_name(seq)}"
    doc: dict[str, Any] = json.loads(path.read_bytes())
    return doc


def _plant_newer(root: SharedRoot, ns: str, seq: int, **over: Any) -> None:
    """Copy record seq-1 to seq with changes, as a newer casfs would write it."""
    doc = _raw_record(root, ns, seq - 1) | {"seq": seq, "parent": seq - 1} | over
    key = f"namespaces/{ns}/generations/{seq_name(seq)}"
    assert root.backend.create_exclusive(key, json.dumps(doc).encode())


def test_plain_publication_writes_v1_for_the_previous_release(root: SharedRoot) -> None:
    root.generations().publish("ns", [_put(root, "a", b"a")], node="n")
    assert _raw_record(root, "ns", 1)["casfs_generation"] == 1
    rec = root.generations().record("ns", 1)
    assert rec.base is not None
    doc = json.loads(root.objects.get_bytes(rec.base.digest))
    assert doc["casfs_manifest"] == 1


def test_extras_and_options_round_trip_as_v2(root: SharedRoot) -> None:
    gens = root.generations()
    e = _put(root, "a", b"a", pack=["b" * 64, 0, 1], future_key={"x": 1})
    gens.publish("ns", [e, _put(root, "b", b"b")], node="n", options={"tenant": "t1"})
    doc = _raw_record(root, "ns", 1)
    assert doc["casfs_generation"] == 2 and doc["tenant"] == "t1"
    rec = gens.record("ns", 1)
    assert rec.options == {"tenant": "t1"}
    snap = gens.snapshot(rec)
    assert snap.entries["a"].extras == {"pack": ["b" * 64, 0, 1], "future_key": {"x": 1}}
    assert snap.entries["b"].extras is None
    assert snap.entries["a"] == e
    # Extras survive compaction into a new full base (compact_deltas=1 forces it).
    gens.publish("ns", [_put(root, "c", b"c")], node="n", compact_deltas=1)
    snap2 = root.generations().entries("ns")
    assert snap2.record is not None and snap2.record.deltas == ()
    assert snap2.entries["a"].extras == e.extras


@pytest.mark.parametrize("extras", [[1], {"": 1}, {"Bad-Key": 1}, {1: 2}])
def test_bad_extras_are_damage(extras: Any) -> None:
    row = ["a", "a" * 64, 1, 0o644, 0, extras]
    blob = json.dumps({"casfs_manifest": 2, "kind": "full", "entries": [row]}).encode()
    with pytest.raises(HostileManifestError):
        manifest.decode(blob)


def test_newer_manifest_version_is_not_damage() -> None:
    with pytest.raises(NewerFormatError, match="newer than this casfs reads"):
        manifest.decode(b'{"casfs_manifest": 3, "kind": "full", "entries": []}')


@pytest.mark.expect_log(r"skipping newer-format generation")
@pytest.mark.parametrize("over", [{"casfs_generation": 3}, {"requires": ["teleport"]}],
                         ids=["version-3", "unknown-required-feature"])
def test_newer_record_serves_older_and_refuses_publication(
    over: dict[str, Any], root: SharedRoot
) -> None:
    root.objects.counters = Counters()
    gens = root.generations()
    gens.publish("ns", [_put(root, "a", b"a")], node="n")
    _plant_newer(root, "ns", 2, **over)
    # Serving: the newest readable generation, counted, not treated as damage.
    newest, rec, snap = gens.newest_valid("ns")
    assert newest == 2 and rec is not None and rec.seq == 1 and set(snap.entries) == {"a"}
    counters = root.objects.counters.snapshot()
    assert counters.get("newer_format_generations") == 1
    assert "bad_generations" not in counters
    # Publishing: refused, nothing written on top of the older snapshot.
    with pytest.raises(NewerFormatError, match="upgrade casfs"):
        gens.publish("ns", [_put(root, "b", b"b")], node="n")
    assert gens.seqs("ns") == [1, 2]


@pytest.mark.expect_log(r"skipping newer-format generation")
def test_cli_refuses_import_onto_a_newer_record(
    casfs_env: dict[str, Path], cli: Callable[..., Any], tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_text("a")
    cli("init", check=True)
    cli("import", src, "-n", "ns", check=True)
    root = SharedRoot.open(casfs_env["root"])
    _plant_newer(root, "ns", 2, casfs_generation=7)
    (src / "b").write_text("b")
    line = cli("import", src, "-n", "ns").assert_clean_error()
    assert "newer than this casfs reads" in line, line
    assert root.generations().seqs("ns") == [1, 2]


def test_a_marker_handed_over_by_another_process_is_checked_again() -> None:
    """A node's workers open an object store root with the marker their mount process
    read (one GET a node, not three): a newer format in it is refused as if fetched."""
    from casfs.errors import StoreFormatError

    url = "s3://casfs-test/p?endpoint=http://127.0.0.1:9"  # nothing listens there
    with pytest.raises(StoreFormatError, match=r"format version 2\.0"):
        SharedRoot.open(url, marker={"format": "casfs", "version": "2.0"})
    root = SharedRoot.open(url, marker={"format": "casfs", "version": "1.0", "id": "r1"})
    assert root.root_id == "r1" and root.marker["id"] == "r1"
