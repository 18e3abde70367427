"""FUSE copy-up never acts through a directory swapped for a symlink (issue 21).

In fuse mode the view (root) copies a lower file into the upper when a job
opens it for writing, changes its mode or size, links or renames it. The copy
is fetched and staged off the trio thread; meanwhile the view serves the
job's other requests. Before: a job that, during that window, renamed the
file's directory away and made a symlink of the same name to a root-only
directory (two plain requests through the view) had the rest of the handler
act on the old path string, relative to the upper's fd but through the
symlink: the open returned a handle of the root-only file (then written), a
chmod or truncate changed it, a rename moved it into the upper (then read) or
moved the job's file into the root-only directory. Now a handler whose path
runs through a symlink once its copy-up is done answers ENOENT (the file
moved meanwhile): the root-only directory is never touched.

The view's requests are driven in-process (as the kernel would pass them: the
kernel's path lookup never enters a symlink, so only a path held across the
copy-up's await can be stale); the copy-up's staging is held until the swap is
made, the window a large or slow fetch makes.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pyfuse3
import pytest
import trio

from casfs.store.entry import Entry
from casfs.util.counters import Counters
from casfs.view.lower import DictLowerTree
from casfs.view.ops import OverlayOperations
from casfs.view.testserve import RecordingTracker
from tests.view.test_ops_inprocess import Fetcher

CTX = pyfuse3.RequestContext()
ROOT = pyfuse3.ROOT_INODE
SECRET = b"root:$6$not-for-tenants:19000:0:99999:7:::\n"
LOWER = {"KEY/k.so": b"her kernel", "a.txt": b"alpha"}


class Rig:
    def __init__(self, tmp: Path) -> None:
        tree = DictLowerTree()
        files: dict[str, Path] = {}
        for i, (rel, data) in enumerate(LOWER.items()):
            src = tmp / "objects" / str(i)
            src.parent.mkdir(exist_ok=True)
            src.write_bytes(data)
            files[f"{i:064x}"] = src
            tree.add(Entry(rel, f"{i:064x}", len(data), 0o644, 1_000_000_000 * (i + 1)))
        upper = tmp / "upper"
        upper.mkdir()
        self.ops = OverlayOperations(tree, Fetcher(files), upper, RecordingTracker(), Counters(),
                                     lower_timeout=3600, upper_timeout=1)
        self.secret_dir = tmp / "rootonly"
        self.secret_dir.mkdir(mode=0o700)
        self.secret = self.secret_dir / "k.so"
        self.secret.write_bytes(SECRET)
        os.chmod(self.secret, 0o600)
        self.before = os.stat(self.secret)
        # The first staging waits here until the swap is made (the fetch's window).
        self.staging = threading.Event()
        self.go = threading.Event()
        real = self.ops.layers.stage_copy

        def held(*a: Any) -> str:
            if not self.staging.is_set():
                self.staging.set()
                assert self.go.wait(30)
            return real(*a)

        self.ops.layers.stage_copy = held  # type: ignore[method-assign]

    async def ino(self, path: str) -> int:
        ino = ROOT
        for part in path.split("/"):
            ino = (await self.ops.lookup(ino, part.encode(), CTX)).st_ino
        return ino

    async def swap(self) -> None:
        """The job's two requests: KEY renamed away, a symlink named KEY to root's dir."""
        while not self.staging.is_set():
            await trio.sleep(0.005)
        try:
            await self.ops.rename(ROOT, b"KEY", ROOT, b"KEY2", 0, CTX)
            await self.ops.symlink(ROOT, b"KEY", os.fsencode(self.secret_dir), CTX)
            assert os.path.islink(self.ops.layers.up("KEY"))
        finally:
            self.go.set()

    def attack(self, op: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``op`` with the swap made while its copy-up stages; its result or error."""
        out: list[Any] = []

        async def main() -> None:
            async def run_op() -> None:
                try:
                    out.append(await op())
                except pyfuse3.FUSEError as e:
                    out.append(e)

            async with trio.open_nursery() as n:
                n.start_soon(run_op)
                n.start_soon(self.swap)

        trio.run(main)
        return out[0]

    def assert_untouched(self) -> None:
        st = os.stat(self.secret)
        assert self.secret.read_bytes() == SECRET
        assert (st.st_ino, st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (
            self.before.st_ino, self.before.st_uid, self.before.st_gid, 0o600)
        assert sorted(os.listdir(self.secret_dir)) == ["k.so"]


class Fields:  # pyfuse3.SetattrFields, settable
    update_atime = update_mode = update_uid = update_gid = update_size = False
    update_mtime = update_ctime = False


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    if os.geteuid() != 0:
        pytest.skip("needs root (the view acts as root in fuse mode)")
    return Rig(tmp_path)


def test_open_for_writing_never_returns_a_handle_of_root_file(rig: Rig) -> None:
    """Before: the open returned a handle of the root-only file, and the write landed."""
    async def op() -> Any:
        ino = await rig.ino("KEY/k.so")
        fi = await rig.ops.open(ino, os.O_WRONLY, CTX)
        try:
            await rig.ops.write(fi.fh, 0, b"pwned")
        finally:
            await rig.ops.release(fi.fh)
        return fi

    res = rig.attack(op)
    rig.assert_untouched()
    assert isinstance(res, pyfuse3.FUSEError), "a handle was returned through the symlink"


@pytest.mark.parametrize("change", ["chmod", "truncate"])
def test_setattr_never_changes_root_file(rig: Rig, change: str) -> None:
    """Before: root's file was made 0777 (chmod), resp. emptied (truncate)."""
    async def op() -> Any:
        ino = await rig.ino("KEY/k.so")
        attr = pyfuse3.EntryAttributes()
        fields = Fields()
        if change == "chmod":
            attr.st_mode = stat.S_IFREG | 0o777
            fields.update_mode = True
        else:
            attr.st_size = 0
            fields.update_size = True
        return await rig.ops.setattr(ino, attr, fields, None, CTX)  # type: ignore[arg-type]

    res = rig.attack(op)
    rig.assert_untouched()
    assert isinstance(res, pyfuse3.FUSEError)


def test_rename_of_a_lower_file_never_moves_root_file_in(rig: Rig) -> None:
    """Before: root's file was moved into the upper as ``x`` (the job read it)."""
    async def op() -> Any:
        ino = await rig.ino("KEY")
        return await rig.ops.rename(ino, b"k.so", ROOT, b"x", 0, CTX)

    res = rig.attack(op)
    rig.assert_untouched()
    assert isinstance(res, pyfuse3.FUSEError)
    x = Path(rig.ops.layers.up("x"))
    assert not x.exists() or x.read_bytes() != SECRET


def test_rename_into_a_swapped_directory_plants_nothing(rig: Rig) -> None:
    """Before: the job's file (``a.txt``, copied up) was moved into root's directory."""
    async def op() -> Any:
        ino = await rig.ino("KEY")  # looked up before the swap: its path is "KEY"
        return await rig.ops.rename(ROOT, b"a.txt", ino, b"planted", 0, CTX)

    res = rig.attack(op)
    rig.assert_untouched()
    assert isinstance(res, pyfuse3.FUSEError)


def test_link_into_a_swapped_directory_plants_nothing(rig: Rig) -> None:
    """A hard link of a lower file (copied up first) named in KEY: never in root's dir."""
    async def op() -> Any:
        a = await rig.ino("a.txt")
        key = await rig.ino("KEY")
        return await rig.ops.link(a, key, b"planted", CTX)

    res = rig.attack(op)
    rig.assert_untouched()
    assert isinstance(res, pyfuse3.FUSEError)


def test_without_a_swap_the_copy_up_still_works(rig: Rig) -> None:
    """What held: an open for writing, no swap, copies up and writes the job's file."""
    rig.go.set()
    rig.staging.set()

    async def main() -> None:
        ino = await rig.ino("KEY/k.so")
        fi = await rig.ops.open(ino, os.O_RDWR, CTX)
        await rig.ops.write(fi.fh, 0, b"HER")
        await rig.ops.release(fi.fh)

    trio.run(main)
    assert Path(rig.ops.layers.up("KEY/k.so")).read_bytes() == b"HER kernel"
    rig.assert_untouched()
