"""A tenant's FUSE mount inside a multi-user POSIX shared root never holds up root
(found by a review on 2026-12-06; each call below waited for good before).

On a ``--multi-user`` root (``namespaces``, ``tmp`` and the object fan-out
directories are 1777) a user owns the directories she makes there: a namespace
directory (any name, another tenant's predictable one included), a fan-out
directory she made first, a directory in ``tmp``. Where /etc/fuse.conf has
``user_allow_other`` she may mount a FUSE file system of her own on each, and
root's stat, open or listing inside it goes to her server, which need never
answer: casfsd's attach of the victim's namespace, ``casfs gc``, ``du``,
``verify`` and ``report`` hung. Now every key is reached beneath the root with
``RESOLVE_NO_XDEV`` (casfs.store.backend, casfs.store.tenancy): what lies under
her mount is a miss or a refusal, at once. Her server is mounted as her
(``user_id`` hers) and answers nothing from the start.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs.errors import UntrustedError
from casfs.store.backend import LocalBackend, NotRegularFileError
from casfs.store.root import SharedRoot, open_to_users
from casfs.store.tenancy import TenantTrust
from casfs.tenants import TenantPolicy, store_namespace
from tests.security.test_tenant_fuse_mount import REPO, bounded, hanging_on
from tests.users import RealUser, open_tmp, real_users

DIGEST = "ab" + "c" * 62
pytestmark = pytest.mark.expect_log(
    r"not listing .* another mount", r"not deleting .* another mount",
    r"not serving namespace .* another mount")


@pytest.fixture
def setting() -> Iterator[tuple[RealUser, RealUser, Path]]:
    with open_tmp() as d, real_users(2, d) as (her, victim):
        yield her, victim, d


@contextlib.contextmanager
def planted(root: Path, her: RealUser, victim: RealUser) -> Iterator[str]:
    """Her hanging mounts: on the victim's (predictable) namespace directory she made
    first, on the object fan-out directory ``objects/ab`` she made first, and on a
    directory of hers in ``tmp`` and inside a namespace directory moved aside there.
    Yields the victim's namespace."""
    ns = store_namespace(victim.tenant, "triton-v")
    fan = root / "objects" / "ab"
    fan.rmdir()  # (open_to_users made it root's: as if she had been first)
    aside = root / "tmp" / "untrusted-x"
    aside.mkdir()
    (aside / "generations").mkdir()
    (aside / "generations" / "000000000001").write_bytes(b"{}")
    with contextlib.ExitStack() as stack:
        for mp in (root / "namespaces" / ns, fan, root / "tmp" / "hers", aside / "hers"):
            stack.enter_context(hanging_on(mp, her))
        yield ns


def test_nothing_under_her_mounts_in_the_root_is_asked(
        setting: tuple[RealUser, RealUser, Path]) -> None:
    her, victim, d = setting
    path = d / "root"
    SharedRoot.open(path, create=True)
    open_to_users(path)
    with planted(path, her, victim) as ns:
        b = LocalBackend(path)
        gen = f"namespaces/{ns}/generations"
        assert bounded(lambda: list(b.list(gen))) == []
        assert bounded(lambda: list(b.list("objects/ab"))) == []
        assert bounded(lambda: b.info(f"{gen}/000000000001")) is None
        assert bounded(lambda: b.info(f"namespaces/{ns}")) is None
        with pytest.raises(NotRegularFileError):
            bounded(lambda: b.open(f"objects/ab/{DIGEST[2:]}"))
        with pytest.raises(NotRegularFileError):
            bounded(lambda: b.read_range(f"{gen}/000000000001", 0, 10))
        with pytest.raises(OSError):  # a write there is refused, not sent to her
            bounded(lambda: b.create_exclusive(f"objects/ab/{DIGEST[2:]}", b"x"))
        bounded(lambda: b.touch(f"{gen}/000000000001"))
        bounded(lambda: b.delete(f"objects/ab/{DIGEST[2:]}"))
        staged = bounded(lambda: dict(b.staging_entries()))
        assert "untrusted-x" in staged and "hers" not in staged
        # gc removing the namespace directory moved aside: all but her mount point
        bounded(lambda: b.delete("tmp/untrusted-x"))
        assert sorted(os.listdir(path / "tmp" / "untrusted-x")) == ["hers"]
        # the victim's namespace, as casfsd's attach reads it: not served, at once
        trust = TenantTrust(TenantPolicy(), path)
        with pytest.raises(UntrustedError, match="another mount"):
            bounded(lambda: trust.check_namespace(ns))
        node = SharedRoot.open(path, tenants=TenantPolicy())
        with pytest.raises(UntrustedError):
            bounded(lambda: node.generations().latest(ns))


@pytest.mark.parametrize("command", [["gc", "--dry-run"], ["du"], ["verify"], ["report"],
                                     ["namespaces"]])
def test_an_operators_commands_finish(setting: tuple[RealUser, RealUser, Path],
                                      command: list[str]) -> None:
    """Run as root over the whole root, each used to wait for good on her server."""
    her, victim, d = setting
    path = d / "root"
    root = SharedRoot.open(path, create=True)
    open_to_users(path)
    obj = root.objects.put_bytes(b"a kernel of root's\n")
    from casfs.store.entry import Entry

    root.generations().publish("triton-r", [Entry("k/a.so", obj.digest, obj.size, 0o644, 1)],
                               node="n")
    hung = False
    with planted(path, her, victim):
        p = subprocess.Popen([sys.executable, "-m", "casfs.cli.main", "--root", str(path),
                              *command], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            hung = True  # (killed below, once her servers' connections are aborted: a
            p.kill()  # process waiting on a FUSE request already read cannot die before)
    if hung:
        p.communicate()
        pytest.fail(f"casfs {' '.join(command)} waited on her FUSE server")
    assert "Traceback" not in err, err[-2000:]
    if command[0] != "verify":
        assert p.returncode == 0, err[-2000:]
