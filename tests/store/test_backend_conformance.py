"""One conformance suite for every storage backend: backends are interchangeable.

docs/architecture.md: the storage backend is a narrow protocol
(casfs/store/backend.py) with one conformance suite.

Add a backend by adding a factory to BACKENDS; every test below then runs against it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from casfs.store.backend import Backend, LocalBackend


def _local(tmp_path: Path) -> Backend:
    root = tmp_path / "root"
    (root / "tmp").mkdir(parents=True)
    return LocalBackend(root)


def _s3(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    from casfs.store.s3backend import S3Backend
    from casfs.util.location import S3Location, parse_location

    loc = parse_location(request.getfixturevalue("s3_url"))
    assert isinstance(loc, S3Location)
    return S3Backend(loc, staging_dir=tmp_path / "staging")


BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], Backend]] = {
    "local": lambda request, tmp_path: _local(tmp_path),
    "s3": _s3,  # a real SeaweedFS server (tests/seaweed.py)
}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return BACKENDS[request.param](request, tmp_path)


def _stage(backend: Backend, data: bytes) -> Path:
    backend.staging_dir.mkdir(parents=True, exist_ok=True)
    p = backend.staging_dir / f"staged-{time.monotonic_ns()}-{threading.get_ident()}"
    p.write_bytes(data)
    return p


def _read(backend: Backend, key: str) -> bytes:
    with backend.open(key) as f:
        return f.read()


def test_put_if_absent_creates_then_refuses(backend: Backend) -> None:
    first = _stage(backend, b"one")
    assert backend.put_if_absent("objects/ab/cdef", first) is True
    assert not first.exists()  # staged file consumed
    second = _stage(backend, b"two")
    assert backend.put_if_absent("objects/ab/cdef", second) is False
    assert not second.exists()  # consumed even when the key existed
    assert _read(backend, "objects/ab/cdef") == b"one"  # never overwritten


def test_put_if_absent_concurrent_single_winner(backend: Backend) -> None:
    results: list[bool] = []
    staged = [_stage(backend, f"writer {i}".encode()) for i in range(8)]

    def put(p: Path) -> None:
        results.append(backend.put_if_absent("objects/cd/race", p))

    threads = [threading.Thread(target=put, args=(p,)) for p in staged]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    assert _read(backend, "objects/cd/race").startswith(b"writer ")
    assert list(backend.list("tmp")) == []


def test_create_exclusive(backend: Backend) -> None:
    key = "namespaces/ns/generations/000000000001"
    assert backend.create_exclusive(key, b"record 1") is True
    assert backend.create_exclusive(key, b"record 1 again") is False
    assert _read(backend, key) == b"record 1"
    assert list(backend.list("tmp")) == []  # no staging left behind either way


def test_open_missing_raises_file_not_found(backend: Backend) -> None:
    with pytest.raises(FileNotFoundError):
        backend.open("objects/00/missing")


def test_info(backend: Backend) -> None:
    assert backend.info("objects/00/none") is None
    before = time.time()
    assert backend.create_exclusive("objects/aa/bb", b"12345")
    info = backend.info("objects/aa/bb")
    assert info is not None and info.size == 5
    assert abs(info.mtime - before) < 600  # a creation time gc's grace can use
    backend.touch("objects/aa/absent")  # best effort (a no-op on S3): no error
    assert backend.info("objects/aa/absent") is None


def test_read_range(backend: Backend) -> None:
    data = bytes(range(256)) * 8
    assert backend.create_exclusive("packs/ab/cd", data)
    assert backend.read_range("packs/ab/cd", 100, 50) == data[100:150]
    assert backend.read_range("packs/ab/cd", len(data) - 10, 10) == data[-10:]
    assert backend.read_range("packs/ab/cd", 0, 0) == b""
    with pytest.raises(FileNotFoundError):
        backend.read_range("packs/ab/none", 0, 10)


def test_large_object_streams(backend: Backend) -> None:
    data = os.urandom(3 << 20)  # above the S3 backend's in-memory read size
    assert backend.put_if_absent("objects/ee/big", _stage(backend, data))
    with backend.open("objects/ee/big") as f:
        assert f.read(10) == data[:10]
        assert f.read() == data[10:]


def test_list_and_delete(backend: Backend) -> None:
    for k in ("namespaces/b/generations/2", "namespaces/b/generations/1", "namespaces/a/x"):
        assert backend.create_exclusive(k, b"x")
    assert list(backend.list("namespaces")) == ["a", "b"]  # sorted, names directly under
    assert list(backend.list("namespaces/b/generations")) == ["1", "2"]
    assert list(backend.list("namespaces/none")) == []
    assert list(backend.list("namespaces/a/x")) == []  # a file is not a directory
    backend.delete("namespaces/b/generations/1")
    assert list(backend.list("namespaces/b/generations")) == ["2"]
    assert backend.info("namespaces/b/generations/1") is None
    backend.delete("namespaces/b/generations/1")  # absent: not an error


def test_list_after_gives_the_names_past_one(backend: Backend) -> None:
    """What a publisher that lost a race reads: the records newer than the one it lost
    (casfs.store.generations), in one request on an object store."""
    for seq in (3, 1, 12, 2, 10):
        assert backend.create_exclusive(f"namespaces/b/generations/{seq:012d}", b"x")
    assert backend.create_exclusive("namespaces/b/generationsx", b"x")  # beside, not under
    gens = "namespaces/b/generations"
    assert list(backend.list_after(gens, f"{2:012d}")) == [f"{s:012d}" for s in (3, 10, 12)]
    assert list(backend.list_after(gens, f"{12:012d}")) == []
    assert list(backend.list_after(gens, "")) == list(backend.list(gens))
    assert list(backend.list_after("namespaces", "a")) == ["b"]  # names, not keys
    assert list(backend.list_after("namespaces/none", "")) == []


def test_keys_cannot_escape_the_root(backend: Backend) -> None:
    with pytest.raises(ValueError):
        backend.open("../outside")
    with pytest.raises(ValueError):
        backend.create_exclusive("/etc/casfs-test", b"x")


def test_a_leaf_listing_names_what_is_under_it_and_is_bounded(
        request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On S3 a leaf prefix (a namespace's records, a fan-out dir) is walked a page at a
    time and refused past MAX_LISTED keys: a server whose pages never end had obstore's
    own paging hold every page in memory for as long as it went on (a review, on
    2026-12-06: a mount process growing ~55 MB/s for good)."""
    from casfs.store import s3backend

    backend = _s3(request, tmp_path)
    for k in ("namespaces/a/generations/1", "namespaces/a/generations/2",
              "namespaces/a/generations/sub/deeper", "namespaces/a/generationsx",
              *(f"namespaces/b/generations/{i}" for i in range(8))):
        assert backend.create_exclusive(k, b"x")
    assert list(backend.list("namespaces/a/generations")) == ["1", "2", "sub"]
    assert list(backend.list_after("namespaces/a/generations", "1")) == ["2", "sub"]
    assert list(backend.list("namespaces")) == ["a", "b"]  # the top level: by name
    monkeypatch.setattr(s3backend, "MAX_LISTED", 5)
    assert list(backend.list("namespaces/a/generations")) == ["1", "2", "sub"]
    with pytest.raises(OSError, match="more than 5 keys"):
        backend.list("namespaces/b/generations")
    with pytest.raises(OSError, match="more than 5 keys"):
        backend.list_after("namespaces/b/generations", "")
