"""Root's ``casfs umount PATH`` never follows a tenant's symlink onto casfsd's own mount.

A review (2026-12-06) had a tenant swap her ``/tmp/casfs-<uid>`` for a symlink to
casfsd's mount base, then ask the operator to clear "her stuck mount": root's
``casfs umount /tmp/casfs-<uid>/ns`` found no casfs process registered at that text,
took the path for a stray mount and lazily detached casfsd's shared mount, which
served nothing new while she held her namespace's cwd (every other tenant's cache
path ENOENT). The path is now walked through fds, following only root's symlinks in
root's directories; anything else is refused in one line.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.daemon import conftest as daemon_conftest
from tests.daemon.conftest import VENV_BIN, Daemon
from tests.daemon.test_tenants import FAST, Job, ok
from tests.users import open_tmp, real_users

pytestmark = [pytest.mark.fuse]

daemons = daemon_conftest.daemons  # the fixture: a real casfsd per test


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    with open_tmp() as d:  # (her home's symlink points at a path others can reach)
        yield d


def _mount_of(path: Path) -> Path:
    while not os.path.ismount(path):
        path = path.parent
    return path


def _mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


# The victim's job ends by a kill (Job.stop): what it wrote last is held back.
@pytest.mark.expect_log(r"a job was killed: \d+ files it may have been writing")
def test_root_casfs_umount_never_follows_a_tenants_symlink_onto_casfsds_mount(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    d = daemons("a", [], defaults=FAST, node={"lease_grace": 0.5})
    with real_users(2, tmp_path) as (victim, attacker):
        v = Job(victim, d)
        try:
            base = _mount_of(v.path)  # casfsd's on-demand mount
            assert _mounted(base)
            link = attacker.home / "casfs"
            ok(attacker.sh(f"ln -s {base.parent} {link}"))
            r = d.cli("umount", str(link / base.name), check=False)
            assert r.returncode != 0
            line = r.stderr.strip()
            assert "\n" not in line and "symlink" in line and str(link) in line, line
            assert _mounted(base)  # (before: detached)
            ok(victim.sh(f"echo after > {v.path}/after && cat {v.path}/after"))
            # a symlink of root's in root's own directory is followed, as /var/run's is:
            # the path then names the host's mount, which `casfs umount` leaves alone
            # (its namespaces go when their jobs do)
            ours = tmp_path / "root-link"
            ours.symlink_to(base.parent)
            os.chmod(tmp_path, 0o755)
            r = d.cli("umount", str(ours / base.name / victim.tenant), check=False)
            assert r.returncode != 0 and "is a namespace of this node's mount process" \
                in r.stderr, r.stderr
            assert _mounted(base)
        finally:
            v.stop()


def test_casfs_umount_detaches_a_stray_mount_through_roots_symlink(tmp_path: Path) -> None:
    """A mount no casfs process serves, named through a root symlink (``/var/run``'s
    kind): detached, exactly that one."""
    target = tmp_path / "real" / "stray"
    target.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "stray", str(target)], check=True)
    try:
        (tmp_path / "via").symlink_to(tmp_path / "real")
        env = dict(os.environ, CASFS_STATE_DIR=str(tmp_path / "state"))
        r = subprocess.run([str(VENV_BIN / "casfs"), "umount", str(tmp_path / "via" / "stray")],
                           capture_output=True, text=True, env=env, timeout=60, check=False)
        assert r.returncode == 0, r.stderr
        assert f"unmounted {target} (no casfs process was serving it)" in r.stdout
        assert not _mounted(target)
    finally:
        if _mounted(target):
            subprocess.run(["umount", "-l", str(target)], check=False)
