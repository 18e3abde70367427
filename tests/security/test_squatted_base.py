"""Mount bases that belong to their user (issue 21, break 1), through ``casfs run``
with real users on one node.

Before: a non-root ``casfs run`` mounted under ``/tmp/casfs-<user>`` whoever had
made it. Another user made it first (0777) and the victim's cache directory lay
in a directory the attacker could rename and refill: the victim's job loaded the
attacker's kernel and wrote its own where the attacker read them. Now the base is
``/tmp/casfs-<uid>``, made 0700 by its user, and one that anyone else made is
refused with one line naming it: the job runs, with a private cache."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs.store.root import SharedRoot, open_to_users
from tests.users import RealUser, open_tmp, real_users

pytestmark = [pytest.mark.slow]

JOB = 'printf %s "$CASFS_CACHE_DIR" > "$HOME/cache-dir"; mkdir -p "$CASFS_CACHE_DIR/KEY" &&' \
      ' echo mine > "$CASFS_CACHE_DIR/KEY/kernel.so"'


@pytest.fixture
def shared() -> Iterator[Path]:
    with open_tmp() as d:
        SharedRoot.open(d / "root", create=True)
        open_to_users(d / "root")
        yield d


def run(user: RealUser, shared: Path, **env: str) -> tuple[int, str]:
    e = user.env(CASFS_ROOT=str(shared / "root"), CASFS_STATE_DIR=str(user.home / "state"),
                 CASFS_SOCKET=str(user.home / "no-daemon.sock"), **env)
    r = user.casfs("run", "--mode", "dir", "--family", "generic", "--publish-interval", "0.5",
                   "--stable-after", "0", "--", "/bin/sh", "-c", JOB, env=e)
    return r.returncode, r.stdout + r.stderr


def files_under(d: Path) -> list[str]:
    return [os.path.join(p, n) for p, _, names in os.walk(d) for n in names]


def test_a_squatted_default_base_is_refused_and_the_job_still_runs(shared: Path) -> None:
    with real_users(2, shared) as (victim, attacker):
        # The attacker makes the victim's base first, by uid and (as before) by name.
        squats = [Path(f"/tmp/casfs-{victim.uid}"), Path(f"/tmp/casfs-{victim.name}")]
        try:
            for d in squats:
                attacker.sh(f"mkdir -m 777 {d}", check=True)
            rc, out = run(victim, shared)
            assert rc == 0, out
            used = (victim.home / "cache-dir").read_text()
            assert not any(used.startswith(str(d)) for d in squats), (used, out)
            assert files_under(squats[0]) == [] and files_under(squats[1]) == [], out
            refusals = [ln for ln in out.splitlines() if str(squats[0]) in ln]
            assert len(refusals) == 1 and "another user" in refusals[0], out
        finally:
            for d in squats:
                shutil.rmtree(d, ignore_errors=True)


def test_the_default_base_is_made_private_per_uid(shared: Path) -> None:
    with real_users(1, shared) as (user,):
        base = Path(f"/tmp/casfs-{user.uid}")
        try:
            rc, out = run(user, shared)
            assert rc == 0, out
            assert (victim_dir := (user.home / "cache-dir").read_text()).startswith(str(base))
            st = base.stat()
            assert (st.st_uid, st.st_mode & 0o7777) == (user.uid, 0o700), (victim_dir, out)
            # Its next job finds its own base and is served (not refused, not private).
            rc, out = run(user, shared)
            assert rc == 0 and "refusing" not in out, out
        finally:
            shutil.rmtree(base, ignore_errors=True)


def test_a_mount_base_in_a_world_writable_directory_is_refused(shared: Path) -> None:
    open_dir = shared / "scratch"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)  # writable by all, not sticky: anyone renames anything
    with real_users(1, shared) as (user,):
        rc, out = run(user, shared, CASFS_MOUNT_BASE=str(open_dir / "base"))
        assert rc == 0, out
        assert not (user.home / "cache-dir").read_text().startswith(str(open_dir)), out
        refusals = [ln for ln in out.splitlines() if "refusing" in ln]
        assert len(refusals) == 1 and str(open_dir) in refusals[0], out
        assert "writable by others" in refusals[0], out
