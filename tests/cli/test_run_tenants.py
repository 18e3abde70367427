"""Tenants through ``casfs run`` (no daemon), with real users on one shared root.

Each user's ``casfs run`` serves its own caches (here plain directories: users
cannot mount FUSE on every test machine) and publishes into its own
``u<uid>~<namespace>``: what u1 plants is never what u2's job loads.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs.store.root import SharedRoot, open_to_users
from tests.users import RealUser, open_tmp, real_users

pytestmark = [pytest.mark.slow]


@pytest.fixture
def shared() -> Iterator[Path]:
    with open_tmp() as d:
        SharedRoot.open(d / "root", create=True)
        open_to_users(d / "root")
        yield d


def run(user: RealUser, root: Path, script: str) -> tuple[int, str]:
    env = user.env(CASFS_ROOT=str(root), CASFS_STATE_DIR=str(user.home / "state"),
                   CASFS_MOUNT_BASE=str(user.home / "mnt"), CASFS_BUILD_KEY="stack-1",
                   CASFS_SOCKET=str(user.home / "no-daemon.sock"))
    # dir mode: unprivileged users cannot mount FUSE on every machine (/dev/fuse 0600).
    r = user.casfs("run", "--mode", "dir", "--family", "generic", "--publish-interval", "0.5",
                   "--stable-after", "0", "--", "/bin/sh", "-c", script, env=env)
    return r.returncode, r.stdout + r.stderr


def test_casfs_run_serves_each_user_its_own_tenant(shared: Path) -> None:
    root = shared / "root"
    with real_users(2, shared) as (u1, u2):
        rc, out = run(u1, root, 'mkdir -p "$CASFS_CACHE_DIR/KEYDIR" &&'
                                ' echo evil > "$CASFS_CACHE_DIR/KEYDIR/kernel.so"')
        assert rc == 0, out
        names = {p.name for p in (root / "namespaces").iterdir()}
        assert names, out
        (ns1,) = names
        assert ns1.startswith(f"{u1.tenant}~generic-")
        # The record names the ingredients the tenant's namespace came from (explain).
        rec = SharedRoot.open(root).generations().latest(ns1)
        assert rec is not None and (rec.fingerprint or {}).get("build_key") == "stack-1"
        # u2's job, same stack: misses, and can cache the same key path itself.
        rc, out = run(u2, root, 'test ! -e "$CASFS_CACHE_DIR/KEYDIR/kernel.so" &&'
                                ' mkdir -p "$CASFS_CACHE_DIR/KEYDIR" &&'
                                ' echo good > "$CASFS_CACHE_DIR/KEYDIR/kernel.so"')
        assert rc == 0, out
        ns2 = ns1.replace(u1.tenant, u2.tenant, 1)
        assert {p.name for p in (root / "namespaces").iterdir()} == {ns1, ns2}
        # Each user's next job is served its own bytes from the root.
        rc, out = run(u1, root, 'cat "$CASFS_CACHE_DIR/KEYDIR/kernel.so"')
        assert rc == 0 and "evil" in out, out
        rc, out = run(u2, root, 'cat "$CASFS_CACHE_DIR/KEYDIR/kernel.so"')
        assert rc == 0 and "good" in out and "evil" not in out, out


# the mount process says why FUSE is unavailable (exit 8) before casfs run falls back
@pytest.mark.expect_log(r"cannot mount .*: fuse_session_mount failed")
def test_a_user_who_cannot_open_dev_fuse_gets_dir_mode(shared: Path) -> None:
    """Issue 8 item 5: ``casfs run`` (default fuse mode) by a user the kernel refuses
    /dev/fuse falls back to dir mode, serves and publishes, not to a private temp dir.
    A root-only /dev/fuse (0600, as on many nodes) is bound over the real one in a
    private mount namespace, so the test means the same on every machine."""
    import shutil
    import subprocess

    if not shutil.which("unshare"):
        pytest.skip("needs unshare")
    root = shared / "root"
    dev = shared / "fuse-root-only"
    subprocess.run(["mknod", "-m", "600", str(dev), "c", "10", "229"], check=True)
    with real_users(1, shared) as (u,):
        env = u.env(CASFS_ROOT=str(root), CASFS_STATE_DIR=str(u.home / "state"),
                    CASFS_MOUNT_BASE=str(u.home / "mnt"), CASFS_BUILD_KEY="stack-1",
                    CASFS_SOCKET=str(u.home / "no-daemon.sock"))
        from tests.users import user_python

        py, _ = user_python()
        job = 'echo "$CASFS_CACHE_DIR"; echo hi > "$CASFS_CACHE_DIR/f"'
        inner = (f"mount --bind {dev} /dev/fuse && exec setpriv --reuid={u.uid}"
                 f" --regid={u.gid} --init-groups -- {py} -m casfs.cli.main run"
                 " --family generic -n nf --stable-after 0 -- /bin/sh -c"
                 f" '{job}'")
        r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", inner],
                           env=env, cwd=str(u.home), capture_output=True, text=True,
                           timeout=180, check=False)
        assert r.returncode == 0, r.stderr
        assert "(dir mode)" in r.stderr and "private and temporary" not in r.stderr, r.stderr
        served = Path(r.stdout.strip())
        assert served.name == "nf" and u.home / "mnt" in served.parents, r.stdout
        assert "1 published" in r.stderr, r.stderr
        gens = SharedRoot.open(root).generations()
        assert gens.latest(f"{u.tenant}~nf") is not None
