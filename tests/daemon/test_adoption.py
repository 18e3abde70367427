"""casfsd restarts that no job sees (casfs.node.lifeline, casfs.node.adopted).

A job reads and writes through a casfsd mount in a loop, holding files open,
a file mapped, a dlopened ``.so`` and its cwd in the mount (the job of
tests/node/test_handover.py), while casfsd itself is killed with SIGKILL and
started again, re-executed with SIGUSR2 20 times, and re-executed into a newer build of
casfs. The mount processes serve on throughout: 0 errors, no operation over
1 s, every file the job wrote published at the end. The same build is adopted
as it is (the same mount process); a newer one is handed over to.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from tests.daemon.conftest import Daemon
from tests.node.test_handover import Job, _published

pytestmark = [pytest.mark.fuse, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
OPTS = {"stable_after": 0.2, "publish_interval": 1.0, "refresh_interval": 3600.0}


def _mount(mode: str = "fuse") -> list[dict[str, Any]]:
    return [{"name": "m", "family": "generic", "namespace": "testns", "mode": mode}]


def _worker(d: Daemon) -> int:
    return int(next(m for m in d.status() if m["name"] == "m")["pid"])


def _host(d: Daemon, mp: Path) -> int:
    """The node's mount process serving the on-demand namespace at ``mp``."""
    return int(next(r for r in d.status() if r.get("path") == str(mp))["pid"])


def _finish(d: Daemon, job: Job) -> None:
    report = job.finish()
    assert report["errors"] == [] and report["slow"] == [], report
    assert report["loops"] > 10, report
    assert d.terminate() == 0
    pub = _published(d.root)
    lost = [rel for rel, data in report["written"] if pub.get(rel) != data.encode()]
    assert lost == [], f"{len(lost)} of {len(report['written'])}: {lost[:20]}"


def _reexec(d: Daemon) -> None:
    assert d.proc is not None and d.notify is not None
    d.notify.messages.clear()
    d.proc.send_signal(signal.SIGUSR2)
    d.notify.wait_for("READY", "1", proc=d.proc)
    assert d.notify.has("RELOADING", "1")  # systemd sees a reload, not a new main process


def test_casfsd_killed_and_started_again_adopts_its_mount(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    d = daemons("a", _mount(), defaults=OPTS, node={"on_demand": False})
    mp = d.mount_paths[0]
    job = Job(mp, tmp_path)
    try:
        job.wait_loops()
        pid = _worker(d)
        assert d.proc is not None
        d.proc.kill()  # casfsd only: its mount process serves on
        d.proc.wait(30)
        time.sleep(1.0)  # the job keeps going without any casfsd
        assert os.path.exists(f"/proc/{pid}")
        d.start()
        assert _worker(d) == pid  # adopted, not started again
        assert f"adopted the running mount process pid {pid}" in d.log()
        time.sleep(0.5)
    finally:
        if job.proc.poll() is None:
            _finish(d, job)
    # stopped for real at the end: the mount is gone, its process too
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"), "the adopted process stopped")


@pytest.mark.expect_log(r"worker pid \d+ killed by signal 9; restarting",
                        r"clearing a dead mount at ", r"cleared the dead mount at ")
def test_sigusr2_reexecutes_casfsd_and_the_mounts_serve_on(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    d = daemons("a", _mount(), defaults=OPTS, node={"on_demand": False})
    job = Job(d.mount_paths[0], tmp_path)
    try:
        job.wait_loops()
        pid = _worker(d)
        assert d.proc is not None
        for _ in range(20):  # the 20 restarts
            _reexec(d)
            assert _worker(d) == pid
        assert d.log().count("exiting for a restart: 1 mount processes serve on") == 20
        report = job.finish()
        assert report["errors"] == [] and report["slow"] == [], report
    finally:
        if job.proc.poll() is None:
            job.stop_file.touch()
            job.proc.wait(60)
    # still supervised: a dead mount process is restarted by the re-executed casfsd
    os.kill(pid, signal.SIGKILL)

    def restarted() -> bool:
        try:
            return _worker(d) != pid
        except AssertionError:  # between the two processes
            return False

    wait_until(restarted, "the mount process restarted", proc=d.proc)
    assert d.terminate() == 0


@pytest.mark.parametrize("mode", ["fuse", "overlay"])
def test_sigusr2_into_a_newer_build_hands_every_mount_over(
        daemons: Callable[..., Daemon], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """casfsd and its mount processes run a copy of casfs; the copy is changed (an
    upgrade installed in place); USR2: the new casfsd adopts the mount process, sees
    another build, and hands the mount over to a process of the new build (a FUSE
    mount, or overlay mode's overlay)."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "casfs", site / "casfs",
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("PYTHONPATH", str(site))
    d = daemons("a", _mount(mode), defaults=OPTS, node={"on_demand": False})
    job = Job(d.mount_paths[0], tmp_path)
    try:
        job.wait_loops()
        pid = _worker(d)
        with open(site / "casfs" / "__init__.py", "a") as f:
            f.write("\n# an upgrade\n")
        _reexec(d)
        new = _worker(d)
        assert new != pid
        log = d.log()
        assert f"adopted the running mount process pid {pid}" in log
        assert "replacing it: another casfs build" in log
        assert f"took over {d.mount_paths[0]} from pid {pid}" in log
        from casfs.node import guard

        assert guard.mounts_at(d.mount_paths[0])[-1].fstype == (
            "overlay" if mode == "overlay" else "fuse.casfs")
        time.sleep(0.5)
    finally:
        if job.proc.poll() is None:
            _finish(d, job)
    # the replaced process drained (the job let go) and exited by itself
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"), "the replaced process exited")


def test_an_upgrade_hands_the_on_demand_namespaces_over_under_a_casfs_env_job(
        daemons: Callable[..., Daemon], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The node's mount process for on-demand namespaces too (casfs.node.host): a job
    leased its namespace with ``casfs env`` and works in it; USR2 into a newer build
    replaces every mount process, this one included, seamlessly; its lease is the new
    process's, and new leases are granted during and after the replacement."""
    import subprocess
    import sys
    import threading

    from casfs.store.root import SharedRoot

    site = tmp_path / "site"
    shutil.copytree(REPO / "casfs", site / "casfs",
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("PYTHONPATH", str(site))
    d = daemons("a", _mount(), defaults=OPTS, node={"lease_grace": 0.5})
    env = dict(d.env(), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    # The lease's holder ends with status 0 when told (a line on its stdin): a holder
    # killed by a signal is a killed job, whose last writes are torn and never published
    # (casfs.node.host._torn; a CI run lost the job's last 33 files to a kill here).
    holder = subprocess.Popen(
        ["sh", "-c", 'eval "$(casfs env --family generic --namespace hns)" &&'
                     ' echo "$CASFS_CACHE_DIR" && read -r _'],
        env=env, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    mp = Path(holder.stdout.readline().strip())
    assert mp.is_dir(), mp
    (mp / "w").mkdir()  # the job's stop file goes beside its dir: inside the namespace
    job = Job(mp / "w", tmp_path)
    leases: list[int] = []

    def lease_meanwhile() -> None:
        for i in range(6):
            r = subprocess.run(["casfs", "env", "--family", "generic", "--namespace",
                                f"meanwhile{i}"], env=env, capture_output=True, timeout=120)
            leases.append(r.returncode)
            time.sleep(0.1)

    try:
        job.wait_loops()
        host = _host(d, mp)
        with open(site / "casfs" / "__init__.py", "a") as f:
            f.write("\n# an upgrade\n")
        t = threading.Thread(target=lease_meanwhile)
        t.start()
        _reexec(d)
        t.join(120)
        new = _host(d, mp)
        assert new != host
        assert f"took over {mp.parent.parent} from pid {host}" in d.log()
        assert leases == [0] * 6, leases
        st = json.loads(d.cli("status", "--json").stdout)
        row = next(r for r in st if r.get("path") == str(mp))
        assert holder.pid in row["holders"]  # the lease came along
        time.sleep(0.5)
        report = job.finish()
        assert report["errors"] == [] and report["slow"] == [], report
    finally:
        if job.proc.poll() is None:
            job.stop_file.touch()
            job.proc.wait(60)
        assert holder.stdin is not None
        holder.stdin.write("done\n")
        holder.stdin.close()
        if holder.wait(30) != 0:
            holder.kill()
    assert d.terminate() == 0
    gens = SharedRoot.open(d.root).generations()
    (ns,) = [n for n in gens.namespaces() if n.endswith("hns")]
    pub = _published(d.root, ns)
    lost = [rel for rel, data in report["written"] if pub.get(f"w/{rel}") != data.encode()]
    assert lost == [], f"{len(lost)} of {len(report['written'])}: {lost[:20]}"
    wait_until(lambda: not os.path.exists(f"/proc/{host}"), "the replaced host exited")


def test_a_mount_removed_while_casfsd_was_down_is_stopped_at_its_start(
        daemons: Callable[..., Daemon]) -> None:
    """casfsd killed, its configuration edited to drop a mount, casfsd started: the
    kept mount is adopted; the dropped one's process, left serving, is stopped at once
    (final publication, unmount) instead of lingering for the adoption grace."""
    from fusehelpers import mounted

    from tests.daemon.conftest import write_config

    mounts = [*_mount(), {"name": "gone", "family": "generic", "namespace": "gonens"}]
    d = daemons("a", mounts, defaults=OPTS, node={"on_demand": False})
    keep, drop = d.mount_paths
    (drop / "left.txt").write_text("written before the edit")
    pids = {m["name"]: int(m["pid"]) for m in d.status()}
    assert d.proc is not None
    d.proc.kill()
    d.proc.wait(30)
    write_config(d.config, root=d.root, state=d.state,
                 mounts=[{**_mount()[0], "path": str(keep)}], defaults=OPTS,
                 node={"on_demand": False})
    d.start()
    assert _worker(d) == pids["m"]
    assert not mounted(drop)
    from casfs.node.control import running

    assert not running(pids["gone"])  # exited (a zombie until init reaps it)
    assert "gone: no longer configured: stopping the mount process it left serving" in d.log()
    from tests.node.test_handover import _published as published

    assert published(d.root, "gonens") == {"left.txt": b"written before the edit"}
    assert d.terminate() == 0


def test_a_process_replaced_before_a_reexec_is_stopped_with_casfsd(
        daemons: Callable[..., Daemon], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A job holding its cwd on the mount keeps the replaced process draining after a
    handover. casfsd re-executed since (a restart) knew it no more: stopped, it left
    that process serving, unsupervised and publishing, for as long as the job held on
    (a review, 2026-12-06). Now casfsd's stop finds it by its writers files."""
    import subprocess

    site = tmp_path / "site"
    shutil.copytree(REPO / "casfs", site / "casfs",
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("PYTHONPATH", str(site))
    d = daemons("a", _mount(), defaults=OPTS, node={"on_demand": False})
    mp = d.mount_paths[0]
    holder = subprocess.Popen(["sleep", "600"], cwd=mp)
    try:
        pid = _worker(d)
        with open(site / "casfs" / "__init__.py", "a") as f:
            f.write("\n# an upgrade\n")
        _reexec(d)  # the new casfsd hands the mount over: pid drains (the holder's cwd)
        assert _worker(d) != pid
        _reexec(d)  # a restart: this casfsd never saw the handover
        time.sleep(1)
        assert os.path.exists(f"/proc/{pid}"), "the replaced process drains"
        assert d.terminate() == 0
        assert f"stopping pid {pid}, a replaced mount process still draining" in d.log()
        # (before: serving on, for good; its exit reaped by init once casfsd is gone)
        wait_until(lambda: not os.path.exists(f"/proc/{pid}"), "the replaced process gone",
                   timeout=10)
    finally:
        holder.kill()
        holder.wait()
