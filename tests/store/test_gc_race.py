"""gc racing publication, on both backends (POSIX and a real S3 server): two-phase gc
never removes an object a generation it keeps names, with nothing ever touched."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from casfs.store import maintenance, marks
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot

pytestmark = pytest.mark.slow


@pytest.fixture(params=["local", "s3"])
def any_root(request: pytest.FixtureRequest, tmp_path: Path) -> SharedRoot:
    if request.param == "s3":
        return SharedRoot.open(request.getfixturevalue("s3_url"), create=True)
    return SharedRoot.open(tmp_path / "root", create=True)


def test_gc_racing_publishers_keeps_every_kept_object(
    any_root: SharedRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = any_root
    # Publishers see every new mark at once (in production: grace >> LIST_TTL).
    monkeypatch.setattr(marks, "LIST_TTL", 0.0)
    # grace 0 also removes in-flight staging files (POSIX tmp/): not what this tests
    monkeypatch.setattr(root.backend, "staging_entries", lambda: iter(()))
    pool = [f"shared kernel {i}\n".encode() * 50 for i in range(12)]
    stop = threading.Event()
    errors: list[BaseException] = []
    published: list[int] = []

    def publisher() -> None:
        rng = random.Random(1)
        gens = SharedRoot.open(root.location).generations()  # its own "node"
        try:
            for g in range(14):
                ents = []
                for i, data in enumerate([*rng.sample(pool, 4), f"unique {g}".encode()]):
                    res = gens.objects.put_bytes(data)  # re-used pool objects dedup
                    ents.append(Entry(f"g{g}/f{i}", res.digest, res.size, 0o644, 0))
                seq = gens.publish("race", ents, node="pub").seq
                assert seq is not None
                published.append(seq)
                time.sleep(0.25)  # pool objects age past the mark slack between uses
        except BaseException as e:
            errors.append(e)
        finally:
            stop.set()

    def collector() -> None:
        try:
            while not stop.is_set():
                # keep=1 and grace 0: every object not in the newest generation is
                # marked and swept at once, the harshest setting.
                maintenance.gc(root, keep=1, grace=0)
                time.sleep(0.1)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=publisher), threading.Thread(target=collector)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert published == list(range(1, 15))
    gens = root.generations()
    newest = gens.latest("race")
    assert newest is not None and newest.seq == 14
    for e in gens.snapshot(newest).entries.values():  # every kept file still reads
        assert len(root.objects.get_bytes(e.digest, e.size)) == e.size
    assert maintenance.verify(root).problems == []
