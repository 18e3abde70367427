"""ObjectStore.read_ahead: a small object read in a thread; a read of it meanwhile waits
for that one instead of sending its own, and gets verified bytes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from casfs.store.digests import object_key
from casfs.store.root import SharedRoot


def test_a_read_during_the_read_ahead_waits_for_it(tmp_path: Path) -> None:
    root = SharedRoot.open(tmp_path / "root", create=True)
    digest = root.objects.put_bytes(b"profile bytes").digest
    fresh = SharedRoot.open(tmp_path / "root")
    objects = fresh.objects
    opened: list[str] = []
    gate = threading.Event()
    real = fresh.backend.open

    def slow(key: str) -> object:
        opened.append(key)
        gate.wait(5)  # the read ahead is in flight until the test lets it end
        return real(key)

    fresh.backend.open = slow  # type: ignore[method-assign]
    objects.read_ahead(digest)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(objects.get_bytes(digest)))
    reader.start()
    time.sleep(0.2)
    assert got == []  # waiting for the read ahead ...
    gate.set()
    reader.join(5)
    assert got == [b"profile bytes"]
    assert opened == [object_key(digest)]  # ... not reading it again


def test_a_failed_read_ahead_leaves_the_read_to_the_reader(tmp_path: Path) -> None:
    root = SharedRoot.open(tmp_path / "root", create=True)
    digest = root.objects.put_bytes(b"x" * 100).digest
    fresh = SharedRoot.open(tmp_path / "root")
    calls = [0]
    real = fresh.backend.open

    def flaky(key: str) -> object:
        calls[0] += 1
        if calls[0] == 1:
            raise OSError("connection reset")
        return real(key)

    fresh.backend.open = flaky  # type: ignore[method-assign]
    fresh.objects.read_ahead(digest)
    time.sleep(0.2)
    assert fresh.objects.get_bytes(digest) == b"x" * 100
    assert calls[0] == 2
