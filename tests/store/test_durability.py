"""The durability invariant: a record is created only after the objects it names are synced."""

from __future__ import annotations

from pathlib import Path

import pytest

from casfs.store.backend import LocalBackend
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot


class SpyBackend(LocalBackend):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.calls: list[str] = []

    def put_if_absent(self, key: str, staged: Path) -> bool:
        self.calls.append(f"put {key.split('/')[0]}")
        return super().put_if_absent(key, staged)

    def sync(self) -> None:
        self.calls.append("sync")
        super().sync()

    def create_exclusive(self, key: str, data: bytes) -> bool:
        self.calls.append(f"create {key.split('/')[-2]}")
        return super().create_exclusive(key, data)


def test_objects_are_synced_before_the_record_that_names_them(tmp_path: Path) -> None:
    root = SharedRoot.open(tmp_path / "root", create=True)
    spy = SpyBackend(root.path)
    root.backend = spy
    root.objects.backend = spy
    gens = root.generations()
    put = root.objects.put_bytes(b"payload")
    gens.publish("ns", [Entry("f", put.digest, put.size, 0o644, 0)], node="n")
    record = spy.calls.index("create generations")
    assert "sync" in spy.calls[:record]
    last_put = max(i for i, c in enumerate(spy.calls) if c.startswith("put"))
    assert last_put < spy.calls.index("sync", last_put) < record


def test_sync_filesystem_runs(tmp_path: Path) -> None:
    from casfs.util.atomic import sync_filesystem

    sync_filesystem(tmp_path)  # syncfs(2) on a real directory: no error


def test_the_mount_registry_is_written_whole_without_waiting_on_the_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A running mount's registry entry is replaced atomically but not fsynced: on a
    fresh node's journaled disk that fsync waited ~65 ms behind the fetched namespace's
    writeback, between the overlay's mount and READY. What needs to survive a crash
    (a durable write_atomic) still syncs."""
    import os

    from casfs.node import control
    from casfs.util.atomic import write_atomic

    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    run = tmp_path / "run"
    control.write_registry(run, "m", {"name": "m", "pid": os.getpid(), "mountpoint": "/x"})
    control.write_registry(run, "m", {"name": "m", "pid": os.getpid(), "mountpoint": "/y"})
    assert synced == []
    assert [e["mountpoint"] for e in control.registered(run)] == ["/y"]
    assert sorted(p.name for p in run.iterdir()) == ["m.json", "m.json.lock"]  # no temp left
    write_atomic(tmp_path / "durable", b"x")
    assert len(synced) == 2  # the file, then its directory


@pytest.mark.expect_log(
    r"rejected object: object \w+: truncated header",
    r"repaired damaged object ",
)
def test_a_torn_object_is_repaired_not_trusted_by_dedup(tmp_path: Path) -> None:
    from casfs.store.objects import digest_bytes, object_key

    root = SharedRoot.open(tmp_path / "root", create=True)
    data = b"kernel bytes " * 1000
    target = root.path / object_key(digest_bytes(data))
    target.parent.mkdir(parents=True)
    target.write_bytes(b"CASF")  # what a crash between link() and syncfs can leave
    res = root.objects.put_bytes(data)
    assert res.created  # rewritten, not deduplicated against the torn file
    assert root.objects.get_bytes(res.digest, len(data)) == data
    assert root.counters.get("objects_repaired") == 1
    again = root.objects.put_bytes(data)
    assert not again.created  # a sound object is deduplicated as usual
    assert root.counters.get("objects_repaired") == 1


def test_without_hard_links_names_are_still_created_atomically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem refusing link(): records fall back to renameat2(RENAME_NOREPLACE)."""
    import errno
    import os

    def no_links(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, "no hard links here")

    root = SharedRoot.open(tmp_path / "root", create=True)
    monkeypatch.setattr(os, "link", no_links)
    gens = root.generations()
    put = root.objects.put_bytes(b"payload")
    assert not root.objects.put_bytes(b"payload").created  # dedup still works
    gens.publish("ns", [Entry("f", put.digest, put.size, 0o644, 0)], node="n")
    assert root.backend.create_exclusive("namespaces/ns/generations/000000000001", b"x") is False
    assert gens.entries("ns").entries["f"].digest == put.digest
    assert list((root.path / "tmp").iterdir()) == []  # no staged file left behind
