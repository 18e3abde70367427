"""Retention by use in every view mode: a node records the published entries its jobs
open (FUSE handlers; fanotify in overlay mode; inotify in dir mode), and gc drops
exactly the entries no node opened since the cut-off."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from casfs.promote.retention import drop_unused
from casfs.store import profile
from casfs.store.root import SharedRoot
from casfs.view import overlay

from .test_two_nodes import published, seed

pytestmark = pytest.mark.fuse

FILES = {"K/a.bin": b"entry A" * 100, "K/b.bin": b"entry B" * 100, "L/c.bin": b"entry C"}


def _records(root: Path) -> list[dict[str, Any]]:
    d = root / "namespaces" / "testns" / "reads"
    return [json.loads(p.read_bytes()) for p in sorted(d.iterdir())] if d.exists() else []


@pytest.mark.parametrize("mode", ["fuse", "overlay", "dir"])
def test_gc_drops_what_no_node_opened_since_the_cutoff(
        cluster: dict[str, Any], tmp_path: Path, mode: str) -> None:
    if mode == "overlay" and (why := overlay.unavailable_reason()) is not None:
        pytest.skip(why)
    root, a, b = cluster["root"], cluster["a"], cluster["b"]
    seed(root, FILES, tmp=tmp_path)
    kw: dict[str, Any] = {"mode": mode}
    if mode == "dir":
        kw["mountpoint"] = cluster["mnt"] / "plain"

    # Before the cut-off node b's job read everything (so in overlay mode every
    # object is local and served by the kernel from hard links, not by casfs).
    w = b.mount()
    for rel, data in FILES.items():
        assert (w.cfg.mountpoint / rel).read_bytes() == data
    b.stop(w)
    assert sorted(_records(root)[0]["paths"]) == sorted(FILES)
    time.sleep(1.1)  # record names have whole seconds
    cutoff = time.time()

    # After it, node a's job only lists the cache; node b's opens entry A only.
    w = a.mount(**kw)
    assert sorted(os.listdir(w.cfg.mountpoint / "K")) == ["a.bin", "b.bin"]
    a.stop(w)
    w = b.mount(**kw)
    mnt = w.cfg.mountpoint
    if mode == "overlay":
        assert b.ask(w, "stats")["counters"]["overlay_linked"] == len(FILES)
    for _ in range(3):
        assert (mnt / "K" / "a.bin").read_bytes() == FILES["K/a.bin"]
    (mnt / "K" / "new.bin").write_bytes(b"the job's own file")  # not a published entry
    wait_until(lambda: b.ask(w, "stats")["counters"].get("opens_recorded", 0) >= 1,
               "node b's open of A was not recorded")
    b.stop(w)
    recs = _records(root)
    assert len(recs) == 2  # node a opened nothing: no record
    assert recs[1]["paths"] == ["K/a.bin"]
    assert "until" not in recs[1]  # the mount's last record: coverage ends at its time

    # The same opens feed the access profile published with b's generation (prefetch).
    r = SharedRoot.open(root)
    gens = r.generations()
    rec = gens.latest("testns")
    assert rec is not None and isinstance(rec.options.get("profile"), str)
    hot, _ = profile.decode(r.objects.get_bytes(rec.options["profile"]))
    assert [p for p, _ in hot] == ["K/a.bin", "K/new.bin"]
    if mode == "fuse":  # through the command an operator runs
        # Just after b's first record: the CLI's start-up only moves the cut-off
        # later, and the second record is seconds after it.
        days = (time.time() - (recs[0]["time"] + 0.3)) / 86400
        r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(root),
                            "--state-dir", str(tmp_path / "state-gc"), "gc", "--unused-for",
                            repr(days)], capture_output=True, text=True, timeout=120,
                           check=False)
        assert r.returncode == 0, r.stderr
        assert "testns: dropped (now testns@" in r.stdout and "2 files unused" in r.stdout
    else:
        now = time.time()
        rep = drop_unused(gens, unused_for_s=now - cutoff, now=now, node="gc")
        assert rep.dropped["testns"] == ["K/b.bin", "L/c.bin"]
    left = published(root)
    assert "K/a.bin" in left and "K/b.bin" not in left and "L/c.bin" not in left


@pytest.mark.expect_log(r"the open listener exited with status -\d+")
def test_overlay_listener_death_never_hurts_the_job(cluster: dict[str, Any],
                                                   tmp_path: Path) -> None:
    """Overlay mode's open listener is a child process: opens the kernel serves are
    recorded through it; killed, it is started again (twice), then recording stops
    with a log line; the job's reads are right throughout."""
    if (why := overlay.unavailable_reason()) is not None:
        pytest.skip(why)
    root, b = cluster["root"], cluster["b"]
    seed(root, FILES, tmp=tmp_path)
    w = b.mount()
    for rel, data in FILES.items():  # every object local: the overlay links them all
        assert (w.cfg.mountpoint / rel).read_bytes() == data
    b.stop(w)
    w = b.mount(mode="overlay")
    mnt = w.cfg.mountpoint

    def watch() -> dict[str, Any]:
        st = b.ask(w, "stats")
        assert st["counters"]["overlay_linked"] == len(FILES)
        out: dict[str, Any] = st["open_watch"]
        out["recorded"] = st["counters"].get("opens_recorded", 0)
        return out

    wait_until(lambda: watch()["pid"] is not None, "no listener process")
    rels = sorted(FILES)
    for k, rel in enumerate(rels):
        assert (mnt / rel).read_bytes() == FILES[rel]
        if k == 2:
            break
        wait_until(lambda k=k: watch()["recorded"] == k + 1, f"the open of {rel} was not recorded")
        pid = watch()["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda k=k, pid=pid: watch()["restarts"] == k + 1
                   and watch()["pid"] not in (None, pid), "the listener was not started again")
    wait_until(lambda: watch()["recorded"] == 3, "the open after two restarts was not recorded")
    os.kill(watch()["pid"], signal.SIGKILL)  # the third death: recording stops
    wait_until(lambda: watch()["failed"], "the listener was started a third time")
    for rel, data in FILES.items():
        assert (mnt / rel).read_bytes() == data
    (mnt / "K" / "new.bin").write_bytes(b"written after")
    assert (mnt / "K" / "new.bin").read_bytes() == b"written after"
    assert watch()["pid"] is None
    b.stop(w)
