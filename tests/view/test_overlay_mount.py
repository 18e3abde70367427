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

from casfs.view.whiteout import is_opaque, is_whiteout

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


def test_unlink_of_lower_file_lasts_for_the_mount_only(overlay: MakeOverlay) -> None:
    ov = overlay()
    os.unlink(ov.mnt / "top.txt")
    assert not (ov.mnt / "top.txt").exists()
    assert is_whiteout(os.lstat(ov.upper / "top.txt"))  # overlayfs whiteout: 0/0 char device
    assert "top.txt" not in os.listdir(ov.mnt)
    # A job clearing its cache (issue 8 item 8): later mounts see the cluster's cache again.
    (ov.mnt / "mine.txt").write_bytes(b"unpublished")
    ov.remount()
    assert (ov.mnt / "top.txt").read_bytes() == SAMPLE["top.txt"]
    assert (ov.mnt / "mine.txt").read_bytes() == b"unpublished"  # the job's own files stay
    assert not os.path.lexists(ov.upper / "top.txt")


def test_rm_rf_of_everything_is_scoped_to_the_mount(overlay: MakeOverlay) -> None:
    ov = overlay()
    for name in os.listdir(ov.mnt):
        p = ov.mnt / name
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    assert os.listdir(ov.mnt) == []
    os.mkdir(ov.mnt / "ab")  # re-created: starts empty for this mount
    assert os.listdir(ov.mnt / "ab") == []
    ov.remount()
    assert sorted(os.listdir(ov.mnt)) == sorted({k.split("/")[0] for k in SAMPLE})
    assert sorted(os.listdir(ov.mnt / "ab")) == ["abcdef.py", "abcdef.so"]


def test_legacy_oci_markers_are_migrated(overlay: MakeOverlay, tmp_path: Path) -> None:
    ov = overlay()
    ov.view.stop()
    (ov.upper / ".wh..wh.casfs.work").mkdir()  # an upper written by the old format
    (ov.upper / ".wh.top.txt").touch()
    (ov.upper / "ab").mkdir()
    (ov.upper / "ab/.wh..wh..opq").touch()
    ov.view.start()
    assert sorted(os.listdir(ov.mnt / "ab")) == ["abcdef.py", "abcdef.so"]
    assert (ov.mnt / "top.txt").exists()
    assert not any(n.startswith(".wh.") for n in os.listdir(ov.upper))
    (ov.mnt / ".wh.now-legal").write_bytes(b"x")  # after migration, an ordinary name
    ov.remount()
    assert (ov.mnt / ".wh.now-legal").read_bytes() == b"x"


def test_rmdir_mkdir_of_lower_dir_is_empty(overlay: MakeOverlay) -> None:
    ov = overlay()
    d = ov.mnt / "triton/KEY"
    for name in os.listdir(d):
        os.unlink(d / name)
    os.rmdir(d)
    assert not d.exists()
    os.mkdir(d)
    assert os.listdir(d) == []
    assert is_opaque(str(ov.upper / "triton/KEY"))
    ov.remount()  # deletions end with the mount: the lower entries are back
    assert sorted(os.listdir(d)) == sorted(k.split("/")[-1] for k in SAMPLE if "KEY" in k)


def test_rename_lower_dir_copy_persists(overlay: MakeOverlay) -> None:
    ov = overlay()
    ino_before = os.stat(ov.mnt / "fxgraph/ab/key1/entry").st_ino
    os.rename(ov.mnt / "fxgraph/ab", ov.mnt / "fxgraph/cd")
    assert os.stat(ov.mnt / "fxgraph/cd/key1/entry").st_ino == ino_before  # inode followed
    assert os.listdir(ov.mnt / "fxgraph") == ["cd"]
    ov.remount()  # the copy is the job's; the published original is back (deletions are scoped)
    assert os.listdir(ov.mnt / "fxgraph") == ["ab", "cd"]
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


def test_no_reserved_names_and_255_byte_whiteouts(overlay: MakeOverlay) -> None:
    long = "L" * 255
    ov = overlay({"ab/x": b"x", f"ab/{long}": b"long", ".wh.x": b"dotwh"})
    assert (ov.mnt / ".wh.x").read_bytes() == b"dotwh"
    os.unlink(ov.mnt / "ab" / long)  # whiteout of a NAME_MAX name
    assert os.listdir(ov.mnt / "ab") == ["x"]
    (ov.mnt / "ab" / long).write_bytes(b"new")
    assert (ov.mnt / "ab" / long).read_bytes() == b"new"
    os.mkdir(ov.mnt / ("D" * 255))
    os.rename(ov.mnt / "ab/x", ov.mnt / ("D" * 255) / long)
    assert sorted(os.listdir(ov.mnt / "ab")) == [long]
    os.mkdir(ov.mnt / ".wh.d")
    os.rename(ov.mnt / ".wh.x", ov.mnt / ".wh..wh..opq")
    assert sorted(os.listdir(ov.mnt)) == [".wh..wh..opq", ".wh.d", "D" * 255, "ab"]


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


def test_new_dirs_at_a_merged_root_keep_its_link_count_without_recounting(
        overlay: MakeOverlay) -> None:
    """A Triton put makes one key dir per kernel in the cache root, and the kernel then
    re-reads the root's attributes (GETATTR): its link count (2 + visible subdirs,
    lower ones merged in) must be right each time without merging the whole root
    listing again per new dir (O(N) per kernel in a root of N key dirs)."""
    ov = overlay()
    lower_dirs = {p.split("/")[0] for p in SAMPLE if "/" in p}
    assert os.stat(ov.mnt).st_nlink == 2 + len(lower_dirs)
    for i in range(40):
        os.mkdir(ov.mnt / f"KEY{i:02d}")
        assert os.stat(ov.mnt).st_nlink == 2 + len(lower_dirs) + i + 1
    # A removal and a rename still recount (and stay right).
    os.rmdir(ov.mnt / "KEY00")
    assert os.stat(ov.mnt).st_nlink == 2 + len(lower_dirs) + 39
    os.rename(ov.mnt / "KEY01", ov.mnt / "ab" / "KEY01")
    assert os.stat(ov.mnt).st_nlink == 2 + len(lower_dirs) + 38
    os.mkdir(ov.mnt / "KEY00")
    assert os.stat(ov.mnt).st_nlink == 2 + len(lower_dirs) + 39
    real = sum(1 for e in os.scandir(ov.mnt) if e.is_dir(follow_symlinks=False))
    assert os.stat(ov.mnt).st_nlink == 2 + real
    ov.view.stop()
    # The first stat, one after the rmdir, two after the rename (the root, ab), and the
    # listing's lower dirs their own (each once): not one per new dir (50 before).
    assert counters(ov)["subdir_recount"] <= 4 + len(lower_dirs)


def test_rmdir_of_a_full_upper_dir_looks_for_whiteouts_only_once_the_view_made_one(
        overlay: MakeOverlay) -> None:
    """removedirs's last step in a Triton put (rmdir of the key dir: ENOTEMPTY) needs no
    scan of the directory for whiteouts while this view made none: the sweep at its
    start removed every older one. After the first whiteout, the scan is back."""
    ov = overlay()
    os.makedirs(ov.mnt / "K" / "tmp")
    (ov.mnt / "K" / "f").write_bytes(b"x")
    for _ in range(3):
        with pytest.raises(OSError) as e:
            os.rmdir(ov.mnt / "K")
        assert e.value.errno == errno.ENOTEMPTY
    os.rmdir(ov.mnt / "K" / "tmp")  # empty: removed by the upper's own rmdir
    os.unlink(ov.mnt / "top.txt")  # a lower file: the view's first whiteout
    with pytest.raises(OSError) as e:
        os.rmdir(ov.mnt / "K")
    assert e.value.errno == errno.ENOTEMPTY
    os.unlink(ov.mnt / "K" / "f")
    os.rmdir(ov.mnt / "K")
    assert not (ov.mnt / "K").exists() and not (ov.mnt / "top.txt").exists()
    ov.view.stop()
    assert counters(ov)["whiteout_scan"] == 1


@pytest.mark.parametrize("through", ["a", "b"])
def test_a_file_written_through_one_of_its_names_is_changed_under_every_name(
        overlay: MakeOverlay, through: str) -> None:
    """Two names of one file, then a rewrite through one of them: both hold the new
    bytes, so both must be promoted again. Only the name written through was marked,
    and the other was published with the old bytes (a review, 2026-12-06)."""
    ov = overlay({})
    (ov.mnt / "a").write_bytes(b"old-bytes")
    os.link(ov.mnt / "a", ov.mnt / "b")
    ov.view.stop()  # (a round: what came before is settled)
    ov.view.start()
    assert (ov.mnt / "a").read_bytes() == b"old-bytes"  # both names looked up again
    assert (ov.mnt / "b").read_bytes() == b"old-bytes"
    with open(ov.mnt / through, "r+b") as f:
        f.write(b"NEW-BYTES")
    os.truncate(ov.mnt / through, 9)  # a size change by path, too
    ov.view.stop()
    marked = {e[1] for e in events(ov) if e[0] == "modified"}
    assert {"a", "b"} <= marked, events(ov)
    assert (ov.upper / "a").read_bytes() == (ov.upper / "b").read_bytes() == b"NEW-BYTES"
