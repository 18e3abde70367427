"""Tenants through casfsd, with real users: the issue's attack, tried and refused.

Two users on one node ask casfsd for the same namespace (same stack) with
``casfs env`` over the jobs socket. Each gets a directory of its own (the
tenant comes from SO_PEERCRED), neither can read or write the other's, a
directory one creates never makes the other's writes fail, and what one
publishes is never served to the other: not on this node, not on another
node of the same shared root. A declared group domain shares as before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from waiting import wait_until

from tests.users import RealUser, open_tmp, real_users, user_python

from .conftest import Daemon

pytestmark = [pytest.mark.fuse, pytest.mark.slow]

FAST = {"stable_after": 0.2, "publish_interval": 0.5, "refresh_interval": 0.5}


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """Overrides pytest's (root-only 0700) so the users can reach the mounts."""
    with open_tmp() as d:
        yield d


class Job:
    """A user's job holding a lease: ``eval "$(casfs env)"``, then sleep."""

    def __init__(self, user: RealUser, d: Daemon, build: str = "stack-1") -> None:
        py, _ = user_python()
        env = user.env(CASFS_SOCKET=str(d.state.parent / "mnt-base" / "casfsd.sock"),
                       CASFS_ROOT=str(d.root), CASFS_STATE_DIR=str(user.home / "state"),
                       CASFS_BUILD_KEY=build)
        script = (f'eval "$({py} -m casfs.cli.main env --family generic)" || exit 1; '
                  'echo "$CASFS_CACHE_DIR"; exec sleep 600')
        self.proc = user.popen(["/bin/sh", "-c", script], env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line:
            self.proc.kill()
            raise AssertionError(f"casfs env failed: {self.proc.stderr.read()}")  # type: ignore[union-attr]
        self.path = Path(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, (r.args, r.stdout, r.stderr)
    return r.stdout


def denied(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode != 0 and "Permission denied" in r.stderr, (r.args, r.stdout, r.stderr)


def test_one_user_cannot_make_anothers_job_load_its_bytes(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    a = daemons("a", [], defaults=FAST, node={"lease_grace": 0.5})
    jobs: list[Job] = []
    with real_users(2, tmp_path) as (u1, u2):
        try:
            j1 = Job(u1, a)
            j2 = Job(u2, a)
            jobs += [j1, j2]
            p1, p2 = j1.path, j2.path
            # Same stack, same namespace name; each tenant its own directory.
            assert p1.name == p2.name and p1 != p2
            assert p1.parent.name == u1.tenant and p2.parent.name == u2.tenant
            st1 = os.stat(p1)
            assert (st1.st_uid, st1.st_mode & 0o7777) == (u1.uid, 0o700)
            # The attack: u1 plants bytes at a key path...
            ok(u1.sh(f"mkdir {p1}/KEYDIR && echo evil > {p1}/KEYDIR/kernel.so"))
            # ...u2's compiler does not find them, cannot reach u1's directory at all,
            # and u1 cannot reach u2's.
            r = u2.sh(f"cat {p2}/KEYDIR/kernel.so")
            assert r.returncode != 0 and "No such file" in r.stderr
            denied(u2.sh(f"cat {p1}/KEYDIR/kernel.so"))
            denied(u1.sh(f"mkdir {p2}/KEYDIR"))
            denied(u1.sh(f"ls {p2.parent}"))
            # u2's writes never fail because of u1's directories.
            ok(u2.sh(f"mkdir {p2}/KEYDIR && echo good > {p2}/KEYDIR/other.cubin"))

            ns = p1.name
            ns1, ns2 = f"{u1.tenant}~{ns}", f"{u2.tenant}~{ns}"
            wait_until(lambda: "KEYDIR/kernel.so" in a.published(ns1), "u1's publication")
            wait_until(lambda: "KEYDIR/other.cubin" in a.published(ns2), "u2's publication")
            assert a.published(ns2) == {"KEYDIR/other.cubin"}
            assert a.published(ns) == set()  # nothing under the plain (root's) name
        finally:
            for j in jobs:
                j.stop()

        # Another node of the same root: u2's job is served u2's bytes only, u1's
        # job gets u1's (publication itself works).
        b = daemons("b", [], root=a.root, defaults=FAST, node={"lease_grace": 0.5})
        jobs = []
        try:
            k2 = Job(u2, b)
            k1 = Job(u1, b)
            jobs += [k1, k2]
            assert ok(u2.sh(f"find {k2.path} -type f")).split() == [
                f"{k2.path}/KEYDIR/other.cubin"]
            assert ok(u1.sh(f"cat {k1.path}/KEYDIR/kernel.so")) == "evil\n"
            r = u2.sh(f"cat {k2.path}/KEYDIR/kernel.so")
            assert r.returncode != 0 and "No such file" in r.stderr
        finally:
            for j in jobs:
                j.stop()


def test_a_declared_group_domain_shares_as_before(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    with real_users(3, tmp_path, in_group=(0, 1)) as (u1, u2, outsider):
        group = u1.name.rsplit("u", 1)[0] + "g"
        extra = f'[[tenants.domains]]\nname = "team"\ngroups = ["{group}"]\n'
        a = daemons("a", [], defaults=FAST, node={"lease_grace": 0.5}, extra=extra)
        jobs: list[Job] = []
        try:
            j1, j2, j3 = Job(u1, a), Job(u2, a), Job(outsider, a)
            jobs += [j1, j2, j3]
            assert j1.path == j2.path and j1.path.parent.name == "team"
            assert j3.path.parent.name == outsider.tenant
            # u1's directory (made with umask 022) never stops u2 from caching in it.
            ok(u1.sh(f"umask 022; mkdir {j1.path}/KEYDIR && echo shared > "
                     f"{j1.path}/KEYDIR/kernel.so"))
            assert ok(u2.sh(f"cat {j2.path}/KEYDIR/kernel.so")) == "shared\n"
            ok(u2.sh(f"echo two > {j2.path}/KEYDIR/other.cubin"))
            denied(outsider.sh(f"cat {j1.path}/KEYDIR/kernel.so"))
            ns = f"team~{j1.path.name}"
            wait_until(lambda: a.published(ns) == {"KEYDIR/kernel.so", "KEYDIR/other.cubin"},
                       "the domain's publication")
        finally:
            for j in jobs:
                j.stop()


def _root_job(d: Daemon, build: str, script: str) -> str:
    env = dict(d.env(), CASFS_BUILD_KEY=build,
               PATH=f"{Path(user_python()[0]).parent}:{os.environ['PATH']}")
    casfs = f"{sys.executable} -m casfs.cli.main"
    r = subprocess.run(["sh", "-c", f'eval "$({casfs} env --family generic)" && {script}'],
                       env=env, capture_output=True, text=True, timeout=120)
    return r.stdout + r.stderr


@pytest.mark.expect_log(
    r"skipping damaged generation \S+: .*no signature by a key trusted for tenant",
    r"skipping statement \S+: no signature by a key trusted for tenant",
)
def test_signed_records_are_served_only_by_nodes_that_trust_the_key(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    """trust = "signature" end to end: casfsd signs with its node key; a node serves
    a generation only if it trusts the key (root-squashed NFS, root pods)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from casfs.store.tenancy import public_key_b64

    pubs = {}
    for name in ("a", "b"):
        k = Ed25519PrivateKey.generate()
        (tmp_path / f"{name}.key").write_bytes(k.private_bytes_raw())
        (tmp_path / f"{name}.key").chmod(0o600)
        pubs[name] = public_key_b64(k)

    def tenants(own: str, trusted: list[str]) -> str:
        keys = ", ".join(f'"{pubs[t]}"' for t in trusted)
        return (f'[tenants]\ntrust = "signature"\nsigning_key = "{tmp_path}/{own}.key"\n'
                f"trusted_keys = [{keys}]\n")

    a = daemons("a", [], defaults=FAST, node={"lease_grace": 0.5}, extra=tenants("a", ["a"]))
    out = _root_job(a, "sig", 'echo signed > "$CASFS_CACHE_DIR/kernel.so"; echo "$CASFS_CACHE_DIR"')
    ns = Path(out.strip().splitlines()[-1]).name
    wait_until(lambda: "kernel.so" in a.published(ns), "a's signed publication")
    rec = json.loads(sorted((a.root / "namespaces" / ns / "generations").iterdir())[-1]
                     .read_bytes())
    assert rec["signature"]["key"] == pubs["a"]
    # b trusts only its own key: a's generation is not served there...
    b = daemons("b", [], root=a.root, defaults=FAST, node={"lease_grace": 0.5},
                extra=tenants("b", ["b"]))
    assert "No such file" in _root_job(b, "sig", 'cat "$CASFS_CACHE_DIR/kernel.so"')
    # ...a node that trusts a's key serves it.
    c = daemons("c", [], root=a.root, defaults=FAST, node={"lease_grace": 0.5},
                extra=tenants("b", ["a", "b"]))
    assert "signed" in _root_job(c, "sig", 'cat "$CASFS_CACHE_DIR/kernel.so"')


def test_cluster_mode_shares_everything_as_before(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    with real_users(2, tmp_path) as (u1, u2):
        a = daemons("a", [], defaults=FAST, node={"lease_grace": 0.5},
                    extra='[tenants]\nmode = "cluster"\n')
        jobs: list[Job] = []
        try:
            j1, j2 = Job(u1, a), Job(u2, a)
            jobs += [j1, j2]
            assert j1.path == j2.path and j1.path.parent.name == "cluster"
            ok(u1.sh(f"umask 022; mkdir {j1.path}/KEYDIR && echo one > {j1.path}/KEYDIR/a.so"))
            assert ok(u2.sh(f"cat {j2.path}/KEYDIR/a.so")) == "one\n"
            ok(u2.sh(f"echo two > {j2.path}/KEYDIR/b.cubin"))  # better than before: writable
            ns = j1.path.name  # the plain name: caches from before tenants stay
            wait_until(lambda: a.published(ns) == {"KEYDIR/a.so", "KEYDIR/b.cubin"},
                       "the cluster's publication")
        finally:
            for j in jobs:
                j.stop()


@pytest.mark.expect_log(r"a job was killed: \d+ files it may have been writing")
def test_a_tenant_never_reaches_her_upper_behind_the_view(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    """Her upper (``<state>/upper/<tenant>~<ns>``) is hers; reached directly, behind the
    view, she could swap a directory of it for a symlink to /etc under a file the view
    then writes as root (found by a review on 2026-12-06: casfsd made its state dir
    0755). The state dir is 0700, and one left 0755 (an older casfsd's) is closed at
    start."""
    (tmp_path / "a" / "state").mkdir(parents=True, mode=0o755)
    os.chmod(tmp_path / "a" / "state", 0o755)
    a = daemons("a", [], defaults=FAST, node={"lease_grace": 0.5})
    with real_users(1, tmp_path) as (u1,):
        job = Job(u1, a)
        try:
            ok(u1.sh(f"mkdir {job.path}/d && echo mine > {job.path}/d/target.txt"))
            upper = a.state / "upper" / f"{u1.tenant}~{job.path.name}"
            assert (upper / "d" / "target.txt").read_text() == "mine\n"  # it is there...
            assert os.stat(upper).st_uid == u1.uid  # ...hers...
            assert os.stat(a.state).st_mode & 0o777 == 0o700
            denied(u1.sh(f"ls {upper}"))  # ...and out of her reach
            denied(u1.sh(f"mv {upper}/d {upper}/d.old"))
            denied(u1.sh(f"ls {a.state}"))
        finally:
            job.stop()
