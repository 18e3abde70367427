"""Rolling upgrade: the previous release and this one on one shared root.

I3 (the newest generation stays complete): while no record needs the v2
format, both releases read and extend each other's generations and no entry
is lost. A record of a format newer than a node reads is served around and
never published over (docs/format.md, "Migration").
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from casfs.store.entry import Entry
from casfs.store.generations import seq_name
from casfs.store.root import SharedRoot
from tests.faults.conftest import REPO, cli_for

pytestmark = pytest.mark.expect_log(
    r"skipping newer-format generation",
)


def _ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0 and "Traceback" not in res.stderr, (res.stdout, res.stderr)
    return res.stdout


def _files(ls_json: str) -> set[str]:
    return {e["path"] for e in json.loads(ls_json)}


def test_previous_and_new_release_share_a_root(previous_release: Path, tmp_path: Path) -> None:
    root, src = tmp_path / "root", tmp_path / "src"
    src.mkdir()
    old = cli_for(previous_release, {"CASFS_ROOT": str(root),
                                     "CASFS_STATE_DIR": str(tmp_path / "old-state")})
    new = cli_for(REPO, {"CASFS_ROOT": str(root), "CASFS_STATE_DIR": str(tmp_path / "new-state")})
    _ok(old("init"))
    for i, (cli, name) in enumerate([(old, "a"), (new, "b"), (old, "c"), (new, "d")], 1):
        for p in src.iterdir():
            p.unlink()
        (src / name).write_text(name)
        _ok(cli("import", src, "-n", "ns"))
        want = {"a", "b", "c", "d"}
        want = {n for n in sorted(want)[:i]}
        # Each release sees every entry of the other's generations.
        assert _files(_ok(old("ls", "ns", "-r", "--json"))) == want
        assert _files(_ok(new("ls", "ns", "-r", "--json"))) == want
    _ok(old("verify"))
    _ok(new("verify"))

    # A record needing v2 (an optional key): the new release reads it...
    r = SharedRoot.open(root)
    data = r.objects.put_bytes(b"e")
    r.generations().publish("ns", [Entry("e", data.digest, data.size, 0o644, 1)], node="new",
                            options={"tenant": "t"})
    assert json.loads((root / f"namespaces/ns/generations/{seq_name(5)}").read_bytes())[
        "casfs_generation"] == 2
    assert _files(_ok(new("ls", "ns", "-r", "--json"))) == {"a", "b", "c", "d", "e"}
    # ...the previous release cannot (finish the rollout before enabling v2 features).
    assert old("ls", "ns").returncode != 0

    # The next format (v3), met by this release: served around, never published over.
    doc = json.loads((root / f"namespaces/ns/generations/{seq_name(5)}").read_bytes())
    doc |= {"casfs_generation": 3, "seq": 6, "parent": 5}
    (root / f"namespaces/ns/generations/{seq_name(6)}").write_text(json.dumps(doc))
    (src / "f").write_text("f")
    res = new("import", src, "-n", "ns")
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "newer than this casfs reads" in res.stderr
    assert not (root / f"namespaces/ns/generations/{seq_name(7)}").exists()
    gens = SharedRoot.open(root).generations()
    newest, rec, snap = gens.newest_valid("ns")
    assert (newest, rec.seq if rec else None) == (6, 5)
    assert set(snap.entries) == {"a", "b", "c", "d", "e"}
