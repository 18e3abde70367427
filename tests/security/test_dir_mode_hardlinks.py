"""A hard link in a tenant's dir-mode directory to a file she cannot read is never
published to her (found on 2026-12-06, before the fix).

casfsd (root) promoted what it found in her directory, reading it as root. Where
``fs.protected_hardlinks`` is 0 (the kernel's own default; distributions set 1,
not every node image keeps it), a user may hard-link any file of the same file
system, ``/etc/shadow`` included, into her directory: casfsd read it and
published its bytes into her namespace, where she reads them back. Now dir-mode
promotion opens each file with her file-system credentials (the kernel's checks
as hers): such a file is settled unread, counted ``promote_unreadable``. Root
makes the link here (what she does with the sysctl at 0; this machine's is left
alone); her own file beside it is published as before.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs.store.root import SharedRoot
from tests.security.test_dir_mode_symlinks import service
from tests.users import RealUser, open_tmp, real_users


@pytest.fixture
def setting() -> Iterator[tuple[RealUser, Path]]:
    with open_tmp() as d, real_users(1, d) as users:
        yield users[0], d


def test_a_link_to_a_file_she_cannot_read_is_never_published(
        setting: tuple[RealUser, Path]) -> None:
    user, d = setting
    ns = f"{user.tenant}~ns"
    secret = d / "secret"
    secret.write_bytes(b"root:$6$hash:19000:0:99999:7:::\n")
    os.chmod(secret, 0o600)
    svc = service(d, user, "generic", stable_after=0.0)
    try:
        svc.server.restore()  # type: ignore[attr-defined]
        mp = svc.cfg.mountpoint
        r = user.sh(f"mkdir -p {mp}/KEY && echo kernel > {mp}/KEY/k.bin")
        assert r.returncode == 0, r.stderr
        os.link(secret, mp / "KEY" / "stolen.bin")  # hers to make where the sysctl is 0
        assert user.sh(f"cat {mp}/KEY/stolen.bin").returncode != 0  # she cannot read it
        assert svc.promote_once(final=True) == 1
        out = svc.publish_once(final=True)
        assert out["ok"] and out["added"] == 1, out
        assert svc.counters.get("promote_unreadable") == 1
    finally:
        svc.close()
    gens = SharedRoot.open(d / "root").generations()
    assert set(gens.entries(ns).entries) == {"KEY/k.bin"}
