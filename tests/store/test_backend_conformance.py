"""One conformance suite for every storage backend (DESIGN.md: backends are interchangeable).

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


BACKENDS: dict[str, Callable[[Path], Backend]] = {"local": _local}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return BACKENDS[request.param](tmp_path)


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


def test_info_touch(backend: Backend) -> None:
    assert backend.info("objects/00/none") is None
    assert backend.create_exclusive("objects/aa/bb", b"12345")
    info = backend.info("objects/aa/bb")
    assert info is not None and info.size == 5
    if isinstance(backend, LocalBackend):  # backdate so the refresh is observable
        past = time.time() - 3600
        os.utime(backend.root / "objects/aa/bb", (past, past))
    old = backend.info("objects/aa/bb")
    assert old is not None
    backend.touch("objects/aa/bb")
    new = backend.info("objects/aa/bb")
    assert new is not None and new.mtime > old.mtime and new.size == 5
    backend.touch("objects/aa/absent")  # best effort: no error
    assert backend.info("objects/aa/absent") is None


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


def test_keys_cannot_escape_the_root(backend: Backend) -> None:
    with pytest.raises(ValueError):
        backend.open("../outside")
    with pytest.raises(ValueError):
        backend.create_exclusive("/etc/casfs-test", b"x")
