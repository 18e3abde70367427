"""casfs.util.beneath: paths resolved beneath a directory fd, no symlink followed.

Every operation is tried with a symlink at every component of its path, with
``..``, absolute paths and other non-plain names, both through openat2 and
through the component-by-component fallback (openat2 switched off, as on a
kernel before 5.6).
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from casfs.util import beneath


@pytest.fixture(params=["openat2", "fallback"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "fallback":
        monkeypatch.setattr(beneath, "use_openat2", False)
    else:
        fd = os.open("/", beneath.DIR_FLAGS)
        try:
            if beneath._openat2(fd, "tmp", beneath.DIR_FLAGS, 0) is None:
                pytest.skip("no openat2 on this kernel")
        finally:
            os.close(fd)
    return str(request.param)


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[Path, int, Path]]:
    """(top, an fd of it, a directory outside it with a secret file)."""
    top = tmp_path / "top"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f").write_bytes(b"mine")
    outside = tmp_path / "outside"
    (outside / "a" / "b").mkdir(parents=True)
    (outside / "a" / "b" / "f").write_bytes(b"secret")
    (outside / "f").write_bytes(b"secret")
    (outside / "b").mkdir()
    (outside / "b" / "f").write_bytes(b"secret")
    fd = beneath.open_base(top)
    try:
        yield top, fd, outside
    finally:
        os.close(fd)


BAD_NAMES = ["", "/etc/passwd", "../outside/f", "a/../../outside/f", "a//b/f", "./a/b/f",
             "a/b/f/", "a/./b/f", "a/b/f\0x", ".."]


@pytest.mark.parametrize("rel", BAD_NAMES)
def test_names_that_are_not_plain_relative_paths_are_refused(
        resolver: str, tree: tuple[Path, int, Path], rel: str) -> None:
    _, fd, _ = tree
    for op in (lambda: beneath.open_read(fd, rel), lambda: beneath.lstat(fd, rel),
               lambda: beneath.mkdirs(fd, rel), lambda: beneath.create(fd, rel)):
        with pytest.raises(OSError) as ei:
            op()
        assert ei.value.errno == errno.EINVAL


def _swap(top: Path, outside: Path, comp: str) -> None:
    """Replace ``top/comp`` (a directory or the file) by a symlink to its twin outside."""
    p = top / comp
    os.rename(p, top / f"{comp.replace('/', '_')}.moved")
    os.symlink(outside / comp, p)


@pytest.mark.parametrize("comp", ["a", "a/b", "a/b/f"])
def test_a_symlink_at_any_component_is_refused_by_every_operation(
        resolver: str, tree: tuple[Path, int, Path], comp: str) -> None:
    top, fd, outside = tree
    _swap(top, outside, comp)
    ops: dict[str, Callable[[], object]] = {
        "open_read": lambda: beneath.open_read(fd, "a/b/f"),
        "open_write": lambda: beneath.open_write(fd, "a/b/f"),
        "create": lambda: beneath.create(fd, "a/b/new" if comp != "a/b/f" else "a/b/f"),
        "open_dir": lambda: beneath.open_dir(fd, "a/b" if comp != "a/b/f" else "a/b/f"),
        "mkdirs": lambda: beneath.mkdirs(fd, "a/b/c" if comp != "a/b/f" else "a/b/f/c"),
        "lstat": lambda: beneath.lstat(fd, "a/b/f/x" if comp == "a/b/f" else "a/b/f"),
        "unlink": lambda: beneath.unlink(fd, "a/b/f"),
        "rename_from": lambda: beneath.rename(fd, "a/b/f", "moved"),
        "rename_to": lambda: beneath.rename(fd, "a.moved/b/f" if comp == "a" else "x",
                                            "a/b/new"),
        "link_into": lambda: beneath.link(top / "x", fd, "a/b/new"),
        "chmod": lambda: beneath.chmod(fd, "a/b/f", 0o777),
        "chown": lambda: beneath.chown(fd, "a/b/f", 65534, 65534),
        "utime": lambda: beneath.utime(fd, "a/b/f", (0, 0)),
        "rmdir": lambda: beneath.rmdir(fd, "a/b" if comp == "a" else "a/b/f/x"),
    }
    (top / "x").write_bytes(b"x")
    if comp == "a/b/f":  # the leaf itself a symlink: unlink and rename act on the link
        del ops["unlink"], ops["rename_from"]
        ops["link_into"] = lambda: beneath.link(top / "x", fd, "a/b/f/new")
        ops["rename_to"] = lambda: beneath.rename(fd, "x", "a/b/f/new")
    for name, op in ops.items():
        with pytest.raises(OSError) as ei:
            op()
        assert ei.value.errno in (*beneath.REFUSED, errno.EEXIST), (name, ei.value)
    # Nothing outside was read, written, moved or changed.
    assert (outside / "a/b/f").read_bytes() == b"secret"
    assert sorted(p.name for p in (outside / "a/b").iterdir()) == ["f"]
    assert oct((outside / "a/b/f").stat().st_mode) == oct(0o100644)
    assert (outside / "a/b/f").stat().st_mtime_ns != 0


def test_operations_inside_work(resolver: str, tree: tuple[Path, int, Path]) -> None:
    top, fd, _ = tree
    rfd = beneath.open_read(fd, "a/b/f")
    assert os.read(rfd, 10) == b"mine"
    os.close(rfd)
    d = beneath.mkdirs(fd, "a/b/c/d")
    os.close(d)
    w = beneath.create(fd, "a/b/c/d/new", 0o640)
    os.write(w, b"new")
    os.close(w)
    with pytest.raises(FileExistsError):
        beneath.create(fd, "a/b/c/d/new")
    beneath.rename(fd, "a/b/c/d/new", "a/top-level")
    beneath.link(top / "a/top-level", fd, "a/b/linked")
    beneath.link("a/b/f", fd, "a/b/c/hard", src_dir_fd=fd)
    assert (top / "a/b/c/hard").read_bytes() == b"mine"
    beneath.chmod(fd, "a/top-level", 0o600)
    beneath.utime(fd, "a/top-level", (5, 7))
    st = beneath.lstat(fd, "a/top-level")
    assert (st.st_mode & 0o777, st.st_mtime_ns, st.st_nlink) == (0o600, 7, 2)
    assert sorted(beneath.walk(fd, "a")) == ["a/b/c/hard", "a/b/f", "a/b/linked",
                                             "a/top-level"]
    assert beneath.lexists(fd, "a/b/linked") and not beneath.lexists(fd, "a/nothing")
    beneath.unlink(fd, "a/b/linked")
    beneath.rmdir(fd, "a/b/c/d")
    assert not (top / "a/b/c/d").exists()


def test_walk_lists_a_symlinked_directory_but_never_descends(
        resolver: str, tree: tuple[Path, int, Path]) -> None:
    top, fd, outside = tree
    os.symlink(outside, top / "a" / "out")
    assert sorted(beneath.walk(fd, "a")) == ["a/b/f", "a/out"]


def test_a_rename_swap_while_resolving_never_escapes(
        resolver: str, tree: tuple[Path, int, Path]) -> None:
    """Another thread swaps ``a`` between a directory and a symlink to the outside as
    fast as it can: every open either reads the file inside or is refused."""
    top, fd, outside = tree
    os.symlink(outside / "a", top / "link")
    stop = threading.Event()

    def swapper() -> None:
        while not stop.is_set():
            os.rename(top / "a", top / "real")
            os.rename(top / "link", top / "a")
            os.rename(top / "a", top / "link")
            os.rename(top / "real", top / "a")

    t = threading.Thread(target=swapper)
    t.start()
    seen = set()
    try:
        for _ in range(3000):
            try:
                rfd = beneath.open_read(fd, "a/b/f")
            except OSError as e:
                seen.add(e.errno)
                continue
            seen.add(os.read(rfd, 10))
            os.close(rfd)
    finally:
        stop.set()
        t.join()
    assert b"secret" not in seen
    # Whole swap cycles leave ``a`` a directory again: the resolver still reads through it
    # (on a loaded machine every open during the swaps may meet one).
    rfd = beneath.open_read(fd, "a/b/f")
    try:
        assert os.read(rfd, 10) == b"mine"
    finally:
        os.close(rfd)


def test_as_tenant_applies_the_kernels_checks_and_restores_root(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    os.chown(own, 65534, 65534)
    os.chmod(tmp_path, 0o755)
    groups = os.getgroups()
    cfd, ofd = beneath.open_base(closed), beneath.open_base(own)
    go, done = threading.Event(), threading.Event()

    def other() -> None:  # a thread started before: it stays root throughout
        go.wait(10)
        os.close(beneath.create(cfd, "from-other-thread"))
        done.set()

    t = threading.Thread(target=other)
    t.start()
    try:
        with beneath.as_tenant(65534, 65534):
            assert os.getgroups() == [65534]
            with pytest.raises(PermissionError):
                beneath.create(cfd, "x")
            os.close(beneath.create(ofd, "x"))
            go.set()
            assert done.wait(10)
        os.close(beneath.create(cfd, "y"))  # root again
    finally:
        go.set()
        t.join()
        os.close(cfd)
        os.close(ofd)
    assert (own / "x").stat().st_uid == 65534
    assert (closed / "y").stat().st_uid == 0
    assert os.getgroups() == groups
    with beneath.as_tenant(None):  # no tenant: nothing changes
        assert os.getgroups() == groups


def test_open_named_follows_only_roots_symlinks_in_roots_directories(tmp_path: Path) -> None:
    """``casfs umount PATH``'s walk: a symlink another user owns, or one of root's in a
    directory others can write (not sticky), is refused with ELOOP; root's in root's
    own directory, or in a sticky one, is followed, as ``/var/run -> /run`` is."""
    (tmp_path / "real" / "leaf").mkdir(parents=True)
    want = os.stat(tmp_path / "real" / "leaf")

    def named(path: Path) -> os.stat_result | int:
        try:
            fd = beneath.open_named(str(path))
        except OSError as e:
            return e.errno or -1
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def same(got: os.stat_result | int) -> bool:
        return isinstance(got, os.stat_result) and got.st_ino == want.st_ino

    for mode in (0o755, 0o1777):
        d = tmp_path / f"d{mode:o}"
        d.mkdir()
        os.chmod(d, mode)
        (d / "root").symlink_to(tmp_path / "real")
        (d / "theirs").symlink_to(tmp_path / "real")
        os.lchown(d / "theirs", 4242, 4242)
        assert same(named(d / "root" / "leaf"))
        assert named(d / "theirs" / "leaf") == errno.ELOOP
        assert named(d / "theirs") == errno.ELOOP  # the last component too
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    (open_dir / "root").symlink_to(tmp_path / "real")
    assert named(open_dir / "root" / "leaf") == errno.ELOOP
    assert same(named(tmp_path / "real" / ".." / "real" / "leaf"))
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert named(tmp_path / "loop") == errno.ELOOP
    assert named(tmp_path / "real" / "leaf" / "nothing") == errno.ENOENT
