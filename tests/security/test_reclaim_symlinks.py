"""Reclaiming an idle namespace never acts through a tenant's symlinks (issue 21).

``casfs reclaim`` (and casfsd's idle rounds) run as root over a namespace's
upper: the last promotion, the check that nothing is left unpublished, then
the upper's removal. The upper's contents are the tenant's: in overlay mode the
kernel wrote them as her job (a process of hers still inside a lazily
unmounted overlay writes on), in fuse mode the view made what her job asked,
symlinks included. A real tenant here owns the upper's files and, at each step
of the reclaim, swaps her key directory for a symlink to a root-only
directory: before the promotion, between the index drop and the removal, and
inside the removal (after its listing, before it descends). Root's files are
never read, published, changed nor removed, and the reclaim still publishes
what was hers. (This held before: a regression test.)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import casfs.node.reclaim as reclaim
from casfs.node.config import MountConfig
from casfs.node.nsregistry import record_served
from casfs.store.objects import digest_bytes
from casfs.store.root import SharedRoot
from tests.users import RealUser, open_tmp, real_users

SECRET = b"root:$6$not-for-tenants:19000:0:99999:7:::\n"


@pytest.fixture
def setting() -> Iterator[tuple[RealUser, Path]]:
    with open_tmp() as d, real_users(1, d) as users:
        yield users[0], d


def _tree(d: Path) -> dict[str, tuple[bytes, int, int]]:
    out = {}
    for p in sorted(d.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(d))] = (p.read_bytes() if p.is_file() else b"", st.st_mode,
                                      st.st_uid)
    return out


@pytest.mark.parametrize("when", ["before_promotion", "before_removal", "inside_removal"])
def test_reclaim_never_touches_root_files_through_a_swapped_directory(
        setting: tuple[RealUser, Path], monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    user, d = setting
    secret_dir = d / "rootonly"
    (secret_dir / "sub").mkdir(parents=True, mode=0o700)
    (secret_dir / "k.so").write_bytes(SECRET)
    (secret_dir / "sub" / "f").write_bytes(SECRET)
    os.chmod(secret_dir, 0o700)
    before = _tree(secret_dir)

    (d / "root").mkdir()
    SharedRoot.open(d / "root", create=True)
    cfg = MountConfig(name="generic", family="generic", namespace="ns", mountpoint=d / "mnt",
                      root=d / "root", state_dir=d / "state", stable_after=0.0)
    upper = cfg.upper
    upper.mkdir(parents=True)
    for p in (d / "state", upper.parent):  # her way in (a process still in her overlay)
        os.chmod(p, 0o711)
    os.chown(upper, user.uid, user.gid)
    r = user.sh(f"cd {upper} && mkdir KEY AAA && printf 'her kernel' > KEY/k.so"
                f" && head -c {3 << 20} /dev/urandom > AAA/big.bin"
                f" && ln -s {secret_dir} evil && ln -s {secret_dir}/k.so AAA/evil.so")
    assert r.returncode == 0, r.stderr
    record_served(cfg)

    swapped: list[str] = []

    def swap() -> None:
        if not swapped:
            swapped.append(when)
            r = user.sh(f"cd {upper} && mv KEY KEY.old && ln -s {secret_dir} KEY")
            assert r.returncode == 0, r.stderr

    real_pause = reclaim.pausepoint

    def pause(step: str) -> None:
        if (step, when) in (("reclaim-locked", "before_promotion"),
                            ("reclaim-dropped", "before_removal")):
            swap()
        real_pause(step)

    monkeypatch.setattr(reclaim, "pausepoint", pause)
    real_scandir = os.scandir

    def scandir(path: Any = ".") -> Any:
        it = real_scandir(path)
        if (when == "inside_removal" and isinstance(path, int) and not swapped
                and os.readlink(f"/proc/self/fd/{path}") == str(upper)
                and any(f.f_code.co_name == "_rmtree_safe_fd" for f in _frames())):
            entries = list(it)  # listed, KEY a directory: then swapped before the descent
            it.close()
            swap()
            return _Listed(entries)
        return it

    monkeypatch.setattr(shutil.os, "scandir", scandir)
    out = reclaim.reclaim_one(cfg)
    monkeypatch.setattr(shutil.os, "scandir", real_scandir)

    assert swapped == [when]
    assert _tree(secret_dir) == before  # nothing read into, changed or removed
    entries = SharedRoot.open(d / "root").generations().entries("ns").entries
    assert digest_bytes(SECRET) not in {e.digest for e in entries.values()}
    assert "AAA/big.bin" in entries
    if when == "before_promotion":  # her file moved aside before it was published
        assert "KEY/k.so" not in entries
    else:
        assert entries["KEY/k.so"].digest == digest_bytes(b"her kernel")
        assert out["reclaimed"], out


def _frames() -> Iterator[Any]:
    import sys

    f = sys._getframe(1)
    while f is not None:
        yield f
        f = f.f_back  # type: ignore[assignment]


class _Listed:
    """A finished scandir's entries, as the context manager rmtree uses."""

    def __init__(self, entries: list[os.DirEntry[str]]) -> None:
        self.entries = entries

    def __enter__(self) -> Iterator[os.DirEntry[str]]:
        return iter(self.entries)

    def __exit__(self, *a: object) -> None:
        pass
