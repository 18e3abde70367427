"""``casfs gc`` run by root writes and deletes nothing through a tenant's symlink (issue 21).

On a multi-user POSIX root each tenant owns her namespace directories. gc, run
as root, merges each namespace's outcome records of a past month into one
(written under ``namespaces/<ns>/outcomes``) and deletes the merged ones. The
tenant swaps her ``outcomes`` directory for a symlink to a root-only directory
after gc read it, before it writes the merged record. Before: root linked the
merged record into the root-only directory (a file of root's, its name and
part of its content hers). Now writes, like deletes, reach their directory
beneath the root with no symlink followed: the merged record is not written
there (ELOOP: gc leaves that namespace's outcome records as they are, with a
warning, and goes on), nothing there is removed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from casfs.store import maintenance, outcomes
from casfs.store.backend import LocalBackend
from casfs.store.root import SharedRoot
from tests.users import RealUser, open_tmp, real_users

SECRET = b"root:$6$not-for-tenants:19000:0:99999:7:::\n"
DAY = 86400.0


@pytest.fixture
def setting() -> Iterator[tuple[RealUser, Path]]:
    with open_tmp() as d, real_users(1, d) as users:
        yield users[0], d


def _tree(d: Path) -> dict[str, tuple[bytes, int, int]]:
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else b"", p.lstat().st_mode,
                                    p.lstat().st_uid) for p in sorted(d.rglob("*"))}


@pytest.mark.expect_log(r"gc: outcome records of ns left as they are: .*(Not a dir|symbolic link)")
def test_gc_merging_outcomes_writes_nothing_through_her_symlink(
        setting: tuple[RealUser, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    user, d = setting
    secret_dir = d / "rootonly"
    secret_dir.mkdir(mode=0o700)
    (secret_dir / "passwd").write_bytes(SECRET)
    before = _tree(secret_dir)
    root = SharedRoot.open(d / "root", create=True)
    now = time.time()
    for i, t in enumerate((now - 40 * DAY, now - 39 * DAY)):  # a past month: merged by gc
        outcomes.record(root.backend, "ns", family="generic", node=f"n{i}", now=t, hits=3,
                        misses=1, saved_ms=10)
    ns_dir = d / "root" / "namespaces" / "ns"
    for p in [ns_dir, *ns_dir.rglob("*")]:  # hers, as on a multi-user root
        os.chown(p, user.uid, user.gid, follow_symlinks=False)
    os.chmod(ns_dir / "outcomes", 0o755)

    swapped: list[bool] = []
    real = LocalBackend.create_exclusive

    def create_exclusive(self: LocalBackend, key: str, data: bytes) -> Any:
        if "/outcomes/" in key and not swapped:  # read, merged: now written
            swapped.append(True)
            r = user.sh(f"cd {ns_dir} && mv outcomes outcomes.old"
                        f" && ln -s {secret_dir} outcomes")
            assert r.returncode == 0, r.stderr
        return real(self, key, data)

    monkeypatch.setattr(LocalBackend, "create_exclusive", create_exclusive)
    maintenance.gc(root, grace=0, now=now)
    assert swapped
    assert _tree(secret_dir) == before  # nothing written, replaced or removed there
    assert len(list((ns_dir / "outcomes.old").iterdir())) == 2  # hers: kept, not merged
