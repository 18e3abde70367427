"""Replacing an overlay mode mount process under a running job (casfs.node.handover).

overlay mode serves a kernel overlayfs whose lower layers are hard links to
local objects and a read-only FUSE layer of this process's. A successor has
layers of its own (``links@<pid>``, ``fuse@<pid>``, ``work@<pid>``), mounts its
overlay over the same upper on the stage and moves it beneath the old one; the
old process detaches its overlay and its FUSE layer and serves what the job
holds (its cwd, open and mapped files, a dlopened ``.so``) until the job lets
go. The job of tests/node/test_handover.py sees nothing across the
replacements, and every file it wrote is published. Before this, an overlay
mode replacement stopped the old process first: the job's cwd and open files
went with the old overlay's FUSE layer.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from casfs.node import control, guard, handover
from casfs.node.worker import Worker, replace
from tests.node.test_handover import Job, _drained, _published

pytestmark = pytest.mark.fuse


def _layers(base: Path) -> set[str]:
    return {p.name for p in base.iterdir()} if base.exists() else set()


def _replace_under_job(node: Any, w: Worker, times: int, tmp: Path,
                       check: Callable[[Worker], None]
                       ) -> tuple[Worker, list[Worker], dict[str, Any]]:
    """Replace ``w`` ``times`` times under the job of test_handover, ``check``ing each
    successor: (the last one, the replaced ones, the job's report: no error, no
    operation over 1 s)."""
    job = Job(w.cfg.mountpoint, tmp)
    olds: list[Worker] = []
    try:
        job.wait_loops()
        for _ in range(times):
            t0 = time.monotonic()
            new, seamless = replace(w)
            assert seamless
            assert time.monotonic() - t0 < 30
            olds.append(w)
            node.workers.remove(w)
            node.workers.append(new)
            w = new
            check(w)
            time.sleep(0.2)
        report = job.finish()
    finally:
        if job.proc.poll() is None:
            job.stop_file.touch()
            job.proc.wait(60)
    assert report["errors"] == [], report["errors"][:10]
    assert report["slow"] == [], report["slow"]
    return w, olds, report


def test_overlay_replacements_never_reach_the_job(cluster: dict[str, Any],
                                                  tmp_path: Path) -> None:
    a = cluster["a"]
    w = a.mount("generic", mode="overlay")
    mp = w.cfg.mountpoint
    base = w.cfg.overlay_base
    assert guard.mounts_at(mp)[-1].fstype == "overlay"
    stacks = []

    def check(new: Worker) -> None:
        stacks.append([m.fstype for m in guard.mounts_at(mp)])
        assert control.registered(new.cfg.run_dir)[0]["pid"] == new.proc.pid
        # The successor's own layers, in its overlay's options.
        top = guard.mounts_at(mp)[-1]
        assert f"links@{new.proc.pid}:" in top.options and f"fuse@{new.proc.pid}" in top.options

    w, olds, report = _replace_under_job(a, w, 20, tmp_path, check)
    assert report["loops"] > 100, report["loops"]
    print(f"overlay handover: {report['loops']} loops, slowest operation"
          f" {report['worst'] * 1000:.1f} ms")
    # One overlay visible each time (the old one detached), never the guard alone.
    assert all(s[-1] == "overlay" and s.count("overlay") == 1 for s in stacks), stacks
    # The old processes exit by themselves once the job let go (their FUSE layers'
    # connections end with the old overlays), after a final publication each.
    _drained(olds)
    final = a.stop(w)
    assert final is not None and final["last_publish"]["ok"]
    pub = _published(a.root)
    lost = [rel for rel, data in report["written"] if pub.get(rel) != data.encode()]
    assert lost == [], f"{len(lost)} of {len(report['written'])} lost: {lost[:10]}"
    assert pub["held-log.txt"].split() == [b"%d" % i for i in range(1, report["loops"] + 1)]
    assert pub["seed.txt"] == b"seed bytes\n"

    # The processes gone, their layers are removed by the next start.
    stale = {n for n in _layers(base) if re.fullmatch(r"(links|fuse|work)@\d+", n)}
    assert stale, _layers(base)  # the successors' layers were there
    again = a.mount("generic", mode="overlay")
    left = {n for n in _layers(base) if re.fullmatch(r"(links|fuse|work)@\d+", n)}
    assert left == set(), left
    assert (mp / "seed.txt").read_bytes() == b"seed bytes\n"
    a.stop(again)


def test_a_fuse_mount_is_not_taken_over_by_an_overlay(cluster: dict[str, Any]) -> None:
    """A changed mode cannot stack (one kind beneath the other): the predecessor says
    so at ``prepare`` and keeps serving; the caller then stops it and mounts again."""
    a = cluster["a"]
    w = a.mount("generic")
    cfg = w.cfg
    try:
        with pytest.raises(handover.HandoverUnavailable, match="this is a fuse mount"):
            handover.prepare(cfg.run_dir, cfg.name, cfg.mountpoint, "overlay")
        (cfg.mountpoint / "still.txt").write_bytes(b"served")
        assert (cfg.mountpoint / "still.txt").read_bytes() == b"served"
    finally:
        a.stop(w)


def test_stale_layers_are_those_of_dead_processes_only(tmp_path: Path) -> None:
    """``<layer>@<pid>`` of a process gone goes; a live one's stays, and so does another
    namespace's loopfs work directory whose name merely ends in "-<digits>"."""
    from casfs.view import overlay

    base = tmp_path / "overlay" / "ns"
    work = tmp_path / "fs" / "work" / "ns"
    paths = overlay.OverlayPaths(tmp_path / "upper", base, work)
    dead, live = 999_999_999, 4242
    for p in (paths.own(dead), paths.own(live), paths):
        for d in (p.links, p.fuse, p.work):
            (d / "sub").mkdir(parents=True)
    other = work.parent / "ns-17"  # namespace "ns-17": not a layer of "ns"
    other.mkdir()
    n = overlay.clean_stale(paths, alive=lambda pid: pid == live)
    assert n == 3
    assert sorted(x.name for x in base.iterdir()) == sorted(
        ["links", "fuse", f"links@{live}", f"fuse@{live}"])
    assert sorted(x.name for x in work.parent.iterdir()) == sorted(
        ["ns", f"ns@{live}", "ns-17"])


def test_a_tenant_overlay_on_loopfs_is_handed_over(cluster: dict[str, Any],
                                                   tmp_path: Path) -> None:
    """With loopfs quotas the upper and overlayfs's work directory live on the tenant's
    own filesystem: a successor's work directory is its own there too."""
    from casfs.node import quota
    from casfs.tenants import TenantPolicy
    from tests.users import open_tmp, real_users

    if (why := quota.loopfs_unavailable()) is not None:
        pytest.fail(f"loopfs is unavailable here: {why}")
    with open_tmp() as shared, real_users(1, shared) as (user,):
        a = cluster["a"]
        mp = shared / "mnt" / "o"
        ns = f"{user.tenant}~testns"
        w = a.mount(name="o", mountpoint=mp, namespace=ns, tenant=user.tenant,
                    tenants=TenantPolicy().to_dict(), mode="overlay",
                    quota={"bytes": 64 << 20, "inodes": 4096, "mechanism": "loopfs"})
        try:
            work = w.cfg.overlay_work

            def check(new: Worker) -> None:
                assert (work.parent / f"{work.name}@{new.proc.pid}").is_dir()

            w, olds, report = _replace_under_job(a, w, 3, tmp_path, check)
            _drained(olds)
            a.stop(w)
            pub = _published(a.root, ns)
            lost = [rel for rel, data in report["written"] if pub.get(rel) != data.encode()]
            assert lost == [], f"{len(lost)} of {len(report['written'])} lost: {lost[:10]}"
        finally:
            a.stop_all()
            quota.unmount_all(a.state)
