"""Symbolic links planted inside a shared root, pointing outside it.

The root is written by every node (and, without tenancy, by every user): gc,
which deletes, must never follow a planted link out of the root. I3: the
root's own generations stay complete and verified.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from casfs.store.objects import digest_bytes

pytestmark = pytest.mark.expect_log(
    r"not deleting .*a symbolic link",
    r"is not a directory \(a symbolic link, another mount\?\): not collecting it",
)

OLD = 1_577_836_800  # 2020-01-01: far past any grace period


def _victim(d: Path, names: list[str]) -> list[Path]:
    d.mkdir()
    out = []
    for n in names:
        (d / n).write_bytes(b"precious")
        os.utime(d / n, (OLD, OLD))
        out.append(d / n)
    return out


def test_gc_never_deletes_through_a_symlinked_directory(
        tmp_path: Path, casfs_env: dict[str, Path], cli: Callable[..., Any]) -> None:
    """Was: `casfs gc` listed `<root>/tmp -> /elsewhere` as staging and unlinked every file
    there older than the grace period (and an object-named file under a symlinked
    `objects/ab`): files outside the shared root were deleted."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "kept").write_bytes(b"published bytes")
    cli("init", check=True)
    cli("import", "--namespace", "ns", src, check=True)
    root = casfs_env["root"]
    staged = _victim(tmp_path / "victim-tmp", ["precious.txt", "tmp-leftover"])
    (root / "tmp").rmdir()
    (root / "tmp").symlink_to(tmp_path / "victim-tmp")
    # A name gc takes for an unreferenced object, under a prefix no object uses.
    digest = digest_bytes(b"never stored here")
    used = {p.name for p in (root / "objects").iterdir()}
    prefix = next(f"{i:02x}" for i in range(256) if f"{i:02x}" not in used)
    digest = prefix + digest[2:]
    objs = _victim(tmp_path / "victim-objects", [digest[2:]])
    (root / "objects" / prefix).symlink_to(tmp_path / "victim-objects")

    r = cli("gc", "--grace", "0", "--keep", "1")
    assert r.rc == 0, r.err
    assert "Traceback" not in r.err
    for p in staged + objs:
        assert p.read_bytes() == b"precious", p
    assert cli("cat", "ns", "kept", check=True).out == "published bytes"
