"""The compile-seconds format step (extras ``cs``, docs/format.md): releases before it
keep reading, extending and collecting generations whose rows carry it.

The release checked is 9f329ee (the last one before the step that reads v2
manifests); its code is extracted with ``git archive`` and run in a subprocess.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from casfs.store.entry import Entry, compile_seconds
from casfs.store.root import SharedRoot
from tests.faults.conftest import REPO, cli_for

BEFORE_THE_STEP = "9f329ee"


@pytest.fixture(scope="module")
def before_step(tmp_path_factory: pytest.TempPathFactory) -> Path:
    git = shutil.which("git")
    assert git, "git is needed to extract the release before the step"
    dest = tmp_path_factory.mktemp("before-cs")
    archive = subprocess.run([git, "-C", str(REPO), "archive", BEFORE_THE_STEP, "casfs"],
                             capture_output=True, check=True, timeout=60).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True, timeout=60)
    assert not (dest / "casfs/node/compiletime.py").exists()  # really the code before
    return dest


def _ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0 and "Traceback" not in res.stderr, (res.stdout, res.stderr)
    return res.stdout


_READ = """
import json, sys
from casfs.store.root import SharedRoot
snap = SharedRoot.open(sys.argv[1]).generations().entries("ns")
print(json.dumps({p: [e.digest, e.extras] for p, e in snap.entries.items()}))
"""


def test_rows_with_compile_seconds_read_by_the_release_before(before_step: Path,
                                                               tmp_path: Path) -> None:
    root_dir = tmp_path / "root"
    root = SharedRoot.open(root_dir, create=True)
    a, b = root.objects.put_bytes(b"kernel"), root.objects.put_bytes(b"group")
    rows = [Entry("K/k.cubin", a.digest, a.size, 0o644, 1),
            Entry("K/__grp__k.json", b.digest, b.size, 0o644, 2, {"cs": 212.345})]
    root.generations().publish("ns", rows, node="new")
    # The new release reads the figure...
    snap = root.generations().entries("ns")
    assert compile_seconds(snap.entries["K/__grp__k.json"]) == 212.345
    assert compile_seconds(snap.entries["K/k.cubin"]) is None

    # ...the release before the step reads the generation whole, the key kept.
    out = subprocess.run([sys.executable, "-c", _READ, str(root_dir)], capture_output=True,
                         text=True, timeout=120, env={"PYTHONPATH": str(before_step)},
                         cwd=before_step)
    got = json.loads(_ok(out))
    assert got == {"K/k.cubin": [a.digest, None],
                   "K/__grp__k.json": [b.digest, {"cs": 212.345}]}

    # It extends the namespace (its row has no figure), and the figure survives its
    # compaction (a full base rewritten by the old code: extras passed through).
    src = tmp_path / "src"
    src.mkdir()
    (src / "other").write_text("x")
    old = cli_for(before_step, {"CASFS_ROOT": str(root_dir),
                                "CASFS_STATE_DIR": str(tmp_path / "old-state")})
    _ok(old("import", src, "-n", "ns"))
    files = {e["path"] for e in json.loads(_ok(old("ls", "ns", "-r", "--json")))}
    assert files == {"K/k.cubin", "K/__grp__k.json", "other"}
    _ok(old("verify"))
    _ok(old("gc", "--grace", "0"))
    snap = SharedRoot.open(root_dir).generations().entries("ns")
    assert compile_seconds(snap.entries["K/__grp__k.json"]) == 212.345
    new = cli_for(REPO, {"CASFS_ROOT": str(root_dir),
                         "CASFS_STATE_DIR": str(tmp_path / "new-state")})
    _ok(new("verify"))


@pytest.mark.parametrize("value", ["12", -1, 1e12, True, None, [1], {"s": 1}])
def test_a_figure_out_of_range_is_ignored_not_damage(tmp_path: Path, value: object) -> None:
    root = SharedRoot.open(tmp_path / "root", create=True)
    a = root.objects.put_bytes(b"x")
    root.generations().publish("ns", [Entry("f", a.digest, a.size, 0o644, 1, {"cs": value})],
                               node="n")
    snap = root.generations().entries("ns")
    assert snap.entries["f"].digest == a.digest
    assert compile_seconds(snap.entries["f"]) is None


def test_nan_in_a_manifest_is_no_figure() -> None:
    from casfs.store import manifest

    row = ["f", "a" * 64, 1, 0o644, 0, {"cs": float("nan")}]
    blob = json.dumps({"casfs_manifest": 2, "kind": "full", "entries": [row]}).encode()
    _, entries = manifest.decode(blob)
    assert compile_seconds(entries[0]) is None
