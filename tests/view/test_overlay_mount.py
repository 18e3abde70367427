"""Overlay-specific behaviour through a real mount: lower/upper, whiteouts, misses, events."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fusehelpers import mounted

from .conftest import CLEAN, SAMPLE, Overlay

pytestmark = pytest.mark.fuse
MakeOverlay = Callable[..., Overlay]


def counters(ov: Overlay) -> dict[str, int]:
    return next(r["counters"] for r in ov.view.events() if "counters" in r)


def events(ov: Overlay) -> list[list[str]]:
    return [r["event"] for r in ov.view.events() if "event" in r]


def test_lower_files_visible_and_identical(overlay: MakeOverlay) -> None:
    ov = overlay(CLEAN)
    for rel, data in CLEAN.items():
        assert (ov.mnt / rel).read_bytes() == data
        st = os.stat(ov.mnt / rel)
        assert st.st_size == len(data)
        assert st.st_mtime_ns == os.stat(ov.lower / rel).st_mtime_ns
    assert sorted(os.listdir(ov.mnt)) == sorted({p.split("/")[0] for p in CLEAN})
    assert list(ov.upper.glob("**/*.py")) == []  # reading copies nothing up


def test_write_copies_up_and_leaves_lower_alone(overlay: MakeOverlay) -> None:
    ov = overlay()
    with open(ov.mnt / "ab/abcdef.so", "r+b") as f:
        f.seek(10)
        f.write(b"XYZ")
    expected = bytearray(SAMPLE["ab/abcdef.so"])
    expected[10:13] = b"XYZ"
    assert (ov.mnt / "ab/abcdef.so").read_bytes() == bytes(expected)
    assert (ov.upper / "ab/abcdef.so").read_bytes() == bytes(expected)
    assert (ov.lower / "ab/abcdef.so").read_bytes() == SAMPLE["ab/abcdef.so"]
    ov.view.stop()
    assert counters(ov)["copy_up"] == 1


def test_unlink_of_lower_file_persists_across_remount(overlay: MakeOverlay) -> None:
    ov = overlay()
    os.unlink(ov.mnt / "top.txt")
    assert not (ov.mnt / "top.txt").exists()
    assert (ov.upper / ".wh.top.txt").exists()  # OCI whiteout
    assert "top.txt" not in os.listdir(ov.mnt)
    ov.remount()
    assert not (ov.mnt / "top.txt").exists()
    assert ".wh.top.txt" not in os.listdir(ov.mnt)
    assert (ov.lower / "top.txt").exists()


def test_rmdir_mkdir_of_lower_dir_is_empty(overlay: MakeOverlay) -> None:
    ov = overlay()
    d = ov.mnt / "triton/KEY"
    for name in os.listdir(d):
        os.unlink(d / name)
    os.rmdir(d)
    assert not d.exists()
    os.mkdir(d)
    assert os.listdir(d) == []
    ov.remount()
    assert os.listdir(d) == []
    assert (ov.upper / "triton/KEY/.wh..wh..opq").exists()


def test_rename_lower_dir_persists(overlay: MakeOverlay) -> None:
    ov = overlay()
    ino_before = os.stat(ov.mnt / "fxgraph/ab/key1/entry").st_ino
    os.rename(ov.mnt / "fxgraph/ab", ov.mnt / "fxgraph/cd")
    assert os.stat(ov.mnt / "fxgraph/cd/key1/entry").st_ino == ino_before  # inode followed
    ov.remount()
    assert os.listdir(ov.mnt / "fxgraph") == ["cd"]
    assert (ov.mnt / "fxgraph/cd/key1/entry2").read_bytes() == b"pickle-2"


def test_fetch_failure_is_a_miss_not_eio(overlay: MakeOverlay) -> None:
    ov = overlay()
    with pytest.raises(OSError) as exc:
        (ov.mnt / "bad/corrupt.bin").read_bytes()
    assert exc.value.errno == errno.ENOENT
    assert not (ov.mnt / "bad/corrupt.bin").exists()
    assert os.listdir(ov.mnt / "bad") == ["good.bin"]
    assert (ov.mnt / "bad/good.bin").read_bytes() == b"fine"
    # The compiler's reaction to a miss: write the file again. That must work.
    (ov.mnt / "bad/corrupt.bin").write_bytes(b"recompiled")
    assert (ov.mnt / "bad/corrupt.bin").read_bytes() == b"recompiled"
    ov.view.stop()
    c = counters(ov)
    assert c["fetch_errors"] == 1
    assert c["open_lower"] >= 1


def test_reserved_names_hidden_and_refused(overlay: MakeOverlay) -> None:
    ov = overlay()
    os.unlink(ov.mnt / "ab/abcdef.py")
    assert not any(n.startswith(".wh.") for n in os.listdir(ov.mnt / "ab"))
    assert not any(n.startswith(".wh.") for n in os.listdir(ov.mnt))
    for attempt in (
        lambda: (ov.mnt / ".wh.x").write_bytes(b""),
        lambda: os.mkdir(ov.mnt / ".wh.d"),
        lambda: os.rename(ov.mnt / "top.txt", ov.mnt / ".wh.top"),
    ):
        with pytest.raises(OSError) as exc:
            attempt()
        assert exc.value.errno == errno.EPERM
    assert not (ov.mnt / ".wh.abcdef.py").exists()


def test_root_is_sticky_world_writable(overlay: MakeOverlay) -> None:
    ov = overlay()
    assert os.stat(ov.mnt).st_mode & 0o7777 == 0o1777


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory other users can enter (tmp_path is 0o700); removed after the mounts."""
    d = Path(tempfile.mkdtemp(prefix="casfs-view-"))
    os.chmod(d, 0o755)
    yield d
    if not mounted(d / "o/mnt"):
        shutil.rmtree(d, ignore_errors=True)


def test_created_files_belong_to_the_caller(public_dir: Path, overlay: MakeOverlay) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to switch users")
    ov = overlay(base_dir=public_dir, allow_other=True)
    _create_as_other_user(ov)


def _create_as_other_user(ov: Overlay) -> None:
    pid = os.fork()
    if pid == 0:  # child: become an ordinary user and create things
        try:
            os.setgid(4321)
            os.setuid(1234)
            (ov.mnt / "mine.txt").write_bytes(b"x")
            os.mkdir(ov.mnt / "mydir")
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    for name in ("mine.txt", "mydir"):
        st = os.stat(ov.mnt / name)
        assert (st.st_uid, st.st_gid) == (1234, 4321)
        assert os.stat(ov.upper / name).st_uid == 1234


def test_tracker_events(overlay: MakeOverlay) -> None:
    ov = overlay()
    with open(ov.mnt / "new.bin", "wb") as f:
        f.write(b"data")
    os.chmod(ov.mnt / "new.bin", 0o755)
    os.rename(ov.mnt / "new.bin", ov.mnt / "ab/new.bin")
    with open(ov.mnt / "top.txt", "r+b") as f:  # lower: copy-up then write
        f.write(b"T")
    os.unlink(ov.mnt / "ab/abcdef.py")
    ov.view.stop()
    ev: list[Any] = events(ov)
    assert ["opened_for_write", "new.bin"] in ev
    assert ["modified", "new.bin"] in ev
    assert ev.index(["closed_for_write", "new.bin"]) > ev.index(["opened_for_write", "new.bin"])
    assert ["renamed", "new.bin", "ab/new.bin"] in ev
    assert ["opened_for_write", "top.txt"] in ev
    assert ["closed_for_write", "top.txt"] in ev
    assert ["removed", "ab/abcdef.py"] in ev
    pins = next(r["pins"] for r in ov.view.events() if "pins" in r)
    assert all(n == 0 for n in pins.values())  # every fetched object was unpinned


def test_concurrent_copy_up_and_atomic_writes(overlay: MakeOverlay) -> None:
    """Many writers at once: one copy-up wins, nobody's write is lost, renames land."""
    ov = overlay()
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            with open(ov.mnt / "ab/abcdef.so", "r+b") as f:  # all race to copy it up
                f.seek(t)
                f.write(bytes([200 + t]))
            d = ov.mnt / f"KEY{t}"
            d.mkdir(exist_ok=True)
            for i in range(20):
                tmp = d / f".{t}.{i}.tmp"
                tmp.write_bytes(f"{t}-{i}".encode())
                os.replace(tmp, d / f"f{i}")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    data = (ov.mnt / "ab/abcdef.so").read_bytes()
    assert data[:8] == bytes(200 + t for t in range(8))
    assert data[8:] == SAMPLE["ab/abcdef.so"][8:]
    for t in range(8):
        names = sorted(os.listdir(ov.mnt / f"KEY{t}"))
        assert names == sorted(f"f{i}" for i in range(20))
        assert (ov.mnt / f"KEY{t}/f19").read_bytes() == f"{t}-19".encode()
