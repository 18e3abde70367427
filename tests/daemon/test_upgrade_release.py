"""An upgrade from the previous release of this repository, installed in its own venv.

casfsd and its mount processes of an earlier commit (``git worktree``, built
and installed into a venv of its own, non-editable; its dependencies are this
venv's) serve a job that reads and writes in a loop, holding files open, a
mapped file, a dlopened ``.so`` and its cwd in the mount (the job of
tests/node/test_handover.py). The operator points casfsd at the new release
and restarts it (here: the old casfsd is killed, as a ``systemctl restart``
with a changed ExecStart may; the new one is started). The new casfsd adopts
the old release's mount process, sees another build and hands the mount over
to a process of this release: 0 errors, no operation over 1 s, every file
published. A dir mode mount of the old release, which does not know the
``leave`` phase, falls back to stop-then-mount in one WARNING line, and what it
held is still there and published; so does an overlay mode mount of the old
release, which does not hand an overlay over.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from waiting import wait_until

from tests.daemon.conftest import Daemon
from tests.node.test_handover import Job, _published

pytestmark = [pytest.mark.fuse, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# The previous release: the last commit of the session before (casfsd adoption and
# the FUSE handover, no dir mode ``leave``).
PREVIOUS = "fe8563a"
OPTS = {"stable_after": 0.2, "publish_interval": 1.0, "refresh_interval": 3600.0}


@pytest.fixture
def previous_release(tmp_path: Path) -> Iterator[Path]:
    """The previous release installed in a venv of its own: its ``bin`` directory."""
    src, venv = tmp_path / "prev-src", tmp_path / "prev-venv"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(src),
                    PREVIOUS], check=True, capture_output=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
        deps = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
        (site / "zz-casfs-deps.pth").write_text(deps + "\n")  # pyfuse3, lmdb, ... of ours
        subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                        "install", "-q", "--no-deps", "--no-build-isolation", str(src)],
                       check=True, capture_output=True, timeout=300)
        r = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import casfs; print(casfs.__file__)"],
                           cwd="/", check=True, capture_output=True, text=True)
        assert r.stdout.startswith(str(site)), r.stdout  # the old release, not this tree
        yield venv / "bin"
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(src)],
                       capture_output=True, check=False)


def _pid(d: Daemon, name: str) -> int:
    return int(next(m for m in d.status() if m["name"] == name)["pid"])


@pytest.mark.expect_log(r"no seamless handover .*unknown phase 'leave'",
                        r"cannot hand over: unknown phase 'leave'",
                        # its overlay mode's FUSE layer was not stackable (no handover)
                        r"no seamless handover .*/mnt/o \(pid \d+\) cannot hand over",
                        r"/mnt/o \(pid \d+\) cannot hand over")
def test_an_upgrade_from_the_previous_release_never_reaches_the_job(
        daemons: Callable[..., Daemon], previous_release: Path, tmp_path: Path) -> None:
    mounts = [{"name": "m", "family": "generic", "namespace": "testns"},
              {"name": "d", "family": "generic", "namespace": "dirns", "mode": "dir"},
              {"name": "o", "family": "generic", "namespace": "ovns", "mode": "overlay"}]
    d = daemons("a", mounts, defaults=OPTS, node={"on_demand": False}, start=False)
    d.casfsd = previous_release / "casfsd"
    d.start()
    mp, dmp, omp = d.mount_paths
    (dmp / "kept.txt").write_bytes(b"written under the old release")
    (omp / "kept.txt").write_bytes(b"written under the old release")
    job = Job(mp, tmp_path)
    try:
        job.wait_loops()
        old_m, old_d, old_o = _pid(d, "m"), _pid(d, "d"), _pid(d, "o")
        assert b"prev-venv" in Path(f"/proc/{old_m}/cmdline").read_bytes()
        assert d.proc is not None
        d.proc.kill()  # the old casfsd goes; its mount processes serve on
        d.proc.wait(30)
        d.casfsd = Path(sys.executable).parent / "casfsd"
        d.start()
        new_m = _pid(d, "m")
        assert new_m != old_m
        log = d.log()
        assert f"adopted the running mount process pid {old_m}" in log
        assert "replacing it: another casfs build" in log
        assert f"took over {mp} from pid {old_m}" in log
        assert b"prev-venv" not in Path(f"/proc/{new_m}/cmdline").read_bytes()
        assert _pid(d, "d") != old_d  # stopped, then mounted again (the fallback)
        assert (dmp / "kept.txt").read_bytes() == b"written under the old release"
        assert _pid(d, "o") != old_o  # the old release has no overlay handover
        assert (omp / "kept.txt").read_bytes() == b"written under the old release"
        report = job.finish()
    finally:
        if job.proc.poll() is None:
            job.stop_file.touch()
            job.proc.wait(60)
    assert report["errors"] == [] and report["slow"] == [], report
    assert report["loops"] > 10, report
    assert d.terminate() == 0
    wait_until(lambda: not os.path.exists(f"/proc/{old_m}"), "the replaced process exited")
    pub = _published(d.root)
    lost = [rel for rel, data in report["written"] if pub.get(rel) != data.encode()]
    assert lost == [], f"{len(lost)} of {len(report['written'])}: {lost[:20]}"
    assert _published(d.root, "dirns")["kept.txt"] == b"written under the old release"
    assert _published(d.root, "ovns")["kept.txt"] == b"written under the old release"
