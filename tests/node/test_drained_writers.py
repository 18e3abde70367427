"""The writers files of draining predecessors (casfs.node.handover.drained_writers)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from casfs.node import handover


def _gone_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_live_drainers_paths_are_written_a_dead_fuse_drainers_are_torn(tmp_path: Path) -> None:
    live = subprocess.Popen(["sleep", "60"])
    try:
        dead = _gone_pid()
        handover.writers_file(tmp_path, "ns", live.pid).write_text(json.dumps(
            {"paths": ["a"], "layer": "fuse", "mount_id": 7, "mountpoint": "/x"}))
        handover.writers_file(tmp_path, "ns", dead).write_text(json.dumps(
            {"paths": ["b"], "layer": "fuse", "mount_id": 8, "mountpoint": "/x"}))
        got = handover.drained_writers(tmp_path, "ns")
        assert got.writing == {"a"} and got.torn == {dead: {"b"}}
        # told once: the dead one's file is gone
        assert not handover.writers_file(tmp_path, "ns", dead).exists()
        assert handover.drained_writers(tmp_path, "ns").torn == {}
    finally:
        live.kill()
        live.wait()


def test_an_older_releases_list_is_read_and_a_dead_overlay_drainer_with_no_writer_ends(
        tmp_path: Path) -> None:
    dead, dead2 = _gone_pid(), _gone_pid()
    # an older release's bare list: its layer unknown, so torn when its process is gone
    handover.writers_file(tmp_path, "ns", dead).write_text(json.dumps(["old"]))
    # an overlay drainer whose detached overlay no process writes through any more
    handover.writers_file(tmp_path, "ns", dead2).write_text(json.dumps(
        {"paths": ["o"], "layer": "overlay", "mount_id": 2**31 - 1, "mountpoint": "/x"}))
    got = handover.drained_writers(tmp_path, "ns")
    assert got.torn == {dead: {"old"}} and got.writing == set()
    assert list(tmp_path.glob("draining-*")) == []


def test_busy_hook_tells_torn_paths_once_and_defers_them(tmp_path: Path) -> None:
    dead = _gone_pid()
    handover.writers_file(tmp_path, "ns", dead).write_text(json.dumps(
        {"paths": ["t"], "layer": "fuse", "mount_id": 1, "mountpoint": "/x"}))
    told: list[tuple[int, set[str]]] = []
    busy = handover.busy_hook(tmp_path, "ns", lambda paths: set(),
                              lambda pid, rels: told.append((pid, rels)))
    assert busy(["t", "u"]) == {"t"}
    assert busy(["t", "u"]) == set()  # the caller holds it from now on
    assert told == [(dead, {"t"})]
