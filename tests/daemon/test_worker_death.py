"""kill -9 of casfsd's mount processes while jobs read and write: what they see (I1, I2).

Probes read a published file and create files every millisecond, through a
leased on-demand namespace and a configured mount, while every mount process
is killed. Invariants: no wrong byte ever; a create that succeeded is never
lost; neither has a gap: casfsd holds the connection of the configured fuse
mode mount and of the node's host for the next process (casfs.view.adopt), so
the probes see nothing but success; the leased namespace is served again at the
same path, its job's lease intact. The durations are measured by
``python -m bench.worker_death``, not asserted here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fusehelpers import require_fuse

from bench.worker_death import Node, setup, trial

pytestmark = [pytest.mark.fuse, pytest.mark.slow]


@pytest.mark.expect_log(
    r"worker pid \d+ killed by signal \d+; restarting",
    r"clearing a dead mount at ",
    r"cleared the dead mount at ",
    # the test's own clean-up kills its job (SIGKILL) before casfsd stops: if the lease
    # check sees it first, what the job wrote last is held back, as it should be
    r"a job was killed: \d+ files it may have been writing are not published",
)
def test_kill_9_of_the_mount_processes(tmp_path: Path) -> None:
    require_fuse()
    if os.geteuid() != 0:
        pytest.skip("the read-only guard needs root (CAP_SYS_ADMIN)")
    node = Node(tmp_path)
    job = None
    try:
        ns_path, job = setup(node)
        out = trial(node, ns_path, job.pid)
    finally:
        if job is not None:
            job.kill()
            job.wait()
        node.close()
    assert out["job_lease_kept"]
    for name in ("on_demand", "configured"):
        r = out[name]
        assert r["served_again"], (name, r)
        assert r["wrong_bytes"] == 0 and r["lost_writes"] == 0, (name, r)
        # No gap: casfsd held the connection and a new process served it
        # (casfs.view.adopt); the probes saw nothing but success.
        assert set(r["read_outcomes"]) == {"ok"}, (name, r)
        assert set(r["write_outcomes"]) == {"ok"}, (name, r)
