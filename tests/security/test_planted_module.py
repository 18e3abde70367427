"""casfs's own processes never run code from the caller's working directory
(issue 21, break 5).

Before: mount, host and worker processes started as ``python -m casfs...`` in the
caller's cwd, which Python puts first on ``sys.path``: a ``struct.py`` in a shared
directory ran as the victim in every ``casfs run`` started there, and as root in
a casfsd started there by hand. Now they start with ``-P`` from ``/``.

The CLI itself is started as the ``casfs`` console script would be (its own
directory first on sys.path, never the cwd): ``python -P -m casfs.cli.main``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from casfs.store.root import SharedRoot, open_to_users
from tests.users import open_tmp, real_users, user_python

pytestmark = [pytest.mark.slow]

# Marks that it ran (as whom), then stands in for the real module so nothing breaks.
PLANTED = '''
import os, sysconfig, importlib.util
_d = os.path.dirname(os.path.abspath(__file__))
open(os.path.join(_d, "RAN-AS-%d-%d" % (os.getuid(), os.getpid())), "w").close()
_spec = importlib.util.spec_from_file_location(
    "struct", os.path.join(sysconfig.get_path("stdlib"), "struct.py"))
_m = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_m)
globals().update({k: v for k, v in _m.__dict__.items() if not k.startswith("__")})
'''


def plant(d: Path) -> Path:
    d.mkdir()
    os.chmod(d, 0o777)
    (d / "struct.py").write_text(PLANTED)
    os.chmod(d / "struct.py", 0o644)
    return d


def ran(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("RAN-AS-"))


def test_a_module_in_the_cwd_never_runs_in_root_casfs_processes(tmp_path: Path) -> None:
    """Root's ``casfs run`` (fuse: the node's mount process, its fetch and promotion
    workers) started in a directory another user planted a module in."""
    d = plant(tmp_path / "shared-dir")
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"),
               CASFS_STATE_DIR=str(tmp_path / "state"), CASFS_MOUNT_BASE=str(tmp_path / "mnt"))
    r = subprocess.run([sys.executable, "-P", "-m", "casfs.cli.main", "run", "--family",
                        "generic", "--stable-after", "0", "--", "/bin/sh", "-c",
                        'echo k > "$CASFS_CACHE_DIR/kernel.so"'],
                       cwd=d, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "published" in r.stderr, r.stderr  # the mount process served and published
    assert ran(d) == [], r.stderr


def test_a_module_in_the_cwd_never_runs_in_a_users_casfs_processes() -> None:
    with open_tmp() as shared:
        SharedRoot.open(shared / "root", create=True)
        open_to_users(shared / "root")
        with real_users(2, shared) as (victim, attacker):
            d = shared / "project"
            plant(d)  # a directory the attacker owns and the victim works in
            for p in (d, d / "struct.py"):
                os.chown(p, attacker.uid, attacker.gid)
            py, _ = user_python()
            env = victim.env(CASFS_ROOT=str(shared / "root"),
                             CASFS_STATE_DIR=str(victim.home / "state"),
                             CASFS_MOUNT_BASE=str(victim.home / "mnt"),
                             CASFS_SOCKET=str(victim.home / "no-daemon.sock"))
            r = victim.run([py, "-P", "-m", "casfs.cli.main", "run", "--mode", "dir",
                            "--family", "generic", "--stable-after", "0", "--", "/bin/sh",
                            "-c", 'echo k > "$CASFS_CACHE_DIR/kernel.so"'],
                           env=env, cwd=str(d))
            assert r.returncode == 0, r.stderr
            assert "published" in r.stderr, r.stderr
            assert ran(d) == [], r.stderr
