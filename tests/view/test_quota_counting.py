"""The FUSE view counts each tenant's upper bytes and inodes (casfs.view.quota), driven
in-process: the live count always equals a scan of the upper, growth beyond a bound
is EDQUOT with nothing changed, removals give back, and one tenant's namespaces
share one count."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pyfuse3
import trio

from casfs.store.entry import Entry
from casfs.util.counters import Counters
from casfs.view import quota as vq
from casfs.view.lower import DictLowerTree
from casfs.view.ops import OverlayOperations
from casfs.view.testserve import RecordingTracker
from tests.view.test_ops_inprocess import Fetcher

CTX = pyfuse3.RequestContext()
ROOT = pyfuse3.ROOT_INODE
KB = 4096
LOWER = {"a.txt": b"alpha", "d/big": b"B" * 20_000, "d/g": b"gee"}


def make_ops(tmp: Path, quota: vq.TenantQuota, ns: str = "t~ns") -> OverlayOperations:
    tree = DictLowerTree()
    files: dict[str, Path] = {}
    for i, (rel, data) in enumerate(LOWER.items()):
        src = tmp / f"objects-{ns}" / str(i)
        src.parent.mkdir(exist_ok=True, parents=True)
        src.write_bytes(data)
        digest = f"{i:064x}"
        files[digest] = src
        tree.add(Entry(rel, digest, len(data), 0o644, 1_000_000_000 * (i + 1)))
    upper = quota.upper_root / ns
    upper.mkdir(parents=True, exist_ok=True)
    return OverlayOperations(tree, Fetcher(files), upper, RecordingTracker(), Counters(),
                             lower_timeout=3600, upper_timeout=1,
                             quota=quota.attach(ns, upper))


class SizeOnly:
    update_atime = update_mtime = update_mode = update_uid = update_gid = False
    update_ctime = False
    update_size = True


def tenant(tmp: Path, **kw: Any) -> vq.TenantQuota:
    root = tmp / "upper"
    root.mkdir(exist_ok=True)
    return vq.TenantQuota("t", root, max_bytes=kw.get("max_bytes"),
                          max_inodes=kw.get("max_inodes"), reserve=kw.get("reserve"))


async def ino_of(ops: OverlayOperations, path: str) -> int:
    ino = ROOT
    for part in path.split("/"):
        ino = (await ops.lookup(ino, part.encode(), CTX)).st_ino
    return ino


def refused(code: int) -> Any:
    class Check:
        def __enter__(self) -> None:
            pass

        def __exit__(self, typ: Any, exc: Any, tb: Any) -> bool:
            assert isinstance(exc, pyfuse3.FUSEError), f"expected errno {code}, got {exc!r}"
            assert exc.errno == code, (exc.errno, code)
            return True

    return Check()


def counted_like_a_scan(q: vq.TenantQuota, ns: str = "t~ns") -> None:
    found = vq.scan(q.upper_root / ns)
    assert (q.bytes, q.inodes) == (found.bytes, found.inodes)


def test_every_change_is_counted_as_a_scan_would(tmp_path: Path) -> None:
    q = tenant(tmp_path)
    ops = make_ops(tmp_path, q)
    check = lambda: counted_like_a_scan(q)  # noqa: E731

    async def main() -> None:
        fi, attrs = await ops.create(ROOT, b"n", 0o100644, os.O_WRONLY | os.O_CREAT, CTX)
        check()
        assert (q.bytes, q.inodes) == (0, 1)
        await ops.write(fi.fh, 0, b"x" * 5000)
        check()
        assert q.bytes == 2 * KB
        await ops.write(fi.fh, 100, b"y" * 10)  # inside: nothing grows
        await ops.release(fi.fh)
        check()
        await ops.mkdir(ROOT, b"dir", 0o755, CTX)
        dino = await ino_of(ops, "dir")
        await ops.symlink(dino, b"sym", b"../n", CTX)
        await ops.mknod(dino, b"fifo", 0o010644, 0, CTX)
        await ops.link(attrs.st_ino, dino, b"hard", CTX)  # one inode, counted once
        check()
        attr = pyfuse3.EntryAttributes()
        attr.st_size = 50_000
        fields: Any = SizeOnly()
        await ops.setattr(attrs.st_ino, attr, fields, None, CTX)  # truncate up
        check()
        attr.st_size = 10
        await ops.setattr(attrs.st_ino, attr, fields, None, CTX)  # and down
        check()
        big = await ino_of(ops, "d/big")
        fi = await ops.open(big, os.O_RDWR, CTX)  # copy-up: the copy is the tenant's
        check()
        await ops.release(fi.fh)
        g = await ino_of(ops, "d/g")
        fi = await ops.open(g, os.O_WRONLY | os.O_TRUNC, CTX)  # copy-up empty
        await ops.release(fi.fh)
        check()
        fi = await ops.open(big, os.O_WRONLY | os.O_TRUNC, CTX)  # an upper file truncated
        await ops.release(fi.fh)
        check()
        await ops.rename(ROOT, b"n", dino, b"hard", 0, CTX)  # over its own other name
        check()
        fi, _ = await ops.create(ROOT, b"over", 0o100644, os.O_WRONLY | os.O_CREAT, CTX)
        await ops.write(fi.fh, 0, b"z" * 9000)
        await ops.release(fi.fh)
        await ops.rename(ROOT, b"over", dino, b"hard", 0, CTX)  # replaces a file
        check()
        await ops.unlink(ROOT, b"a.txt", CTX)  # a whiteout: not counted
        d = await ino_of(ops, "d")
        await ops.unlink(d, b"big", CTX)  # its upper copy goes, a whiteout stays
        check()
        for name in (b"sym", b"fifo", b"hard"):
            await ops.unlink(dino, name, CTX)
        await ops.rmdir(ROOT, b"dir", CTX)
        check()

    trio.run(main)
    assert q.inodes == vq.scan(q.upper_root / "t~ns").inodes > 0  # d/ and d/g remain


def test_inode_bound_is_edquot_and_changes_nothing(tmp_path: Path) -> None:
    q = tenant(tmp_path, max_inodes=3)
    ops = make_ops(tmp_path, q)
    upper = q.upper_root / "t~ns"

    async def main() -> None:
        await ops.mkdir(ROOT, b"a", 0o755, CTX)
        fi, attrs = await ops.create(ROOT, b"f", 0o100644, os.O_WRONLY | os.O_CREAT, CTX)
        await ops.release(fi.fh)
        await ops.symlink(ROOT, b"s", b"f", CTX)
        events = list(ops.tracker.events)  # type: ignore[attr-defined]
        before = sorted(os.listdir(upper))
        with refused(errno.EDQUOT):
            await ops.create(ROOT, b"g", 0o100644, os.O_WRONLY | os.O_CREAT, CTX)
        with refused(errno.EDQUOT):
            await ops.mkdir(ROOT, b"b", 0o755, CTX)
        with refused(errno.EDQUOT):
            await ops.symlink(ROOT, b"t", b"f", CTX)
        with refused(errno.EDQUOT):
            await ops.mknod(ROOT, b"p", 0o010644, 0, CTX)
        with refused(errno.EDQUOT):  # a copy-up is a new inode too
            await ops.open(await ino_of(ops, "a.txt"), os.O_RDWR, CTX)
        with refused(errno.EDQUOT):  # and so is the upper directory a create under d/ needs
            await ops.create(await ino_of(ops, "d"), b"x", 0o100644, os.O_WRONLY | os.O_CREAT,
                             CTX)
        with refused(errno.EDQUOT):  # a name takes no inode, but counts as one
            await ops.link(attrs.st_ino, ROOT, b"hard", CTX)
        assert sorted(os.listdir(upper)) == sorted(before)
        assert ops.tracker.events[:len(events)] == events  # type: ignore[attr-defined]
        assert ops.layers.resolve("a.txt") is not None  # the lower file still shows
        assert (await ops.read((await ops.open(await ino_of(ops, "a.txt"), os.O_RDONLY,
                                               CTX)).fh, 0, 10)) == b"alpha"
        await ops.unlink(ROOT, b"s", CTX)  # removing gives back
        fi, _ = await ops.create(ROOT, b"g", 0o100644, os.O_WRONLY | os.O_CREAT, CTX)
        await ops.release(fi.fh)

    trio.run(main)
    counted_like_a_scan(q)
    assert q.refused == 7


def test_byte_bound_is_enospc_and_a_shrink_gives_back(tmp_path: Path) -> None:
    q = tenant(tmp_path, max_bytes=16 * KB)
    ops = make_ops(tmp_path, q)
    upper = q.upper_root / "t~ns"

    async def main() -> None:
        fi, attrs = await ops.create(ROOT, b"f", 0o100644, os.O_RDWR | os.O_CREAT, CTX)
        assert await ops.write(fi.fh, 0, b"a" * (12 * KB)) == 12 * KB
        with refused(errno.ENOSPC):  # 12 + 8 KiB > 16 KiB: nothing written
            await ops.write(fi.fh, 12 * KB, b"b" * (8 * KB))
        assert os.path.getsize(upper / "f") == 12 * KB
        assert await ops.write(fi.fh, 12 * KB, b"c" * (4 * KB)) == 4 * KB  # exactly full
        with refused(errno.ENOSPC):
            await ops.write(fi.fh, 16 * KB, b"d")
        with refused(errno.ENOSPC):  # sparse growth counts at its apparent size
            await ops.write(fi.fh, 1 << 30, b"d")
        attr = pyfuse3.EntryAttributes()
        fields: Any = SizeOnly()
        attr.st_size = 1 << 20
        with refused(errno.ENOSPC):
            await ops.setattr(attrs.st_ino, attr, fields, fi.fh, CTX)
        assert os.path.getsize(upper / "f") == 16 * KB
        big = await ino_of(ops, "d/big")
        with refused(errno.ENOSPC):  # copying 20 kB up does not fit
            await ops.open(big, os.O_RDWR, CTX)
        assert ops.layers.upper_stat("d/big") is None
        assert not any(os.scandir(ops.layers.work_dir))  # no staged copy left behind
        attr.st_size = 4 * KB
        await ops.setattr(attrs.st_ino, attr, fields, fi.fh, CTX)  # truncate down
        assert q.bytes == 4 * KB
        await ops.release(fi.fh)
        d = await ino_of(ops, "d")
        await ops.unlink(ROOT, b"f", CTX)
        assert q.bytes == 0
        fi = await ops.open(big, os.O_RDWR, CTX)  # now it fits (with its dir d/)
        await ops.release(fi.fh)
        assert d

    trio.run(main)
    counted_like_a_scan(q)


def test_a_removed_file_counts_until_its_last_handle_goes(tmp_path: Path) -> None:
    """Unlinking a file a job still holds frees nothing on disk: its charge stays until
    the last handle is released (else write, keep open, unlink, repeat fills the disk)."""
    q = tenant(tmp_path, max_bytes=32 * KB)
    ops = make_ops(tmp_path, q)

    async def main() -> None:
        fi, _ = await ops.create(ROOT, b"f", 0o100644, os.O_RDWR | os.O_CREAT, CTX)
        await ops.write(fi.fh, 0, b"a" * (16 * KB))
        await ops.unlink(ROOT, b"f", CTX)
        assert (q.bytes, q.inodes) == (16 * KB, 1)
        await ops.write(fi.fh, 16 * KB, b"b" * (8 * KB))  # still writable, still counted
        fi2, _ = await ops.create(ROOT, b"g", 0o100644, os.O_RDWR | os.O_CREAT, CTX)
        with refused(errno.ENOSPC):
            await ops.write(fi2.fh, 0, b"c" * (16 * KB))
        await ops.release(fi.fh)
        assert (q.bytes, q.inodes) == (0, 1)
        assert await ops.write(fi2.fh, 0, b"c" * (16 * KB)) == 16 * KB
        await ops.release(fi2.fh)

    trio.run(main)
    counted_like_a_scan(q)


def test_a_tenants_namespaces_share_one_bound(tmp_path: Path) -> None:
    q = tenant(tmp_path, max_bytes=64 * KB)
    other = vq.TenantQuota("o", tmp_path / "upper", max_bytes=64 * KB, max_inodes=None)
    a, b = make_ops(tmp_path, q, "t~a"), make_ops(tmp_path, q, "t~b")
    c = make_ops(tmp_path, other, "o~c")

    async def fill(ops: OverlayOperations, n: int) -> None:
        fi, _ = await ops.create(ROOT, b"f", 0o100644, os.O_RDWR | os.O_CREAT, CTX)
        try:
            await ops.write(fi.fh, 0, b"x" * n)
        finally:
            await ops.release(fi.fh)

    async def main() -> None:
        await fill(a, 40 * KB)
        with refused(errno.ENOSPC):
            await fill(b, 40 * KB)
        await fill(c, 40 * KB)  # another tenant's bound is its own

    trio.run(main)
    assert q.bytes == 40 * KB and other.bytes == 40 * KB
    # A new view of the tenant (a host restarted) finds the same usage by scanning.
    again = tenant(tmp_path, max_bytes=64 * KB)
    again.attach("t~a", again.upper_root / "t~a")
    assert (again.bytes, again.inodes) == (q.bytes, q.inodes)


def test_scan_counts_a_files_bytes_once_its_names_each_and_skips_whiteouts(
        tmp_path: Path) -> None:
    up = tmp_path / "u"
    (up / "d").mkdir(parents=True)
    (up / "d" / "f").write_bytes(b"x" * 5000)
    os.link(up / "d" / "f", up / "g")
    os.symlink("d/f", up / "s")
    os.mknod(up / "wh", 0o020000, os.makedev(0, 0))  # a whiteout
    use = vq.scan(up)
    assert (use.bytes, use.inodes) == (KB + 2 * KB, 4)  # d/, f (bytes once), g, s


class Fixed(vq.Reserve):
    """A reserve over a state filesystem whose free bytes the test sets (``left``)."""

    def __init__(self, path: Path, free: int, reserve: int) -> None:
        super().__init__(path, reserve)
        self.left = free

    def free(self) -> int:
        return self.left


def test_the_reserve_is_enospc_for_every_tenant(tmp_path: Path) -> None:
    res = Fixed(tmp_path, free=100 * KB, reserve=64 * KB)
    q = tenant(tmp_path, reserve=res)
    ops = make_ops(tmp_path, q)

    async def main() -> None:
        fi, _ = await ops.create(ROOT, b"f", 0o100644, os.O_RDWR | os.O_CREAT, CTX)
        await ops.write(fi.fh, 0, b"a" * (32 * KB))
        res.left = 70 * KB  # the disk filled meanwhile (whoever wrote)
        res._at = -1e9  # asked again now, not in a second
        with refused(errno.ENOSPC):
            await ops.write(fi.fh, 32 * KB, b"b" * (8 * KB))
        await ops.release(fi.fh)

    trio.run(main)
    assert q.bytes == 32 * KB and q.refused == 1


def test_scan_leaves_directory_access_times_alone(tmp_path: Path) -> None:
    """Counting a tenant's uppers lists a job's directories (another namespace's too, from
    any mount process of the tenant): an atime the job set, older than a day, must not
    jump to "now" under relatime (a POSIX conformance run caught it in overlay mode)."""
    from casfs.view.quota import scan

    d = tmp_path / "upper" / "ld"
    d.mkdir(parents=True)
    (d / "f").write_bytes(b"x" * 10)
    old = (1_200_000_000_987_654_321, 1_000_000_000_123_456_789)
    os.utime(d, ns=old)
    assert scan(tmp_path / "upper").inodes == 2
    st = os.lstat(d)
    assert (st.st_atime_ns, st.st_mtime_ns) == old


def test_a_long_symlink_counts_its_block_against_the_bound_and_the_reserve(
        tmp_path: Path) -> None:
    """A symlink whose target does not fit in its inode takes a block of the state
    filesystem: a review filled one past its reserve with 65,000 of them (4,000-byte
    targets), each charged an inode and no byte. Now charged like the block it takes."""
    res = Fixed(tmp_path, free=1 << 30, reserve=64 * KB)
    q = tenant(tmp_path, max_bytes=3 * vq.BLOCK, reserve=res)
    ops = make_ops(tmp_path, q)
    long = b"x" * 4000

    async def main() -> None:
        await ops.symlink(ROOT, b"short", b"y" * vq.INLINE_LINK, CTX)  # in its inode
        assert (q.bytes, q.inodes) == (0, 1)
        await ops.symlink(ROOT, b"l1", long, CTX)
        await ops.symlink(ROOT, b"l2", long, CTX)
        assert (q.bytes, q.inodes) == (2 * vq.BLOCK, 3)
        counted_like_a_scan(q)
        with refused(errno.ENOSPC):  # the tenant's byte bound
            for i in range(2):
                await ops.symlink(ROOT, f"more{i}".encode(), long, CTX)
        assert q.bytes == 3 * vq.BLOCK
        await ops.unlink(ROOT, b"l1", CTX)
        counted_like_a_scan(q)
        res.left = 64 * KB + 100  # the disk filled meanwhile: below the reserve
        res._at = -1e9
        with refused(errno.ENOSPC):
            await ops.symlink(ROOT, b"l3", long, CTX)

    trio.run(main)
    assert q.bytes == 2 * vq.BLOCK and q.inodes == 3
