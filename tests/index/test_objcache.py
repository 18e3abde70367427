from __future__ import annotations

import itertools
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import pytest
from blake3 import blake3
from waiting import wait_until

from casfs.errors import CasfsError, CorruptObjectError, ObjectMissingError
from casfs.index import objcache
from casfs.index.node_index import NodeIndex
from casfs.index.objcache import LocalObjectCache, fill_file, object_path
from casfs.store.entry import Entry
from casfs.util.counters import Counters


class FakeSource:
    """Serves bytes by digest; can block until released, or fail."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.calls: list[str] = []
        self.gate: threading.Event | None = None
        self.error: Exception | None = None
        self.short = False

    def add(self, data: bytes) -> Entry:
        digest = blake3(data).hexdigest()
        self.objects[digest] = data
        return Entry(f"f/{digest[:8]}", digest, len(data), 0o644, 0)

    def get_into(self, digest: str, expected_size: int | None, out: BinaryIO) -> int:
        self.calls.append(digest)
        if self.gate is not None:
            assert self.gate.wait(60), "test never released the source"
        if self.error is not None:
            out.write(b"partial")
            raise self.error
        if digest not in self.objects:
            raise ObjectMissingError(f"object {digest} is missing")
        data = self.objects[digest][:-1] if self.short else self.objects[digest]
        out.write(data)
        return len(data)


@pytest.fixture
def index(tmp_path: Path) -> Iterator[NodeIndex]:
    ix = NodeIndex.open(tmp_path / "state")
    yield ix
    ix.close()


@pytest.fixture
def source() -> FakeSource:
    return FakeSource()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A strictly increasing time_ns, so LRU order never depends on clock resolution."""
    ticks = itertools.count(1_000_000)
    monkeypatch.setattr(time, "time_ns", lambda: next(ticks))


def make_cache(
    tmp_path: Path, index: NodeIndex, source: FakeSource, cap: int = 1 << 30
) -> LocalObjectCache:
    return LocalObjectCache(tmp_path / "state" / "objects", index, source, cap)


def no_temp_files(cache: LocalObjectCache) -> bool:
    return not [p for p in cache.directory.rglob(".tmp-*")]


def _waiters(cache: LocalObjectCache, digest: str) -> int:
    fill = cache._fills.get(digest)
    return fill.waiters if fill is not None else -1


def test_fill_then_hit(tmp_path: Path, index: NodeIndex, source: FakeSource) -> None:
    cache = make_cache(tmp_path, index, source)
    entry = source.add(b"kernel bytes" * 100)
    path = cache.fetch(entry)
    assert Path(path).read_bytes() == source.objects[entry.digest]
    assert Path(path) == cache.directory / entry.digest[:2] / entry.digest[2:]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o444
    assert cache.pinned(entry.digest) == 1
    assert cache.fetch(entry) == path
    assert source.calls == [entry.digest]  # the second fetch was a hit
    assert cache.pinned(entry.digest) == 2
    cache.unpin(entry.digest)
    cache.unpin(entry.digest)
    assert cache.pinned(entry.digest) == 0
    assert index.cache_bytes() == entry.size
    assert index.cache_get(entry.digest) is not None
    assert no_temp_files(cache)


def test_concurrent_fetches_coalesce_into_one_fill(
    tmp_path: Path, index: NodeIndex, source: FakeSource
) -> None:
    cache = make_cache(tmp_path, index, source)
    entry = source.add(b"x" * 100_000)
    source.gate = threading.Event()
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.fetch(entry))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    wait_until(lambda: cache.pinned(entry.digest) == 8 and source.calls, "8 fetchers waiting",
               interval=0.001)
    source.gate.set()
    for t in threads:
        t.join()
    assert source.calls == [entry.digest]
    assert len(results) == 8 and len(set(results)) == 1
    assert Path(results[0]).read_bytes() == source.objects[entry.digest]


def test_fill_error_reaches_every_waiter_and_is_not_cached(
    tmp_path: Path, index: NodeIndex, source: FakeSource
) -> None:
    cache = make_cache(tmp_path, index, source)
    entry = source.add(b"y" * 1000)
    source.gate = threading.Event()
    source.error = CorruptObjectError("bad frame")
    errors: list[BaseException] = []

    def fetch() -> None:
        try:
            cache.fetch(entry)
        except CasfsError as e:
            errors.append(e)

    threads = [threading.Thread(target=fetch) for _ in range(5)]
    for t in threads:
        t.start()
    # every fetcher must be waiting on the one fill before it fails
    wait_until(lambda: _waiters(cache, entry.digest) == 4, "4 fetchers waiting on 1 fill",
               interval=0.001)
    source.gate.set()
    for t in threads:
        t.join()
    assert len(errors) == 5 and all(isinstance(e, CorruptObjectError) for e in errors)
    assert len(source.calls) == 1
    assert cache.pinned(entry.digest) == 0
    assert not cache.path_of(entry.digest).exists() and no_temp_files(cache)

    source.error = None  # the failure was not remembered: the next fetch fills
    source.gate = None
    assert Path(cache.fetch(entry)).read_bytes() == source.objects[entry.digest]
    assert len(source.calls) == 2


def test_missing_and_short_objects_are_errors(
    tmp_path: Path, index: NodeIndex, source: FakeSource
) -> None:
    cache = make_cache(tmp_path, index, source)
    with pytest.raises(ObjectMissingError):
        cache.ensure_file("ab" * 32, 3)
    entry = source.add(b"z" * 50)
    source.short = True
    with pytest.raises(CorruptObjectError):
        cache.fetch(entry)
    assert not cache.path_of(entry.digest).exists() and no_temp_files(cache)
    with pytest.raises(CorruptObjectError):
        cache.ensure_file("../../etc/passwd", 1)
    assert index.cache_bytes() == 0


@pytest.mark.expect_log(r"cached object .* has \d+ bytes, expected \d+: refetching")
def test_wrong_size_local_file_is_refetched(
    tmp_path: Path, index: NodeIndex, source: FakeSource
) -> None:
    cache = make_cache(tmp_path, index, source)
    entry = source.add(b"good content" * 10)
    path = Path(cache.fetch(entry))
    cache.unpin(entry.digest)
    os.chmod(path, 0o644)
    path.write_bytes(b"torn")  # e.g. a crash after rename without fsync
    assert Path(cache.fetch(entry)).read_bytes() == source.objects[entry.digest]
    assert len(source.calls) == 2


@pytest.mark.usefixtures("clock")
def test_eviction_is_lru_and_never_removes_pinned(
    tmp_path: Path, index: NodeIndex, source: FakeSource
) -> None:
    cache = make_cache(tmp_path, index, source, cap=10_000)
    a, b, c = (source.add(bytes([i]) * 3000) for i in range(3))
    for x in (a, b, c):
        cache.fetch(x)
        cache.unpin(x.digest)
    cache.fetch(a)  # a becomes most recently used
    cache.unpin(a.digest)
    assert index.cache_bytes() == 9000

    freed = cache.evict(6000)
    assert freed == 3000
    assert not cache.path_of(b.digest).exists()  # b was least recently used
    assert cache.path_of(a.digest).exists() and cache.path_of(c.digest).exists()
    assert index.cache_bytes() == 6000

    cache.fetch(c)  # pinned: must survive even an eviction to zero
    assert cache.evict(0) == 3000
    assert not cache.path_of(a.digest).exists()
    assert cache.path_of(c.digest).exists()
    assert index.cache_bytes() == 3000
    cache.unpin(c.digest)
    assert cache.evict(0) == 3000
    assert index.cache_bytes() == 0


@pytest.mark.usefixtures("clock")
def test_fill_over_cap_evicts_to_low_water(
    tmp_path: Path, index: NodeIndex, source: FakeSource
) -> None:
    cache = make_cache(tmp_path, index, source, cap=10_000)
    entries = [source.add(bytes([i]) * 3000) for i in range(4)]
    for x in entries[:3]:
        cache.fetch(x)
        cache.unpin(x.digest)
    held = cache.fetch(entries[3])  # 12,000 > cap: the oldest goes, the new one is pinned
    assert index.cache_bytes() <= 10_000
    assert not cache.path_of(entries[0].digest).exists()
    assert Path(held).exists()


def test_hardlink_or_copy(tmp_path: Path, index: NodeIndex, source: FakeSource) -> None:
    cache = make_cache(tmp_path, index, source)
    entry = source.add(b"shared object")
    src = cache.ensure_file(entry.digest, entry.size)
    dest = tmp_path / "lower" / "x.so"
    dest.parent.mkdir()
    assert cache.hardlink_or_copy(entry.digest, dest) is True
    assert os.stat(dest).st_ino == os.stat(src).st_ino
    with pytest.raises(ObjectMissingError):
        cache.hardlink_or_copy("cd" * 32, tmp_path / "lower" / "y")


def test_readonly_index_serves_without_accounting(
    tmp_path: Path, index: NodeIndex, source: FakeSource
) -> None:
    entry = source.add(b"data")
    with NodeIndex.open(tmp_path / "state", readonly=True) as ro:
        assert ro.env is index.env  # one environment per process: shared, read-write
    ro_cache_dir = tmp_path / "other"
    NodeIndex.open(ro_cache_dir).close()
    with NodeIndex.open(ro_cache_dir, readonly=True) as ro:
        cache = LocalObjectCache(ro_cache_dir / "objects", ro, source, 1)
        assert Path(cache.fetch(entry)).read_bytes() == b"data"
        assert ro.cache_bytes() == 0


def _flip_a_bit(path: str) -> None:
    """Damage a cache file in place, keeping its size (a bad disk sector, a stray write)."""
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0x01]))
    os.chmod(path, 0o444)


@pytest.mark.expect_log(r"cached object .* does not hash to its name: removing, refetching")
def test_bit_flip_in_a_cached_file_is_found_on_first_open_of_a_mount(
    tmp_path: Path, index: NodeIndex, source: FakeSource
) -> None:
    """I1: a cache file of the right size whose bytes changed is hashed on its first
    open by a new mount (a new cache instance), removed and refetched."""
    entry = source.add(b"kernel bytes" * 1000)
    first = make_cache(tmp_path, index, source)
    path = first.fetch(entry)
    first.unpin(entry.digest)
    _flip_a_bit(path)
    counters = Counters()
    later = LocalObjectCache(tmp_path / "state" / "objects", index, source, 1 << 30,
                             counters=counters)
    assert later.cached(entry) is None  # never verified by this mount: not served inline
    assert Path(later.fetch(entry)).read_bytes() == source.objects[entry.digest]
    assert source.calls == [entry.digest, entry.digest]  # refetched
    assert counters.get("cache_damaged") == 1
    later.unpin(entry.digest)
    assert later.cached(entry) == path  # verified now: the warm path is inline again
    later.unpin(entry.digest)


@pytest.mark.expect_log(r"cached object .* does not hash to its name: removing, refetching")
def test_a_cached_file_changed_under_a_mount_is_hashed_again(
    tmp_path: Path, index: NodeIndex, source: FakeSource
) -> None:
    """I1: a verified file whose identity (inode, mtime, size) changes is not trusted."""
    entry = source.add(b"x" * 5000)
    counters = Counters()
    cache = LocalObjectCache(tmp_path / "state" / "objects", index, source, 1 << 30,
                             counters=counters)
    path = cache.fetch(entry)
    cache.unpin(entry.digest)
    assert cache.cached(entry) == path  # a fill is trusted without hashing again
    cache.unpin(entry.digest)
    assert counters.get("cache_verified") == 0
    _flip_a_bit(path)
    os.utime(path, ns=(1, 1))  # a different mtime even on coarse clocks
    assert cache.cached(entry) is None
    assert Path(cache.fetch(entry)).read_bytes() == source.objects[entry.digest]
    assert counters.get("cache_verified") == 1 and counters.get("cache_damaged") == 1
    cache.unpin(entry.digest)


def test_an_intact_cached_file_is_hashed_once_per_mount(
    tmp_path: Path, index: NodeIndex, source: FakeSource
) -> None:
    entry = source.add(b"y" * 5000)
    make_cache(tmp_path, index, source).fetch(entry)
    counters = Counters()
    cache = LocalObjectCache(tmp_path / "state" / "objects", index, source, 1 << 30,
                             counters=counters)
    for _ in range(3):
        cache.fetch(entry)
        cache.unpin(entry.digest)
    assert counters.get("cache_verified") == 1 and counters.get("cache_damaged") == 0
    assert source.calls == [entry.digest]  # never refetched


@pytest.mark.expect_log(r"cached object .* is not a regular file: removing, refetching")
def test_open_cached_serves_only_trusted_regular_files(
    tmp_path: Path, index: NodeIndex, source: FakeSource
) -> None:
    """The warm open's shortcut: a pinned fd of a file this cache trusts, else None
    (absent, never verified by this instance, changed since, not a regular file)."""
    entry = source.add(b"z" * 5000)
    cache = make_cache(tmp_path, index, source)
    assert cache.open_cached(entry) is None and cache.pinned(entry.digest) == 0  # absent
    path = cache.fetch(entry)
    cache.unpin(entry.digest)
    fd = cache.open_cached(entry)
    assert fd is not None and cache.pinned(entry.digest) == 1
    assert os.pread(fd, 10, 0) == b"z" * 10
    cache.release_cached(entry.digest, fd)
    assert cache.pinned(entry.digest) == 0 and cache.shared_fds() == (1, 1)  # kept, idle
    later = make_cache(tmp_path, index, source)  # a new mount: not verified by it yet
    assert later.open_cached(entry) is None and later.pinned(entry.digest) == 0
    os.utime(path, ns=(1, 1))  # changed under the first cache: hashed again first
    assert cache.open_cached(entry) is None and cache.pinned(entry.digest) == 0
    assert cache.shared_fds() == (0, 0)  # its idle fd closed
    os.unlink(path)
    os.mkdir(path)  # not a regular file: left to the slow path, which repairs it
    cache._remember(entry.digest)
    assert cache.open_cached(entry) is None and cache.pinned(entry.digest) == 0
    assert Path(cache.fetch(entry)).read_bytes() == source.objects[entry.digest]
    cache.unpin(entry.digest)


class BatchFiller:
    """A fetch worker stand-in with fill_many (one request, each object answered)."""

    def __init__(self, directory: Path, source: FakeSource) -> None:
        self.directory = directory
        self.source = source
        self.batches: list[list[str]] = []
        self.gate: threading.Event | None = None
        self.fail: set[str] = set()  # answered with an error
        self.damage: set[str] = set()  # answered ok, but the file holds other bytes

    def _write(self, digest: str, size: int) -> tuple[int, int, int]:
        fill_file(self.directory, self.source, digest, size)
        st = os.lstat(object_path(self.directory, digest))
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def fill_cache(self, digest: str, size: int, progressed: Callable[[], None]
                   ) -> tuple[int, int, int] | None:
        return self._write(digest, size)

    def fill_many(self, items: list[tuple[str, int]], progressed: Callable[[], None],
                  done: Callable[[str, tuple[int, int, int] | None, BaseException | None],
                                 None]) -> None:
        self.batches.append([d for d, _ in items])
        if self.gate is not None:
            assert self.gate.wait(60), "test never released the batch"
        for digest, size in items:
            if digest in self.fail:
                done(digest, None, ObjectMissingError(f"object {digest} is missing"))
                continue
            ident = self._write(digest, size)
            if digest in self.damage:
                path = object_path(self.directory, digest)
                other = path.with_name("other")
                other.write_bytes(b"Z" * size)
                os.replace(other, path)  # same size, other bytes: another inode
            done(digest, ident, None)


def test_fill_many_is_one_request_and_its_files_are_trusted(
        tmp_path: Path, index: NodeIndex, source: FakeSource) -> None:
    counters = Counters()
    directory = tmp_path / "state" / "objects"
    filler = BatchFiller(directory, source)
    cache = LocalObjectCache(directory, index, source, 1 << 30, filler=filler,
                             counters=counters)
    entries = [source.add(bytes([i]) * (1000 + i)) for i in range(4)]
    cache.fetch(entries[0])  # local already: fill_many skips it
    cache.unpin(entries[0].digest)
    assert cache.fill_many([(e.digest, e.size) for e in entries]) == (3, 0)
    assert filler.batches == [[e.digest for e in entries[1:]]]
    for e in entries:
        fd = cache.open_cached(e)  # trusted without hashing: the filler verified them
        assert fd is not None
        assert os.read(fd, 1 << 20) == source.objects[e.digest]
        os.close(fd)
        cache.unpin(e.digest)
    assert "cache_verified" not in counters.snapshot()
    assert index.cache_bytes() == sum(e.size for e in entries)


def test_a_job_waiting_on_a_failed_read_ahead_fetches_itself(
        tmp_path: Path, index: NodeIndex, source: FakeSource) -> None:
    directory = tmp_path / "state" / "objects"
    filler = BatchFiller(directory, source)
    cache = LocalObjectCache(directory, index, source, 1 << 30, filler=filler)
    bad, good = source.add(b"b" * 3000), source.add(b"g" * 2000)
    filler.fail, filler.gate = {bad.digest}, threading.Event()
    result: list[tuple[int, int]] = []
    ra = threading.Thread(target=lambda: result.append(
        cache.fill_many([(bad.digest, bad.size), (good.digest, good.size)])))
    ra.start()
    wait_until(lambda: filler.batches, "the read-ahead's request")
    got: list[str] = []
    job = threading.Thread(target=lambda: got.append(cache.fetch(bad)))
    job.start()
    wait_until(lambda: _waiters(cache, bad.digest) == 1, "the job waiting on the read-ahead")
    filler.gate.set()
    ra.join()
    job.join()
    assert result == [(1, 1)]
    assert Path(got[0]).read_bytes() == source.objects[bad.digest]  # its own fill


@pytest.mark.expect_log(r"cached object .* does not hash to its name: removing, refetching")
def test_a_read_ahead_file_with_other_bytes_is_never_trusted(
        tmp_path: Path, index: NodeIndex, source: FakeSource) -> None:
    counters = Counters()
    directory = tmp_path / "state" / "objects"
    filler = BatchFiller(directory, source)
    cache = LocalObjectCache(directory, index, source, 1 << 30, filler=filler,
                             counters=counters)
    e = source.add(b"k" * 4000)
    filler.damage = {e.digest}
    assert cache.fill_many([(e.digest, e.size)]) == (0, 1)
    assert counters.snapshot()["cache_damaged"] == 1  # hashed: not the worker's file
    assert not cache.path_of(e.digest).exists()
    assert cache.open_cached(e) is None
    assert Path(cache.fetch(e)).read_bytes() == source.objects[e.digest]


def test_a_pack_member_a_job_is_fetching_is_not_adopted_by_the_read_ahead(
        tmp_path: Path, index: NodeIndex, source: FakeSource) -> None:
    """adopt() says whether it took the file: the mount counts only those as fetched
    (a one-member pack's read-ahead racing the job's own fetch counted it twice)."""
    directory = tmp_path / "state" / "objects"
    filler = BatchFiller(directory, source)
    cache = LocalObjectCache(directory, index, source, 1 << 30, filler=filler)
    busy, other = source.add(b"k" * 300), source.add(b"o" * 200)
    ungated = FakeSource()
    ungated.objects = dict(source.objects)
    answers: list[bool] = []

    def fill_many(items: list[tuple[str, int]], progressed: Callable[[], None],
                  done: Callable[..., None], packs: list[str] | None = None,
                  adopt: Callable[[str, int, tuple[int, int, int]], bool] | None = None
                  ) -> None:
        assert adopt is not None and packs == ["p"]
        answers.append(adopt(busy.digest, busy.size, (1, 2, 3)))  # the job's fill runs
        fill_file(directory, ungated, other.digest, other.size)  # the worker's write
        st = os.lstat(object_path(directory, other.digest))
        answers.append(adopt(other.digest, other.size, (st.st_ino, st.st_mtime_ns,
                                                         st.st_size)))

    filler.fill_many = fill_many  # type: ignore[method-assign]
    source.gate = threading.Event()
    got: list[str] = []
    job = threading.Thread(target=lambda: got.append(cache.fetch(busy)))
    job.start()
    wait_until(lambda: source.calls == [busy.digest], "the job's own fetch in flight")
    assert cache.fill_many([], ["p"]) == (1, 0)
    source.gate.set()
    job.join()
    assert answers == [False, True]
    assert Path(got[0]).read_bytes() == source.objects[busy.digest]


def test_idle_shared_fds_are_bounded_by_count_and_bytes(
        tmp_path: Path, index: NodeIndex, source: FakeSource,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle fds kept after release stay within both bounds (another process may evict
    an object an idle fd holds: its space stays in use until the fd is closed)."""
    import casfs.index.objcache as objcache
    from casfs.util.shares import EvenShares

    monkeypatch.setattr(objcache, "SHARED_IDLE_BYTES", 2500)
    monkeypatch.setattr(objcache, "_IDLE_SHARES", EvenShares())  # no other test's caches
    cache = make_cache(tmp_path, index, source)
    entries = [source.add(bytes([i]) * 1000) for i in range(5)]
    for e in entries:
        cache.fetch(e)
        cache.unpin(e.digest)
    for e in entries:
        fd = cache.open_cached(e)
        assert fd is not None
        assert os.pread(fd, 2000, 0) == source.objects[e.digest]
        cache.release_cached(e.digest, fd)
    assert cache.shared_fds() == (2, 2)  # 2 x 1000 bytes <= 2500 < 3 x 1000
    cache.idle_fds = 1
    again = cache.open_cached(entries[4])  # the newest idle one, shared again
    assert again is not None and cache.shared_fds() == (2, 1)
    cache.release_cached(entries[4].digest, again)
    assert cache.shared_fds() == (1, 1)  # over the count bound: the oldest idle one closed
    cache.close()
    assert cache.shared_fds() == (0, 0)


def test_the_caches_of_one_process_share_its_idle_fd_bound(
        tmp_path: Path, index: NodeIndex, source: FakeSource,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A mount process serves a namespace per cache family, each with its own cache:
    the idle fds they keep together stay within the process's bound (each cache
    keeping the whole bound once ran a ten-family process out of fds)."""
    import casfs.index.objcache as objcache
    from casfs.util.shares import EvenShares

    monkeypatch.setattr(objcache, "_IDLE_SHARES", EvenShares())
    caches = [LocalObjectCache(tmp_path / f"objects{i}", index, source, 1 << 30)
              for i in range(2)]
    entries = [source.add(bytes([i]) * 100) for i in range(6)]

    def keep_idle(cache: LocalObjectCache) -> None:
        cache.idle_fds = 4  # the process's bound
        for e in entries:
            cache.fetch(e)
            cache.unpin(e.digest)
        for e in entries:
            fd = cache.open_cached(e)
            assert fd is not None
            cache.release_cached(e.digest, fd)

    for c in caches:
        keep_idle(c)
    assert [c.shared_fds() for c in caches] == [(2, 2), (2, 2)]  # half of 4 each
    caches[1].close()  # a namespace released: the other may keep the whole bound
    keep_idle(caches[0])
    assert caches[0].shared_fds() == (4, 4)


@pytest.mark.parametrize("size", [0, 1, 16_000, objcache.MAP_ABOVE, objcache.MAP_ABOVE + 1,
                                  3 * objcache.MAP_ABOVE + 5])
def test_hash_file_reads_small_files_and_maps_large_ones(tmp_path: Path, size: int) -> None:
    """The first-open check's hash: the file's blake3 and the identity hashed, whether it
    was read (most cache files) or mapped (above MAP_ABOVE)."""
    data = os.urandom(size)
    path = tmp_path / "obj"
    path.write_bytes(data)
    digest, st = objcache.hash_file(path)
    assert digest == blake3(data).hexdigest()
    assert (st.st_ino, st.st_size) == (path.stat().st_ino, size)


def test_a_fills_done_event_wakes_waiters_before_and_after_it_is_set() -> None:
    """_Done makes its Event only for a waiter: one waiting when it is set wakes, one
    coming after returns at once, and a wait with a timeout ends unset."""
    d = objcache._Done()
    assert not d.is_set() and d.wait(0.01) is False
    woke: list[bool] = []
    t = threading.Thread(target=lambda: woke.append(d.wait(10)))
    t.start()
    while d._event is None:  # the waiter made its Event
        threading.Event().wait(0.001)
    d.set()
    t.join(10)
    assert woke == [True] and d.is_set() and d.wait() is True
    late = objcache._Done()
    late.set()
    assert late.wait(0) is True and late._event is None  # no Event for nobody
