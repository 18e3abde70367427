"""MuxOperations driven in-process: routing, the inode partition, handles, detach."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pyfuse3
import pytest
import trio

from casfs.util.counters import Counters
from casfs.view.lower import DictLowerTree
from casfs.view.mux import SLOT_BITS, MuxOperations, ns_root_inode, slot_of
from casfs.view.ops import OverlayOperations
from casfs.view.testserve import RecordingTracker

CTX = pyfuse3.RequestContext()
ROOT = pyfuse3.ROOT_INODE


class NoFetch:
    def fetch(self, entry: object) -> str:
        raise AssertionError("no lower entries here")

    def cached(self, entry: object) -> str | None:
        return None

    def open_cached(self, entry: object) -> int | None:
        return None  # always through fetch (the threaded path)


    def release_cached(self, digest: str, fd: int) -> None:
        os.close(fd)
        self.unpin(digest)

    def unpin(self, digest: str) -> None:
        pass


def make_ops(tmp: Path, name: str) -> OverlayOperations:
    upper = tmp / name
    upper.mkdir()
    return OverlayOperations(DictLowerTree(), NoFetch(), upper, RecordingTracker(), Counters())


async def lookup_path(mux: MuxOperations, path: str) -> pyfuse3.EntryAttributes:
    ino, attrs = ROOT, None
    for part in path.split("/"):
        attrs = await mux.lookup(ino, part.encode(), CTX)
        ino = attrs.st_ino
    assert attrs is not None
    return attrs


def test_routing_partition_handles_and_detach(tmp_path: Path) -> None:
    mux = MuxOperations()
    a, b = make_ops(tmp_path, "a"), make_ops(tmp_path, "b")
    sa = mux.attach("u1", "alpha", a)
    sb = mux.attach("u1", "beta", b)
    assert (sa, sb) == (1, 2)
    with pytest.raises(ValueError):
        mux.attach("u1", "alpha", make_ops(tmp_path, "c"))
    with pytest.raises(ValueError):
        mux.attach("u1", "../x", make_ops(tmp_path, "d"))

    async def main() -> None:
        # Synthetic levels: the base lists tenants, a tenant lists its namespaces.
        t = await mux.lookup(ROOT, b"u1", CTX)
        assert slot_of(t.st_ino) == 0
        ra = await mux.lookup(t.st_ino, b"alpha", CTX)
        assert ra.st_ino == ns_root_inode(sa)
        with pytest.raises(pyfuse3.FUSEError) as e:
            await mux.mkdir(t.st_ino, b"new", 0o755, CTX)
        assert e.value.errno == errno.EACCES  # the synthetic levels are read-only

        # Files are created in their own namespace, with inodes in its range.
        fa, attrs = await mux.create(ra.st_ino, b"f", 0o644, os.O_RDWR | os.O_CREAT, CTX)
        assert slot_of(attrs.st_ino) == sa and attrs.st_ino >> SLOT_BITS == sa
        assert await mux.write(fa.fh, 0, b"alpha bytes") == 11
        await mux.release(fa.fh)
        assert (tmp_path / "a" / "f").read_bytes() == b"alpha bytes"
        rb = await lookup_path(mux, "u1/beta")
        fb, battrs = await mux.create(rb.st_ino, b"f", 0o644, os.O_RDWR | os.O_CREAT, CTX)
        assert battrs.st_ino != attrs.st_ino  # same name, same inner number, other slot
        await mux.release(fb.fh)
        with pytest.raises(pyfuse3.FUSEError) as e:
            await mux.rename(ra.st_ino, b"f", rb.st_ino, b"g", 0, CTX)
        assert e.value.errno == errno.EXDEV

        # A handle opened before a detach still reads and releases on its operations.
        fi = await mux.open(attrs.st_ino, 0, CTX)
        assert mux.detach("u1", "alpha") is a
        assert await mux.read(fi.fh, 0, 5) == b"alpha"
        await mux.release(fi.fh)
        # Any other request for the detached namespace's inodes is a miss.
        with pytest.raises(pyfuse3.FUSEError) as e:
            await mux.getattr(attrs.st_ino, CTX)
        assert e.value.errno == errno.ENOENT
        with pytest.raises(pyfuse3.FUSEError) as e:
            await mux.lookup(t.st_ino, b"alpha", CTX)
        assert e.value.errno == errno.ENOENT
        # Re-attached, it gets a new slot: old kernel inodes can never reach it.
        sa2 = mux.attach("u1", "alpha", make_ops(tmp_path, "a2"))
        assert sa2 == 3
        with pytest.raises(pyfuse3.FUSEError):
            await mux.getattr(attrs.st_ino, CTX)
        assert mux.served() == [("u1", "alpha"), ("u1", "beta")]

    trio.run(main)
