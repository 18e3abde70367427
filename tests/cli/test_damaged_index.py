"""A damaged node index (a power loss under LMDB's sync=False, a bad disk) is moved
aside and started afresh by the next mount: the node goes on sharing, instead of
serving private caches until an operator steps in. Real casfs run, real LMDB."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from casfs.store.root import SharedRoot

pytestmark = pytest.mark.fuse


def run(tmp: Path, script: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CASFS_ROOT=str(tmp / "root"), CASFS_STATE_DIR=str(tmp / "state"),
               CASFS_MOUNT_BASE=str(tmp / "mnt"), CASFS_SOCKET=str(tmp / "no-daemon.sock"))
    return subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
                           "--python", sys.executable, "--", "sh", "-c", script],
                          env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.expect_log(
    r"node index .* is damaged .*: moved to ",
    r"the object cache .* was dropped with the damaged index",
)
@pytest.mark.parametrize("damage", ["garbage", "truncated", "truncated_after_meta"])
def test_a_damaged_node_index_is_set_aside_and_the_node_keeps_sharing(
        tmp_path: Path, damage: str) -> None:
    r = run(tmp_path, 'mkdir -p "$CASFS_CACHE_DIR/k" && echo one > "$CASFS_CACHE_DIR/k/f"')
    assert r.returncode == 0, r.stderr[-3000:]
    data = tmp_path / "state" / "index" / "data.mdb"
    if damage == "garbage":
        with open(data, "r+b") as f:
            f.write(b"\xde\xad" * 4096)
    elif damage == "truncated":
        os.truncate(data, 100)
    else:  # the two meta pages whole: LMDB opens it, and its first read past the end
        # was a SIGBUS in every later mount process (and `casfs doctor`)
        os.truncate(data, 2 * os.sysconf("SC_PAGESIZE"))
    r = run(tmp_path, 'test "$(cat "$CASFS_CACHE_DIR/k/f")" = one && '
                      'echo two > "$CASFS_CACHE_DIR/k/g"')
    assert r.returncode == 0, r.stderr[-3000:]
    assert "private" not in r.stderr, r.stderr[-3000:]  # the node's shared cache, not a temp dir
    gens = SharedRoot.open(tmp_path / "root").generations()
    (ns,) = gens.namespaces()
    assert set(gens.snapshot(gens.latest(ns)).entries) == {"k/f", "k/g"}
    state = sorted(p.name for p in (tmp_path / "state").iterdir())
    assert [n for n in state if n.startswith("index.damaged-")], state  # kept for a look
    assert "is damaged" in (tmp_path / "state" / "log" / "host.log").read_text()
