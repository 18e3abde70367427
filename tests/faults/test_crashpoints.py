"""kill -9 at each step of promotion and publication (CASFS_CRASHPOINT, casfs/util/crashpoint.py).

I3: whatever a crash leaves, the store verifies clean, generations stay
contiguous and the newest one is complete; the next run publishes what the
dead one did not. I1/I2: a restarted node serves the job's files with their
bytes. Complements tests/store/test_concurrency.py (kills at random moments).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from casfs.store.packs import pack_key
from casfs.store.root import SharedRoot
from casfs.util.crashpoint import STEPS
from tests.fusehelpers import root_objects

pytestmark = pytest.mark.expect_log(
    r"promotion worker \d+: its connection closed: replacing it",
    # the same kill, when the watchdog's wait sees it before the reader does
    r"promotion worker \d+ died \(exit status -9\) after [\d.]+s; restarting",
)


def _casfs(root: Path, state: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(root),
                           "--state-dir", str(state), *args], capture_output=True, text=True,
                          timeout=120, check=False, env=dict(os.environ) | env)


def _assert_store_sound(root: Path, state: Path, ns: str) -> dict[str, Any]:
    ver = _casfs(root, state, "verify", "--json")
    assert ver.returncode == 0, ver.stdout + ver.stderr
    gens = SharedRoot.open(root).generations()
    seqs = gens.seqs(ns)
    assert seqs == list(range(1, len(seqs) + 1))
    return gens.entries(ns).entries  # the newest generation is complete (raises otherwise)


IMPORT_STEPS = [s for s in STEPS if s != "after-objects"]  # that one is promotion's


@pytest.mark.parametrize("step", IMPORT_STEPS)
def test_kill9_during_import(step: str, tmp_path: Path) -> None:
    root, state, src = tmp_path / "root", tmp_path / "state", tmp_path / "src"
    src.mkdir()
    (src / "old").write_bytes(b"published before")
    assert _casfs(root, state, "import", str(src), "-n", "ns").returncode == 0
    files = {f"new{i}": os.urandom(3000) for i in range(6)}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    packs = ["--packs"] if step == "pack-staged" else []  # a POSIX import packs only if asked
    res = _casfs(root, state, "import", str(src), "-n", "ns", *packs, CASFS_CRASHPOINT=step,
                 CASFS_CRASHPOINT_AFTER="2" if step == "object-staged" else "0")
    assert res.returncode == -signal.SIGKILL, (res.returncode, res.stderr)
    entries = _assert_store_sound(root, state, "ns")
    assert set(entries) in ({"old"}, {"old", *files})  # all of the import or none of it
    assert _casfs(root, state, "import", str(src), "-n", "ns").returncode == 0
    entries = _assert_store_sound(root, state, "ns")
    assert set(entries) == {"old", *files}
    objects = root_objects(root, "ns")
    for rel, data in files.items():
        assert objects.get_bytes(entries[rel].digest) == data
    assert _casfs(root, state, "gc", "--grace", "0").returncode == 0  # crash leftovers go
    _assert_store_sound(root, state, "ns")


MOUNT_STEPS = ["pack-staged", "after-objects", "before-manifest", "after-manifest", "after-sync",
               "after-record"]


@pytest.mark.fuse
@pytest.mark.parametrize("step", MOUNT_STEPS)
def test_kill9_of_the_promotion_worker_at_each_step(step: str, cluster: dict[str, Any],
                                                     tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Promotion and publication run in the mount's promotion worker
    (casfs.node.promoteworker): a kill -9 there at any step never reaches the
    mount process (its FUSE connection stays up) nor the job (I1/I2); the
    replacement worker finishes the same publication, and the store stays sound
    with every row naming a pack that is there (I3)."""
    b = cluster["b"]
    monkeypatch.setenv("CASFS_CRASHPOINT", step)
    monkeypatch.setenv("CASFS_CRASHPOINT_ONCE", str(tmp_path / "crashed"))  # one death
    w = b.mount()
    mp = w.cfg.mountpoint
    files = {f"k/f{i}": os.urandom(2000 + i) for i in range(5)}
    for rel, data in files.items():
        (mp / rel).parent.mkdir(parents=True, exist_ok=True)
        (mp / rel).write_bytes(data)
    out = b.ask(w, "publish")
    assert (tmp_path / "crashed").exists()  # a promotion worker died at the step
    assert out["ok"] is True, out  # and its replacement published
    assert w.proc.poll() is None  # the mount process never noticed
    st = b.ask(w, "status")
    assert st["promote_worker"]["worker_deaths"] >= 1, st["promote_worker"]
    assert st["pending_promotion"] == 0 and st["pending_publication"] == 0, st
    for rel, data in files.items():
        assert (mp / rel).read_bytes() == data  # the job's files, served all along
    b.stop(w)
    entries = _assert_store_sound(cluster["root"], b.state, "testns")
    assert set(entries) == set(files), (step, sorted(entries))
    objects = root_objects(cluster["root"])
    for rel, data in files.items():
        assert objects.get_bytes(entries[rel].digest) == data
        # Promotion packs small files: every manifest row names a pack that is there.
        pack = (entries[rel].extras or {}).get("pack")
        assert pack is not None and (cluster["root"] / pack_key(pack[0])).is_file(), (rel, pack)
