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


def _drainer(run_dir: Path, pid: int, paths: list[str], layer: str | None = "fuse",
             mount_id: int = 7) -> None:
    handover.writers_file(run_dir, "ns", pid).write_text(json.dumps(paths))
    if layer is not None:
        handover.mount_file(run_dir, "ns", pid).write_text(json.dumps(
            {"layer": layer, "mount_id": mount_id, "mountpoint": "/x"}))


def test_a_live_drainers_paths_are_written_a_dead_fuse_drainers_are_torn(tmp_path: Path) -> None:
    live = subprocess.Popen(["sleep", "60"])
    try:
        dead = _gone_pid()
        _drainer(tmp_path, live.pid, ["a"])
        _drainer(tmp_path, dead, ["b"])
        got = handover.drained_writers(tmp_path, "ns")
        assert got.writing == {"a"} and got.torn == {dead: {"b"}}
        # told once: the dead one's files are gone
        assert not handover.writers_file(tmp_path, "ns", dead).exists()
        assert not handover.mount_file(tmp_path, "ns", dead).exists()
        assert handover.drained_writers(tmp_path, "ns").torn == {}
        assert handover.draining_pids(tmp_path) == set()  # stale (not fresh) or ours
    finally:
        live.kill()
        live.wait()


def test_the_writers_file_stays_a_list_an_older_release_reads(tmp_path: Path) -> None:
    """A rollback: a release before 2026-12-06 reads ``draining-<ns>.<pid>.json`` as a
    list of paths and skips names it cannot parse as a pid (the mount file)."""
    dead = _gone_pid()
    _drainer(tmp_path, dead, ["p/x.bin"])
    files = sorted(p.name for p in tmp_path.glob("draining-ns.*.json"))
    old_reader = {}
    for name in files:  # the old drained_writers' parse, verbatim
        try:
            pid = int(name[len("draining-ns."):-len(".json")])
        except ValueError:
            continue
        old_reader[pid] = set(json.loads((tmp_path / name).read_bytes()))
    assert old_reader == {dead: {"p/x.bin"}}


def test_an_older_releases_file_is_torn_and_a_dead_overlay_drainer_with_no_writer_ends(
        tmp_path: Path) -> None:
    dead, dead2 = _gone_pid(), _gone_pid()
    _drainer(tmp_path, dead, ["old"], layer=None)  # no mount file: its layer unknown
    # an overlay drainer whose detached overlay no process writes through any more
    _drainer(tmp_path, dead2, ["o"], layer="overlay", mount_id=2**31 - 1)
    got = handover.drained_writers(tmp_path, "ns")
    assert got.torn == {dead: {"old"}} and got.writing == set()
    assert list(tmp_path.glob("draining-*")) == []


def test_only_the_serving_process_claims_a_dead_drainers_paths(tmp_path: Path) -> None:
    """Another drainer (two reloads under a held job) counts them as written and leaves
    the file: the serving process's tracker sees the rewrites that lift the hold."""
    dead = _gone_pid()
    _drainer(tmp_path, dead, ["t"])
    got = handover.drained_writers(tmp_path, "ns", claim=False)
    assert got.writing == {"t"} and got.torn == {}
    assert handover.writers_file(tmp_path, "ns", dead).exists()
    assert handover.drained_writers(tmp_path, "ns").torn == {dead: {"t"}}


def test_busy_hook_tells_torn_paths_once_and_defers_them(tmp_path: Path) -> None:
    dead = _gone_pid()
    _drainer(tmp_path, dead, ["t"])
    told: list[tuple[int, set[str]]] = []
    busy = handover.busy_hook(tmp_path, "ns", lambda paths: set(),
                              lambda pid, rels: told.append((pid, rels)))
    assert busy(["t", "u"]) == {"t"}
    assert busy(["t", "u"]) == set()  # the caller holds it from now on
    assert told == [(dead, {"t"})]
