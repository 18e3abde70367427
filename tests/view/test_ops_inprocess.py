"""OverlayOperations driven in-process (no mount): merge rules, inodes, misses, tracker events."""

from __future__ import annotations

import errno
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pyfuse3
import pytest
import trio

from casfs.errors import CorruptObjectError
from casfs.store.entry import Entry
from casfs.util.counters import Counters
from casfs.view.lower import DictLowerTree
from casfs.view.ops import OverlayOperations
from casfs.view.testserve import RecordingTracker
from casfs.view.whiteout import is_opaque, is_whiteout

CTX = pyfuse3.RequestContext()
ROOT = pyfuse3.ROOT_INODE


class Fetcher:
    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files
        self.pins: dict[str, int] = {}

    def fetch(self, entry: Entry) -> str:
        if "corrupt" in entry.path:
            raise CorruptObjectError("bad object")
        self.pins[entry.digest] = self.pins.get(entry.digest, 0) + 1
        return str(self.files[entry.digest])

    def cached(self, entry: Entry) -> str | None:
        return None  # always through fetch (the threaded path)

    def unpin(self, digest: str) -> None:
        self.pins[digest] -= 1


@pytest.fixture
def ops(tmp_path: Path) -> OverlayOperations:
    content = {"a.txt": b"alpha", "d/sub/f": b"eff", "d/g": b"gee", "d/corrupt": b"??"}
    tree = DictLowerTree()
    files: dict[str, Path] = {}
    for i, (rel, data) in enumerate(content.items()):
        src = tmp_path / "objects" / str(i)
        src.parent.mkdir(exist_ok=True)
        src.write_bytes(data)
        digest = f"{i:064x}"
        files[digest] = src
        tree.add(Entry(rel, digest, len(data), 0o644, 1_000_000_000 * (i + 1)))
    upper = tmp_path / "upper"
    upper.mkdir()
    return OverlayOperations(tree, Fetcher(files), upper, RecordingTracker(), Counters(),
                             lower_timeout=3600, upper_timeout=1)


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    return trio.run(fn)


async def ino_of(ops: OverlayOperations, path: str) -> int:
    ino = ROOT
    for part in path.split("/"):
        ino = (await ops.lookup(ino, part.encode(), CTX)).st_ino
    return ino


def errno_of(exc: pytest.ExceptionInfo[pyfuse3.FUSEError]) -> int:
    return exc.value.errno


def test_lookup_lower_and_miss(ops: OverlayOperations) -> None:
    async def main() -> None:
        a = await ops.lookup(ROOT, b"a.txt", CTX)
        assert a.st_size == 5 and a.st_mode & 0o777 == 0o644
        assert a.entry_timeout == 3600 and a.attr_timeout == 3600
        d = await ops.lookup(ROOT, b"d", CTX)
        assert d.st_mode & 0o170000 == 0o040000
        with pytest.raises(pyfuse3.FUSEError) as exc:
            await ops.lookup(ROOT, b"nope", CTX)
        assert errno_of(exc) == errno.ENOENT
        with pytest.raises(pyfuse3.FUSEError):
            await ops.lookup(ROOT, b".casfs-work", CTX)  # staging is outside the upper

    run(main)
    c = ops.counters.snapshot()
    assert c["lookup_lower"] == 2 and c["lookup_miss"] == 2


def test_read_lower_unpins_on_release(ops: OverlayOperations) -> None:
    async def main() -> None:
        ino = await ino_of(ops, "d/sub/f")
        fi = await ops.open(ino, os.O_RDONLY, CTX)
        assert fi.keep_cache
        assert await ops.read(fi.fh, 0, 100) == b"eff"
        await ops.release(fi.fh)

    run(main)
    assert all(n == 0 for n in ops.fetcher.pins.values())  # type: ignore[attr-defined]
    assert ops.counters.get("open_lower") == 1
    assert not (ops.layers.upper_dir / "d").exists()  # reading copies nothing up


def test_fetch_failure_is_enoent_and_sticky(ops: OverlayOperations) -> None:
    async def main() -> None:
        ino = await ino_of(ops, "d/corrupt")
        with pytest.raises(pyfuse3.FUSEError) as exc:
            await ops.open(ino, os.O_RDONLY, CTX)
        assert errno_of(exc) == errno.ENOENT
        with pytest.raises(pyfuse3.FUSEError) as exc:
            await ops.getattr(ino, CTX)
        assert errno_of(exc) == errno.ENOENT
        d = await ino_of(ops, "d")
        with pytest.raises(pyfuse3.FUSEError):
            await ops.lookup(d, b"corrupt", CTX)
        fh = await ops.opendir(d, CTX)
        assert ops._dirs[fh][1] == ["g", "sub"]

    run(main)
    assert ops.counters.get("fetch_errors") == 1


def test_write_open_copies_up_and_reports(ops: OverlayOperations) -> None:
    async def main() -> None:
        ino = await ino_of(ops, "d/g")
        fi = await ops.open(ino, os.O_RDWR, CTX)
        assert await ops.write(fi.fh, 1, b"ZZ") == 2
        await ops.release(fi.fh)
        assert (await ops.getattr(ino, CTX)).attr_timeout == 1  # now an upper file

    run(main)
    assert (ops.layers.upper_dir / "d/g").read_bytes() == b"gZZ"
    ev = ops.tracker.events  # type: ignore[attr-defined]
    assert ev == [("opened_for_write", "d/g"), ("modified", "d/g"), ("closed_for_write", "d/g")]
    assert ops.counters.get("copy_up") == 1


def test_create_unlink_rename_events(ops: OverlayOperations) -> None:
    async def main() -> None:
        fi, attrs = await ops.create(ROOT, b"n", 0o100644, os.O_WRONLY | os.O_CREAT, CTX)
        await ops.write(fi.fh, 0, b"x")
        await ops.release(fi.fh)
        with pytest.raises(pyfuse3.FUSEError) as exc:
            await ops.create(ROOT, b"n", 0o100644, os.O_WRONLY | os.O_CREAT | os.O_EXCL, CTX)
        assert errno_of(exc) == errno.EEXIST
        fi, _ = await ops.create(ROOT, b".wh.n", 0o100644, os.O_WRONLY | os.O_CREAT, CTX)
        await ops.release(fi.fh)  # no name is reserved any more
        d = await ino_of(ops, "d")
        await ops.rename(ROOT, b"n", d, b"m", 0, CTX)
        assert (await ops.getattr(attrs.st_ino, CTX)).st_size == 1  # the inode followed
        await ops.unlink(ROOT, b"a.txt", CTX)

    run(main)
    ev = ops.tracker.events  # type: ignore[attr-defined]
    assert ev[0] == ("opened_for_write", "n")
    assert ("renamed", "n", "d/m") in ev and ("removed", "a.txt") in ev
    assert is_whiteout(os.lstat(ops.layers.upper_dir / "a.txt"))
    assert ops.layers.resolve("a.txt") is None


def test_rename_lower_dir_remaps_descendants(ops: OverlayOperations) -> None:
    async def main() -> None:
        f = await ino_of(ops, "d/sub/f")
        await ops.rename(ROOT, b"d", ROOT, b"e", 0, CTX)
        assert ops.inodes.path(f) == "e/sub/f"
        assert (await ops.getattr(f, CTX)).st_size == 3
        with pytest.raises(pyfuse3.FUSEError):
            await ops.lookup(ROOT, b"d", CTX)
        fi = await ops.open(f, os.O_RDONLY, CTX)
        assert await ops.read(fi.fh, 0, 10) == b"eff"
        await ops.release(fi.fh)

    run(main)
    up = ops.layers.upper_dir
    assert is_whiteout(os.lstat(up / "d")) and is_opaque(str(up / "e"))
    assert not (up / "e/corrupt").exists()  # a failed object is dropped, not copied
    ev = ops.tracker.events  # type: ignore[attr-defined]
    assert ("modified", "d/sub/f") in ev and ("renamed", "d", "e") in ev


def test_rmdir_enotempty_and_recreate_opaque(ops: OverlayOperations) -> None:
    async def main() -> None:
        d = await ino_of(ops, "d")
        with pytest.raises(pyfuse3.FUSEError) as exc:
            await ops.rmdir(d, b"sub", CTX)
        assert errno_of(exc) == errno.ENOTEMPTY
        sub = await ino_of(ops, "d/sub")
        await ops.unlink(sub, b"f", CTX)
        await ops.rmdir(d, b"sub", CTX)
        with pytest.raises(pyfuse3.FUSEError) as exc:
            await ops.mkdir(d, b"g", 0o755, CTX)
        assert errno_of(exc) == errno.EEXIST
        await ops.mkdir(d, b"sub", 0o755, CTX)
        fh = await ops.opendir(await ino_of(ops, "d/sub"), CTX)
        assert ops._dirs[fh][1] == []

    run(main)
    up = ops.layers.upper_dir
    assert is_opaque(str(up / "d/sub")) and not is_whiteout(os.lstat(up / "d/sub"))


def test_root_mode(ops: OverlayOperations) -> None:
    attrs = run(lambda: ops.getattr(ROOT, CTX))
    assert attrs.st_mode & 0o7777 == 0o1777


def test_refresh_shows_new_lower_entries(ops: OverlayOperations, tmp_path: Path) -> None:
    async def main() -> None:
        with pytest.raises(pyfuse3.FUSEError):
            await ops.lookup(ROOT, b"late.txt", CTX)
        src = tmp_path / "late"
        src.write_bytes(b"late")
        ops.fetcher.files["f" * 64] = src  # type: ignore[attr-defined]
        ops.layers.lower.add(Entry("late.txt", "f" * 64, 4, 0o644, 1))  # type: ignore[attr-defined]
        ops.lower_changed()
        ino = (await ops.lookup(ROOT, b"late.txt", CTX)).st_ino
        fi = await ops.open(ino, os.O_RDONLY, CTX)
        assert await ops.read(fi.fh, 0, 10) == b"late"
        await ops.release(fi.fh)
        newer = DictLowerTree([Entry("d/newer", "f" * 64, 4, 0o600, 1)])
        ops.set_lower(newer)
        d = await ino_of(ops, "d")
        assert (await ops.lookup(d, b"newer", CTX)).st_mode & 0o777 == 0o600

    run(main)


def test_replaced_paths_and_the_tenants_ownership(ops: OverlayOperations) -> None:
    """A replaced path: short timeouts, no keep_cache; lower entries appear as the tenant's,
    and a copy-up belongs to it, so its non-root jobs may rewrite what another node wrote."""
    ops.replaced = lambda path: path == "d/g"
    ops.lower_owner = (4242, 4343)

    async def main() -> None:
        g = await ops.lookup(await ino_of(ops, "d"), b"g", CTX)
        assert g.attr_timeout == ops.replaced_timeout and (g.st_uid, g.st_gid) == (4242, 4343)
        a = await ops.lookup(ROOT, b"a.txt", CTX)
        assert a.attr_timeout == 3600 and a.st_uid == 4242
        fi = await ops.open(g.st_ino, os.O_RDONLY, CTX)
        assert not fi.keep_cache  # its pages may hold an older version after a refresh
        await ops.release(fi.fh)
        fi = await ops.open(g.st_ino, os.O_RDWR, CTX)  # copy-up
        await ops.release(fi.fh)

    run(main)
    st = os.lstat(ops.layers.up("d/g"))
    if os.geteuid() == 0:
        assert (st.st_uid, st.st_gid) == (4242, 4343)
