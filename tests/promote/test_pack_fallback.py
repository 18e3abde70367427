"""A pack that cannot be written falls back to loose objects: publication never waits on it.

A root made ``casfs init --multi-user`` before packs existed has no world-writable
``packs/``: a user's promotion gets EACCES there. Its objects must go out loose
for that round (logged once, counted), not stay dirty and be retried forever.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from casfs.index.node_index import NodeIndex
from casfs.store.objects import object_key
from casfs.store.packs import iter_packs
from casfs.store.root import SharedRoot, open_to_users
from tests.promote.rig import promotion_rig
from tests.users import open_tmp, real_users


@pytest.mark.expect_log(
    r"cannot write a pack \(.*Not a directory.*\): storing its objects loose instead",
)
def test_unwritable_packs_fall_back_to_loose_objects(tmp_path: Path) -> None:
    root = SharedRoot.open(tmp_path / "root", create=True)
    shutil.rmtree(root.path / "packs", ignore_errors=True)
    (root.path / "packs").write_bytes(b"")  # not a directory: every pack write fails
    upper = tmp_path / "upper"
    files = {f"K{i}/k.ttir": f"kernel {i}\n".encode() * 50 for i in range(12)}  # > PARALLEL_MIN
    for rel, data in files.items():
        (upper / rel).parent.mkdir(parents=True, exist_ok=True)
        (upper / rel).write_bytes(data)
    index = NodeIndex.open(tmp_path / "state")
    try:
        promoter, publisher, counters, tracker = promotion_rig(root, upper, index)
        assert promoter.scan_all() == len(files)
        res = promoter.run_once(final=True)
        assert (res.promoted, res.errors) == (len(files), 0)
        assert tracker.pending() == 0  # nothing left to retry
        assert counters.get("promoted_loose_fallback") == len(files)
        assert root.objects.counters.get("packs_fallback_loose") >= 1
        assert counters.get("packs_promoted") == 0
        assert publisher.publish().ok
    finally:
        index.close()
    snap = root.generations().entries("ns").entries
    assert set(snap) == set(files)
    for rel, data in files.items():
        e = snap[rel]
        assert not (e.extras or {}).get("pack")  # loose, no pack named
        assert (root.path / object_key(e.digest)).is_file()
        assert root.objects.get_bytes(e.digest, e.size) == data


@pytest.mark.expect_log(
    r"cannot write a pack \(.*Permission denied.*\): storing its objects loose instead",
)
@pytest.mark.slow
def test_user_on_a_multi_user_root_made_before_packs_publishes() -> None:
    with open_tmp() as d:
        root = d / "root"
        SharedRoot.open(root, create=True)
        open_to_users(root)
        # As `casfs init --multi-user` left it before packs: no packs/ users can write.
        shutil.rmtree(root / "packs")
        os.mkdir(root / "packs", 0o755)
        with real_users(1, d) as (user,):
            env = user.env(CASFS_ROOT=str(root), CASFS_STATE_DIR=str(user.home / "state"),
                           CASFS_MOUNT_BASE=str(user.home / "mnt"),
                           CASFS_SOCKET=str(user.home / "no-daemon.sock"))
            script = ('for i in 1 2 3 4 5 6 7 8 9 10; do mkdir -p "$CASFS_CACHE_DIR/K$i" &&'
                      ' echo "kernel $i" > "$CASFS_CACHE_DIR/K$i/k.so"; done')
            r = user.casfs("run", "--mode", "dir", "--family", "generic", "--publish-interval",
                           "0.5", "--stable-after", "0", "--", "/bin/sh", "-c", script, env=env)
            out = r.stdout + r.stderr
            assert r.returncode == 0, out
        (ns,) = (p.name for p in (root / "namespaces").iterdir())
        snap = SharedRoot.open(root).generations().entries(ns).entries
        assert {f"K{i}/k.so" for i in range(1, 11)} <= set(snap), out
        assert not list(iter_packs(SharedRoot.open(root).objects))
        for i in range(1, 11):
            e = snap[f"K{i}/k.so"]
            assert (root / object_key(e.digest)).is_file()
        assert out.count("storing its objects loose") <= 1, out  # logged once, not per retry
