"""Promotion never reads through a tenant's symlinks (issue 21, break 4), with a real user.

Before: a promotion round took its list of paths, then lstat-ed and opened
``upper/rel`` with O_NOFOLLOW on the last component only. The tenant swapped a
directory of the upper for a symlink to a root-only directory during the round
(a large file earlier in the list widens the window): root read the file there
and published it into her namespace, where she read it back (``/etc/shadow``,
the node's signing key). Now every path is resolved beneath an fd of the upper
with no symlink followed (casfs.util.beneath): the swapped path is forgotten
(nothing of it is promoted), the root-only file is never read.

The promoter runs in this process as root, over an upper the tenant owns (dir
and overlay modes hand it to the job; in fuse mode jobs shape it through the
view); the swap is the user's own command, made at a chosen step of the round.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from casfs.index.node_index import NodeIndex
from casfs.promote.promoter import Promoter
from casfs.store.objects import digest_bytes
from casfs.store.root import SharedRoot
from tests.promote.rig import promotion_rig
from tests.users import RealUser, open_tmp, real_users

SECRET = b"root:$6$not-for-tenants:19000:0:99999:7:::\n"
BIG = 3 << 20  # over a part (promoter.PART_BYTES): its part is stored before KEY/ is checked


@pytest.fixture
def setting() -> Iterator[tuple[RealUser, Path]]:
    with open_tmp() as d, real_users(1, d) as users:
        yield users[0], d


def swap(user: RealUser, upper: Path, target: Path) -> None:
    r = user.sh(f"cd {upper} && mv KEY KEY.old && ln -s {target} KEY")
    assert r.returncode == 0, r.stderr


# The open refused (the swap between lstat and open) is a failed step, retried: the
# next round's lstat is refused in turn and forgets the path.
@pytest.mark.expect_log(r"promotion step failed \(will retry\): \[Errno 40\].*KEY/k\.so")
@pytest.mark.parametrize("when", ["before_check", "while_reading_a_big_file", "before_read"])
def test_a_directory_swapped_for_a_symlink_mid_round_publishes_nothing_of_root(
        setting: tuple[RealUser, Path], monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """Each published the root-only file before: ``before_check`` (between the listing
    and the lstat) and ``while_reading_a_big_file`` (the window a large file earlier
    in the list makes) in that round; ``before_read`` (between the lstat and the open)
    was deferred by the inode check, and the next round, its lstat through the link
    too, published it."""
    user, d = setting
    upper = d / "upper"
    upper.mkdir(mode=0o700)
    os.chown(upper, user.uid, user.gid)  # the tenant's, as casfs hands it over
    r = user.sh(f"mkdir {upper}/AAA {upper}/KEY"
                f" && head -c {BIG} /dev/urandom > {upper}/AAA/big.bin"
                f" && printf 'her kernel' > {upper}/KEY/k.so")
    assert r.returncode == 0, r.stderr
    secret_dir = d / "rootonly"
    secret_dir.mkdir(mode=0o700)
    (secret_dir / "k.so").write_bytes(SECRET)
    os.chmod(secret_dir / "k.so", 0o600)

    real_check, real_read = Promoter._check, Promoter._read
    swapped: list[str] = []

    def once() -> None:
        if not swapped:
            swapped.append(when)
            swap(user, upper, secret_dir)

    def check(self: Promoter, rel: str, res: Any) -> Any:
        if rel == "KEY/k.so" and when == "before_check":
            once()
        return real_check(self, rel, res)

    def read(self: Promoter, c: Any, res: Any) -> Any:
        if (c.rel, when) in (("AAA/big.bin", "while_reading_a_big_file"),
                             ("KEY/k.so", "before_read")):
            once()
        return real_read(self, c, res)

    monkeypatch.setattr(Promoter, "_check", check)
    monkeypatch.setattr(Promoter, "_read", read)
    root = SharedRoot.open(d / "root", create=True)
    index = NodeIndex.open(d / "state")
    try:
        promoter, publisher, _, tracker = promotion_rig(root, upper, index)
        for rel in ("AAA/big.bin", "KEY/k.so"):  # listed in this order: the big one first
            tracker.modified(rel)
        promoter.run_once(final=True)
        assert swapped == [when]
        promoter.run_once(final=True)  # a second round, the link still in place
        assert publisher.publish().ok
        promoted = index.get_promoted("ns", "KEY/k.so")
    finally:
        index.close()
    assert promoted is None or promoted.entry.digest != digest_bytes(SECRET)
    entries = SharedRoot.open(d / "root").generations().entries("ns").entries
    assert "AAA/big.bin" in entries
    assert digest_bytes(SECRET) not in {e.digest for e in entries.values()}
    assert "KEY/k.so" not in entries
