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
        self.warm = False  # open_cached answers (the object cache's warm open)

    def fetch(self, entry: Entry) -> str:
        if "corrupt" in entry.path:
            raise CorruptObjectError("bad object")
        self.pins[entry.digest] = self.pins.get(entry.digest, 0) + 1
        return str(self.files[entry.digest])

    def cached(self, entry: Entry) -> str | None:
        return None  # always through fetch (the threaded path)

    def open_cached(self, entry: Entry) -> int | None:
        if not self.warm:
            return None  # through fetch (the threaded path)
        self.pins[entry.digest] = self.pins.get(entry.digest, 0) + 1
        return os.open(self.files[entry.digest], os.O_RDONLY)

    def release_cached(self, digest: str, fd: int) -> None:
        os.close(fd)
        self.unpin(digest)

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
        # A miss is an entry of inode 0 with a timeout: the kernel caches it.
        nope = await ops.lookup(ROOT, b"nope", CTX)
        assert nope.st_ino == 0 and nope.entry_timeout == 3600
        assert (await ops.lookup(ROOT, b".casfs-work", CTX)).st_ino == 0  # staging is outside
        assert ops._negative == {ROOT: {b"nope", b".casfs-work"}}

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


@pytest.mark.expect_log(r"lower object for 'd/corrupt' unavailable, serving a miss: bad object")
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
        with pytest.raises(pyfuse3.FUSEError):  # not cached: a failed fetch is retried later
            await ops.lookup(d, b"corrupt", CTX)
        assert not ops._negative
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


def test_names_made_through_the_view_are_no_longer_negative(ops: OverlayOperations) -> None:
    """The kernel turns its own negative dentry positive on create/mkdir/rename/link:
    the view stops tracking it (else the table fills and misses stop being cached)."""

    async def main() -> None:
        d = await ino_of(ops, "d")
        for name in (b"f", b"dir", b"sym", b"moved", b"linked", b"node"):
            assert (await ops.lookup(d, name, CTX)).st_ino == 0
        assert ops._negative_n == 6
        fi, attrs = await ops.create(d, b"f", 0o100644, os.O_WRONLY | os.O_CREAT, CTX)
        await ops.release(fi.fh)
        await ops.mkdir(d, b"dir", 0o755, CTX)
        await ops.symlink(d, b"sym", b"f", CTX)
        await ops.mknod(d, b"node", 0o100644, 0, CTX)
        await ops.link(attrs.st_ino, d, b"linked", CTX)
        await ops.rename(d, b"sym", d, b"moved", 0, CTX)
        assert ops._negative == {} and ops._negative_n == 0
        # A directory the kernel forgets takes its negative entries with it.
        sub = await ino_of(ops, "d/dir")
        assert (await ops.lookup(sub, b"x", CTX)).st_ino == 0
        await ops.forget([(sub, 2)])  # mkdir and the lookup: the kernel's whole count
        assert ops._negative == {} and ops._negative_n == 0

    run(main)


def test_warm_opens_skip_resolving_until_the_view_changes(ops: OverlayOperations) -> None:
    """A lower file opened warm once is opened again from its inode alone; any change
    to the view (a rename above it, an unlink) or a detached inode goes the long way."""
    ops.fetcher.warm = True  # type: ignore[attr-defined]
    resolved: list[str] = []
    real_resolve = ops.layers.resolve

    def counting(path: str) -> Any:
        resolved.append(path)
        return real_resolve(path)

    ops.layers.resolve = counting  # type: ignore[method-assign]

    async def read_once(ino: int) -> bytes:
        fi = await ops.open(ino, os.O_RDONLY, CTX)
        assert fi.keep_cache
        data = await ops.read(fi.fh, 0, 10)
        await ops.release(fi.fh)
        return bytes(data)

    async def main() -> None:
        f = await ino_of(ops, "d/sub/f")
        assert await read_once(f) == b"eff"
        resolved.clear()
        assert await read_once(f) == b"eff"
        assert resolved == []  # the warm shortcut
        await ops.rename(await ino_of(ops, "d"), b"sub", await ino_of(ops, "d"), b"moved", 0, CTX)
        resolved.clear()
        assert await read_once(f) == b"eff"  # the view changed: resolved again
        assert resolved == ["d/moved/f"]
        g = await ino_of(ops, "d/g")
        assert await read_once(g) == b"gee"
        await ops.unlink(await ino_of(ops, "d"), b"g", CTX)
        with pytest.raises(pyfuse3.FUSEError) as exc:
            await ops.open(g, os.O_RDONLY, CTX)
        assert errno_of(exc) == errno.ENOENT
        a = await ino_of(ops, "a.txt")
        assert await read_once(a) == b"alpha"
        ops.inodes.detach("a.txt")  # as a newer version of a replaced path does
        with pytest.raises(pyfuse3.FUSEError) as exc:
            await ops.open(a, os.O_RDONLY, CTX)
        assert errno_of(exc) == errno.ENOENT

    run(main)
    assert all(n == 0 for n in ops.fetcher.pins.values())  # type: ignore[attr-defined]


@pytest.mark.expect_log(r"lower object for 'd/corrupt' unavailable, serving a miss: bad object")
def test_rename_lower_dir_remaps_descendants(ops: OverlayOperations) -> None:
    async def main() -> None:
        f = await ino_of(ops, "d/sub/f")
        await ops.rename(ROOT, b"d", ROOT, b"e", 0, CTX)
        assert ops.inodes.path(f) == "e/sub/f"
        assert (await ops.getattr(f, CTX)).st_size == 3
        assert (await ops.lookup(ROOT, b"d", CTX)).st_ino == 0
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


def test_rmdir_of_upper_only_dirs(ops: OverlayOperations) -> None:
    """A directory with no lower one merged in is removed by the upper's own rmdir:
    ENOTEMPTY while it holds a visible entry, removed when it holds only whiteouts."""

    async def main() -> None:
        t = (await ops.mkdir(ROOT, b"t", 0o755, CTX)).st_ino
        tmp = (await ops.mkdir(t, b"tmp", 0o755, CTX)).st_ino
        fi, _ = await ops.create(tmp, b"x", 0o644, os.O_WRONLY | os.O_CREAT, CTX)
        await ops.release(fi.fh)
        with pytest.raises(pyfuse3.FUSEError) as exc:
            await ops.rmdir(t, b"tmp", CTX)
        assert errno_of(exc) == errno.ENOTEMPTY
        await ops.rename(tmp, b"x", t, b"x", 0, CTX)  # a Triton put: into place
        await ops.rmdir(t, b"tmp", CTX)
        with pytest.raises(pyfuse3.FUSEError) as exc:  # removedirs's last step
            await ops.rmdir(ROOT, b"t", CTX)
        assert errno_of(exc) == errno.ENOTEMPTY
        assert (await ops.lookup(t, b"x", CTX)).st_ino
        # d/sub/f deleted (a whiteout in upper d/sub), then the lower loses d: d/sub is
        # an upper-only directory holding nothing but a whiteout, empty to the job.
        sub = await ino_of(ops, "d/sub")
        await ops.unlink(sub, b"f", CTX)
        assert is_whiteout(os.lstat(ops.layers.upper_dir / "d/sub/f"))
        ops.set_lower(DictLowerTree())
        await ops.rmdir(await ino_of(ops, "d"), b"sub", CTX)
        assert not (ops.layers.upper_dir / "d/sub").exists()
        assert (await ops.lookup(await ino_of(ops, "d"), b"sub", CTX)).st_ino == 0

    run(main)


def test_writeback_time_flushes(ops: OverlayOperations) -> None:
    """The writeback cache's times-only SETATTRs of an upper file: the mtime asked is
    set (and reported to the promoter), the same mtime again changes nothing."""

    class Times:
        update_atime = update_mode = update_uid = update_gid = update_size = False
        update_mtime = update_ctime = True

    async def main() -> None:
        fi, a = await ops.create(ROOT, b"w", 0o644, os.O_WRONLY | os.O_CREAT, CTX)
        await ops.write(fi.fh, 0, b"data")
        await ops.release(fi.fh)
        times = pyfuse3.EntryAttributes()
        times.st_mtime_ns = times.st_ctime_ns = 1_234_000_000_123
        tracker = ops.tracker
        assert isinstance(tracker, RecordingTracker)
        tracker.events.clear()
        got = await ops.setattr(a.st_ino, times, Times(), None, CTX)
        assert got.st_mtime_ns == 1_234_000_000_123 and got.st_size == 4
        assert os.lstat(ops.layers.upper_dir / "w").st_mtime_ns == 1_234_000_000_123
        assert tracker.events == [("modified", "w")]
        ctime = os.lstat(ops.layers.upper_dir / "w").st_ctime_ns
        again = await ops.setattr(a.st_ino, times, Times(), None, CTX)
        assert again.st_mtime_ns == 1_234_000_000_123
        assert os.lstat(ops.layers.upper_dir / "w").st_ctime_ns == ctime
        assert tracker.events == [("modified", "w")]

    run(main)


def test_root_mode(ops: OverlayOperations) -> None:
    attrs = run(lambda: ops.getattr(ROOT, CTX))
    assert attrs.st_mode & 0o7777 == 0o1777


def test_refresh_shows_new_lower_entries(ops: OverlayOperations, tmp_path: Path) -> None:
    async def main() -> None:
        assert (await ops.lookup(ROOT, b"late.txt", CTX)).st_ino == 0
        assert (await ops.lookup(ROOT, b"new", CTX)).st_ino == 0
        src = tmp_path / "late"
        src.write_bytes(b"late")
        ops.fetcher.files["f" * 64] = src  # type: ignore[attr-defined]
        ops.layers.lower.add(Entry("late.txt", "f" * 64, 4, 0o644, 1))  # type: ignore[attr-defined]
        ops.layers.lower.add(Entry("new/dir/f", "f" * 64, 4, 0o644, 1))  # type: ignore[attr-defined]
        # The negative entries on the way to the new paths are taken (to invalidate).
        assert sorted(ops._take_negatives(["late.txt", "new/dir/f", "d/g"])) == [
            (ROOT, b"late.txt"), (ROOT, b"new")]
        assert not ops._negative
        ops.lower_added(["late.txt", "new/dir/f"])
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


def test_directory_link_counts_exact_or_one(ops: OverlayOperations) -> None:
    """fuse mode counts subdirectories (2 + n); overlay mode's FUSE layer answers 1,
    as overlayfs shows merged directories, without listing anything to count."""
    async def nlinks() -> tuple[int, int]:
        d = await ops.lookup(ROOT, b"d", CTX)
        sub = await ops.lookup(d.st_ino, b"sub", CTX)
        return d.st_nlink, sub.st_nlink

    assert run(nlinks) == (3, 2)  # d holds one directory (sub), sub none
    ops.dir_nlink = False
    ops.layers._nlink.clear()
    counted = ops.layers.subdir_count
    ops.layers.subdir_count = lambda node: pytest.fail("listed to count")  # type: ignore[method-assign]
    try:
        assert run(nlinks) == (1, 1)
    finally:
        ops.layers.subdir_count = counted  # type: ignore[method-assign]
