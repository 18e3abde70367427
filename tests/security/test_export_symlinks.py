"""``casfs export`` run by root into a tenant's directory writes nothing outside it (issue 21).

An operator exports a namespace into a directory a tenant owns (her home, a
scratch dir of hers): the destination is checked empty, casfs makes every
directory of the tree, then writes each file to a temporary name and renames
it into place. Before: every write was by path string, so the tenant, while a
large file earlier in the tree was written, swapped a directory casfs had made
for a symlink to a root-only directory (or the destination itself, for a
symlink): root created the next file there and renamed it over root's file of
that name, with the bytes of her namespace. Now the destination is opened once
(a symlink refused) and everything is made beneath its fd with no symlink
followed (casfs.util.beneath): a swapped path fails (reported), root's
directory is untouched.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from casfs.errors import UsageError
from casfs.store.export import export_tree
from casfs.store.generations import seq_name
from casfs.store.root import SharedRoot
from tests.users import RealUser, open_tmp, real_users

SECRET = b"root:$6$not-for-tenants:19000:0:99999:7:::\n"
HERS = b"tenant:$6$chosen-by-the-tenant:19000:0:99999:7:::\n"
MTIME = 1_700_000_000_000_000_000
BIG = 3 << 20


@pytest.fixture
def setting() -> Iterator[tuple[RealUser, Path]]:
    with open_tmp() as d, real_users(1, d) as users:
        yield users[0], d


def _publish(root: SharedRoot, files: dict[str, bytes]) -> None:
    rows = []
    for rel, data in sorted(files.items()):
        rows.append([rel, root.objects.put_bytes(data).digest, len(data), 0o644, MTIME])
    m = root.objects.put_bytes(json.dumps({"casfs_manifest": 1, "kind": "full",
                                           "entries": rows}).encode())
    doc = {"casfs_generation": 1, "namespace": "ns", "seq": 1, "parent": None,
           "base": {"digest": m.digest, "size": m.size, "entries": len(rows)}, "deltas": [],
           "entries": len(rows), "bytes": 0, "created": 1.0, "node": "n",
           "casfs_version": "0", "fingerprint": None}
    assert root.backend.create_exclusive(f"namespaces/ns/generations/{seq_name(1)}",
                                         json.dumps(doc).encode())


def _tree(d: Path) -> dict[str, tuple[bytes, int, int]]:
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else b"", p.lstat().st_mode,
                                    p.lstat().st_uid) for p in sorted(d.rglob("*"))}


@pytest.mark.parametrize("what", ["a_directory_it_made", "the_destination"])
def test_export_into_a_tenant_directory_writes_nothing_through_her_symlink(
        setting: tuple[RealUser, Path], monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    """Before: ``passwd`` (``a_directory_it_made``: KEY swapped) or ``zz`` (the
    destination swapped) landed in the root-only directory, ``passwd`` replacing root's."""
    user, d = setting
    secret_dir = d / "rootonly"
    secret_dir.mkdir(mode=0o700)
    (secret_dir / "passwd").write_bytes(SECRET)
    before = _tree(secret_dir)
    root = SharedRoot.open(d / "root", create=True)
    files = {"AAA/big.bin": os.urandom(BIG), "KEY/passwd": HERS, "zz": HERS}
    _publish(root, files)
    dest = user.home / "out"
    r = user.sh(f"mkdir {dest}")
    assert r.returncode == 0, r.stderr

    swapped: list[str] = []
    real_get_into = type(root.objects).get_into

    def get_into(self: Any, digest: str, size: int, f: Any) -> Any:
        if size == BIG and not swapped:  # the window a large file makes
            swapped.append(what)
            if what == "a_directory_it_made":
                cmd = f"cd {dest} && mv KEY KEY.old && ln -s {secret_dir} KEY"
            else:
                cmd = f"mv {dest} {dest}.old && ln -s {secret_dir} {dest}"
            r = user.sh(cmd)
            assert r.returncode == 0, r.stderr
        return real_get_into(self, digest, size, f)

    monkeypatch.setattr(type(root.objects), "get_into", get_into)
    rep = export_tree(root, root.generations().resolve("ns", None), dest, threads=1)
    assert swapped == [what]
    assert _tree(secret_dir) == before  # nothing created, replaced or changed there
    out = dest.parent / "out.old" if what == "the_destination" else dest
    assert (out / "AAA/big.bin").read_bytes() == files["AAA/big.bin"]
    if what == "a_directory_it_made":
        assert rep.failed and "KEY/passwd" in rep.failed[0]  # reported, never written
        assert (out / "zz").read_bytes() == HERS
    else:  # all of it in the directory it opened, wherever she moved it
        assert not rep.failed and (out / "KEY/passwd").read_bytes() == HERS


def test_export_into_a_symlinked_destination_is_refused(setting: tuple[RealUser, Path]) -> None:
    """A destination that is her symlink to an empty root-only directory: refused
    (before: the export wrote there)."""
    user, d = setting
    secret_dir = d / "rootonly"
    secret_dir.mkdir(mode=0o700)
    root = SharedRoot.open(d / "root", create=True)
    _publish(root, {"zz": HERS})
    dest = user.home / "out"
    r = user.sh(f"ln -s {secret_dir} {dest}")
    assert r.returncode == 0, r.stderr
    with pytest.raises(UsageError, match=r"export destination .*symbolic link is refused"):
        export_tree(root, root.generations().resolve("ns", None), dest, threads=1)
    assert list(secret_dir.iterdir()) == []
