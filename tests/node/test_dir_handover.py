"""Replacing a dir mode mount process under a running job (casfs.node.handover, ``leave``).

dir mode has no FUSE connection: the job uses a plain directory (with loopfs
quotas, the tenant's directory bind-mounted at the mount point). A replacement
(an upgrade, a changed configuration) asks the old process to leave: it
publishes and exits leaving the directory, and its bind, in place; the new one
takes the directory over and scans it for what was written meanwhile. The job
of tests/node/test_handover.py (held fds, a mapped file, a dlopened ``.so``,
its cwd in the directory, writing and reading in a loop) sees nothing, and
every file it wrote is published. Before this, such a replacement stopped the
old process first: with loopfs its bind went, and the job's paths showed the
empty mount point.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from casfs.node import control, guard, quota
from casfs.node.worker import Worker, replace
from casfs.store.root import SharedRoot
from casfs.tenants import TenantPolicy
from tests.fusehelpers import root_objects
from tests.node.test_handover import Job

pytestmark = pytest.mark.fuse


def _published(root: Path, ns: str) -> dict[str, bytes]:
    snap = SharedRoot.open(root).generations().entries(ns).entries
    objects = root_objects(root, ns)
    return {p: objects.get_bytes(e.digest) for p, e in snap.items()
            if getattr(e, "digest", None)}


def _replace_under_job(node: Any, w: Worker, times: int,
                       tmp: Path) -> tuple[Worker, dict[str, Any]]:
    mp = w.cfg.mountpoint
    job = Job(mp, tmp)
    try:
        job.wait_loops()
        for _ in range(times):
            before = [m.id for m in guard.mounts_at(mp)]
            new, seamless = replace(w)
            assert seamless
            # The old process left by itself, after its final publication.
            assert w.proc.wait(60) == 0
            w.release()
            node.workers.remove(w)
            node.workers.append(new)
            w = new
            assert control.registered(w.cfg.run_dir)[0]["pid"] == w.proc.pid
            assert [m.id for m in guard.mounts_at(mp)] == before  # the same bind, or none
        report = job.finish()
    finally:
        if job.proc.poll() is None:
            job.stop_file.touch()
            job.proc.wait(60)
    assert report["errors"] == [], report["errors"]
    assert report["slow"] == [], report["slow"]
    assert report["loops"] > 20, report
    return w, report


def _all_published(report: dict[str, Any], pub: dict[str, bytes]) -> None:
    lost = [rel for rel, data in report["written"] if pub.get(rel) != data.encode()]
    assert lost == [], f"{len(lost)} of {len(report['written'])} lost: {lost[:10]}"
    assert pub["held-log.txt"].split() == [b"%d" % i for i in range(1, report["loops"] + 1)]


def test_dir_mode_replacements_never_reach_the_job(cluster: dict[str, Any],
                                                   tmp_path: Path) -> None:
    a = cluster["a"]
    w = a.mount("generic", mode="dir")
    w, report = _replace_under_job(a, w, 5, tmp_path)
    final = a.stop(w)
    assert final is not None and final["last_publish"]["ok"]
    # The job wrote while each successor started: its walk for what was written before
    # it ran once its watch had started (the two see every write between them), so the
    # release needs none (the watch vouches for the rest).
    assert final["counters"].get("promotion_walks", 0) == 0, final["counters"]
    _all_published(report, _published(a.root, "testns"))


def test_a_dir_mode_bind_stays_across_replacements(cluster: dict[str, Any],
                                                   tmp_path: Path) -> None:
    """With loopfs quotas the directory is the tenant filesystem's, bind-mounted at the
    mount point: the bind is the same mount throughout, and goes at the final stop."""
    if (why := quota.loopfs_unavailable()) is not None:
        pytest.fail(f"loopfs is unavailable here: {why}")
    from tests.users import open_tmp, real_users

    with open_tmp() as shared, real_users(1, shared) as (user,):
        a = cluster["a"]
        mp = shared / "mnt" / "d"
        w = a.mount(name="d", mountpoint=mp, namespace=f"{user.tenant}~testns",
                    tenant=user.tenant, tenants=TenantPolicy().to_dict(), mode="dir",
                    quota={"bytes": 64 << 20, "inodes": 4096, "mechanism": "loopfs"})
        try:
            assert len(guard.mounts_at(mp)) == 1  # the bind
            w, report = _replace_under_job(a, w, 3, tmp_path)
            a.stop(w)
            assert guard.mounts_at(mp) == []  # a plain stop takes the bind away
            _all_published(report, _published(a.root, f"{user.tenant}~testns"))
        finally:
            a.stop_all()
            quota.unmount_all(a.state)
