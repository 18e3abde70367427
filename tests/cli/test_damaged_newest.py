"""A damaged newest record: the read-side CLI shows what mounts serve, the newest readable.

Mounts, `casfs run`, import and publication pass over a damaged, newer-format
or unresolved newest record (GenerationStore.newest_valid). `casfs ls`,
`export`, `cat`, `stat`, `diff` and `du` used to stop on it with an error;
now they show the newest readable generation, say which record they passed
over in one warning line on stderr (and in ``skipped_generations`` in --json
objects) and exit 0. ``ns@N`` naming the damaged record still fails, in one line.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from casfs.store import manifest
from casfs.store.entry import Entry
from casfs.store.generations import MISSING_GRACE, seq_name
from casfs.store.objects import digest_bytes, object_key
from casfs.store.root import SharedRoot


def _record(root: Path, seq: int) -> Path:
    return root / f"namespaces/ns/generations/{seq_name(seq)}"


def _missing_manifest(root: Path, old: bool) -> None:
    """Record 2 = record 1 + a delta whose manifest object is not stored."""
    r = SharedRoot.open(root)
    x = r.objects.put_bytes(b"X")
    delta = manifest.encode([Entry("x", x.digest, 1, 0o644, 1)], "delta")
    doc = json.loads(_record(root, 1).read_bytes())
    doc |= {"seq": 2, "parent": 1, "entries": doc["entries"] + 1,
            "deltas": [{"digest": digest_bytes(delta), "size": len(delta), "entries": 1}]}
    _record(root, 2).write_text(json.dumps(doc))
    if old:  # past MISSING_GRACE: damage, not a manifest NFS has not shown yet
        t = time.time() - MISSING_GRACE - 60
        os.utime(_record(root, 2), (t, t))


def _newer_format(root: Path) -> None:
    doc = json.loads(_record(root, 1).read_bytes()) | {"seq": 2, "parent": 1,
                                                        "casfs_generation": 3}
    _record(root, 2).write_text(json.dumps(doc))


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (lambda r: _record(r, 2).write_bytes(_record(r, 1).read_bytes()[:40]),
                  "damaged"),
    "nested": (lambda r: _record(r, 2).write_bytes(b"[" * 200_000), "damaged"),
    "missing-manifest-old": (lambda r: _missing_manifest(r, old=True), "damaged"),
    "missing-manifest-young": (lambda r: _missing_manifest(r, old=False), "unresolved"),
    "newer-format": (_newer_format, "newer-format"),
}


def _one_warning(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("casfs: warning:"), err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_read_side_cli_shows_the_newest_readable(
    case: str, cli: Callable[..., Any], casfs_env: dict[str, Path], tmp_path: Path
) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "a").write_bytes(b"A")
    (src / "d" / "b").write_bytes(b"B")
    cli("import", src, "-n", "ns", check=True)
    root = casfs_env["root"]
    plant, kind = DAMAGE[case]
    plant(root)
    assert _record(root, 2).exists()

    res = cli("ls", "ns", "-r", "--json")
    assert res.rc == 0, res.err
    assert {e["path"] for e in res.json()} == {"a", "d/b"}
    line = _one_warning(res.err)
    assert "ns@2" in line and kind in line and "ns@1" in line, line

    res = cli("ls", "ns")
    assert res.rc == 0 and res.out.split() == ["644", "1", "a", "d/"], (res.out, res.err)
    _one_warning(res.err)

    dest = tmp_path / "dest"
    res = cli("export", "ns", dest, "--json")
    assert res.rc == 0, res.err
    doc = res.json()
    assert doc["seq"] == 1 and doc["files"] == 2
    assert [(s["seq"], s["kind"].split()[0]) for s in doc["skipped_generations"]] == [
        (2, kind)], doc
    assert (dest / "a").read_bytes() == b"A" and (dest / "d" / "b").read_bytes() == b"B"
    assert "ns@2" in _one_warning(res.err)

    res = cli("cat", "ns", "d/b")
    assert res.rc == 0 and res.out == "B", res.err
    _one_warning(res.err)
    res = cli("stat", "ns", "a", "--json")
    assert res.rc == 0 and res.json()["size"] == 1, res.err

    res = cli("diff", "ns@1", "ns", "--json")
    assert res.rc == 0, res.err
    doc = res.json()
    assert (doc["added"], doc["removed"], doc["changed"]) == ([], [], [])
    assert [s["seq"] for s in doc["skipped_generations"]] == [2]

    res = cli("du", "ns", "--json")
    assert res.rc == 0, res.err
    doc = res.json()
    assert doc["files"] == 2 and [s["seq"] for s in doc["skipped_generations"]] == [2]
    assert "ns@2" in _one_warning(res.err)

    res = cli("generations", "ns")
    assert res.rc == 0 and "Traceback" not in res.err, res.err

    # Naming the damaged record explicitly still fails, in one line naming it.
    line = cli("ls", "ns@2").assert_clean_error()
    assert "ns@2" in line, line
    dest2 = tmp_path / "dest2"
    line = cli("export", "ns@2", dest2).assert_clean_error()
    assert "ns@2" in line and not dest2.exists(), line
    # An undamaged generation: no warning, and an empty skipped_generations.
    res = cli("export", "ns@1", tmp_path / "dest3", "--json", check=True)
    assert res.err.strip() == "" and res.json()["skipped_generations"] == []


def test_no_readable_generation_is_one_line_naming_the_newest(
    cli: Callable[..., Any], casfs_env: dict[str, Path], tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"A")
    cli("import", src, "-n", "ns", check=True)
    _record(casfs_env["root"], 1).write_bytes(b"[" * 200_000)
    line = cli("ls", "ns").assert_clean_error()
    assert "no readable generation" in line and "ns@1" in line, line
    cli("export", "ns", tmp_path / "dest").assert_clean_error()
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize("case", ["nested", "missing-manifest-old"])
def test_du_of_the_root_passes_over_a_namespace_with_nothing_readable(
    case: str, cli: Callable[..., Any], casfs_env: dict[str, Path], tmp_path: Path
) -> None:
    """`casfs du` of the whole root counts every namespace a mount could serve: one
    whose every record is unreadable serves as empty (a miss), so it counts as such and
    is named in the warning, instead of stopping the whole du. `du ns` of it fails in one
    line naming it (never a silent zero)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"A")
    (src / "b").write_bytes(b"BB")
    cli("import", src, "-n", "ok", check=True)
    (src / "c").write_bytes(b"C")  # its own manifest
    cli("import", src, "-n", "ns", check=True)
    root = casfs_env["root"]
    if case == "nested":
        _record(root, 1).write_bytes(b"[" * 200_000)
    else:  # its one record's manifest is no longer stored (past the grace: damage)
        base = json.loads(_record(root, 1).read_bytes())["base"]["digest"]
        (root / object_key(base)).unlink()
        t = time.time() - MISSING_GRACE - 60
        os.utime(_record(root, 1), (t, t))
    res = cli("du", "--json")
    assert res.rc == 0, res.err
    doc = res.json()
    assert doc["namespaces"] == 1 and doc["files"] == 2, doc
    assert [(s["namespace"], s["seq"]) for s in doc["skipped_generations"]] == [("ns", 1)]
    assert "ns@1" in _one_warning(res.err)
    line = cli("du", "ns").assert_clean_error()
    assert "no readable generation" in line and "ns@1" in line, line
