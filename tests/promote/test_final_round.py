"""The final round of dir and overlay modes: writers inferred from inotify lag behind.

A close still queued in the watcher's thread leaves a path "open for writing" in the
tracker although no process holds it; at shutdown that file was skipped, so a stop
right after a job's last write published all but that file. /proc decides instead.
"""

from __future__ import annotations

import functools
from pathlib import Path

from casfs.index.node_index import NodeIndex
from casfs.store.root import SharedRoot
from casfs.view.dirmode import open_for_writing
from tests.promote.rig import promotion_rig


def test_final_round_asks_proc_not_lagging_events(tmp_path: Path) -> None:
    root = SharedRoot.open(tmp_path / "root", create=True)
    upper = tmp_path / "upper"
    (upper / "K").mkdir(parents=True)
    (upper / "K" / "closed.ttir").write_bytes(b"written and closed\n")
    held = open(upper / "K" / "held.ttir", "wb")  # noqa: SIM115 - still being written
    held.write(b"half")
    held.flush()
    index = NodeIndex.open(tmp_path / "state")
    try:
        promoter, publisher, _, tracker = promotion_rig(root, upper, index)
        promoter.busy = functools.partial(open_for_writing, upper)
        # The watcher saw both writes start; neither close has been handled yet.
        tracker.opened_for_write("K/closed.ttir")
        tracker.opened_for_write("K/held.ttir")
        assert promoter.run_once().promoted == 0  # a periodic round waits for closes
        res = promoter.run_once(final=True)
        assert res.promoted == 1
        assert res.deferred == 1  # the file some process still writes is not taken
        assert publisher.publish().ok
    finally:
        held.close()
        index.close()
    snap = SharedRoot.open(tmp_path / "root").generations().entries("ns").entries
    assert set(snap) == {"K/closed.ttir"}
