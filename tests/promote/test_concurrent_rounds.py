"""Two promotion rounds at once (the periodic round and a publication's) must not mix
their batches: every published row names an object or pack that exists (I3)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from casfs.index.node_index import NodeIndex
from casfs.store.root import SharedRoot
from tests.promote.rig import promotion_rig


@pytest.mark.parametrize("delay", [0.03, 0.06, 0.1, 0.15])
def test_overlapping_rounds_publish_only_written_packs(tmp_path: Path, delay: float) -> None:
    root = SharedRoot.open(tmp_path / "root", create=True)
    upper = tmp_path / "upper"
    files = {f"K{i}/k{i}.ttir": f"kernel {i}\n".encode() * (40 + i % 50) for i in range(3000)}
    for rel, data in files.items():
        (upper / rel).parent.mkdir(parents=True, exist_ok=True)
        (upper / rel).write_bytes(data)
    index = NodeIndex.open(tmp_path / "state")
    try:
        promoter, publisher, _, tracker = promotion_rig(root, upper, index)
        promoter.scan_all()
        errors: list[BaseException] = []

        def round_() -> None:
            try:
                promoter.run_once(final=True)
            except BaseException as e:  # surfaced below
                errors.append(e)

        threads = [threading.Thread(target=round_) for _ in range(2)]
        threads[0].start()
        # The second round starts while the first is in its waves (3,000 files take
        # ~1 s): one round's reset used to swap the other's batch and pack writer.
        time.sleep(delay)
        threads[1].start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        promoter.run_once(final=True)  # whatever a round left dirty
        assert tracker.pending() == 0
        assert publisher.publish().ok
    finally:
        index.close()
    reader = SharedRoot.open(tmp_path / "root")
    snap = reader.generations().entries("ns").entries  # learns where packed objects are
    assert set(snap) == set(files)
    for rel, data in files.items():
        e = snap[rel]
        assert reader.objects.get_bytes(e.digest, e.size) == data, rel
