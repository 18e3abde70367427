"""Views to compare with a plain directory: a fuse mount and a dir-mode directory.

Everything lives under one world-traversable temp dir (the second uid must
reach it; pytest's tmp dirs are 0700). One fuse mount serves every family
(each in its own subdirectory); it is unmounted at the end even on failure.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fusehelpers import MountedView, require_fuse

from casfs.promote.tracker import WriteTracker
from casfs.util.counters import Counters
from casfs.view import dirmode
from casfs.view.testserve import DirFetcher, tree_from_dir

from .scenarios import FAMILIES, INITIAL


@dataclass(frozen=True)
class User:
    uid: int
    gid: int


def write_initial(base: Path) -> None:
    for rel, data in INITIAL.items():
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        p.chmod(0o644)


def like_view_dirs(root: Path) -> None:
    """Directories as the fuse view shows lower ones: 0777, the root 1777 (like /tmp)."""
    for d, _, _ in os.walk(root):
        os.chmod(d, 0o777)
    os.chmod(root, 0o1777)


@pytest.fixture(scope="session")
def second_user() -> Iterator[User]:
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd")
    name = f"casfsc{os.getpid() % 100000}"
    subprocess.run(["useradd", "-M", "-U", "-s", "/usr/sbin/nologin", name], check=True,
                   capture_output=True, timeout=30)
    try:
        pw = pwd.getpwnam(name)
        yield User(pw.pw_uid, pw.pw_gid)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True, timeout=30)


@pytest.fixture(scope="session")
def world_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="casfs-conf-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def fuse_view(world_dir: Path) -> Iterator[Path]:
    require_fuse()
    lower = world_dir / "fuse-lower"
    for fam in FAMILIES:
        write_initial(lower / fam)
    view = MountedView(lower, world_dir / "fuse-upper", world_dir / "fuse-mnt", allow_other=True)
    view.start()
    try:
        yield view.mountpoint
    finally:
        view.stop()


@pytest.fixture(scope="session")
def dir_view(world_dir: Path) -> Iterator[Path]:
    lower = world_dir / "dir-lower"
    for fam in FAMILIES:
        write_initial(lower / fam)
    tree, sources = tree_from_dir(lower)
    root = world_dir / "dir-view"
    root.mkdir()
    dirmode.restore(root, _walk(tree), DirFetcher(sources), Counters())
    like_view_dirs(root)  # restore makes dirs with the umask; the fuse view shows 0777
    observer = dirmode.watch(root, WriteTracker())
    try:
        yield root
    finally:
        observer.stop()
        observer.join(timeout=10)


def _walk(tree: object) -> list:  # type: ignore[type-arg]
    from casfs.index.tree import DIR, DictLowerTree

    assert isinstance(tree, DictLowerTree)
    out = []
    stack = [""]
    while stack:
        d = stack.pop()
        for name, node in tree.children(d):
            path = f"{d}/{name}" if d else name
            if node is DIR:
                stack.append(path)
            else:
                out.append(node)
    return out


@pytest.fixture(scope="session")
def overlay_view(world_dir: Path) -> Iterator[Path]:
    """A whole node in ``overlay`` mode (kernel overlayfs) over a seeded shared root."""
    require_fuse()
    from casfs.view import overlay

    if (why := overlay.unavailable_reason()) is not None:
        pytest.skip(why)
    from node.conftest import Node  # tests/node: the spawned-node helpers
    from node.test_two_nodes import seed

    files = {f"{fam}/{rel}": data for fam in FAMILIES for rel, data in INITIAL.items()}
    seed(world_dir / "ov-root", files, tmp=world_dir / "ov-seed")
    node = Node("c", world_dir / "ov-root", world_dir / "ov-state", world_dir / "ov-mnt")
    w = node.mount(mode="overlay", allow_other=True)
    try:
        # Lower files keep their published mode; directories as the fuse view shows them.
        yield w.cfg.mountpoint
    finally:
        node.stop_all()


@pytest.fixture(scope="session")
def plain_root(world_dir: Path) -> Path:
    root = world_dir / "plain"
    for mode in ("fuse", "dir", "overlay"):
        for fam in FAMILIES:
            write_initial(root / mode / fam)
        like_view_dirs(root / mode)
    os.chmod(root, 0o755)
    return root
