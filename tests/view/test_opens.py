"""fanotify open recording on an overlay mount (casfs.view.opens): every open under
the mount reaches the callback, once per file per epoch (ignore marks)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import wait_until

from casfs.view import opens, overlay
from casfs.view.opens import FanotifyOpens, OpenWatchProcess


def test_one_event_per_file_per_epoch(tmp_path: Path) -> None:
    if (why := overlay.unavailable_reason()) is not None:
        pytest.skip(why)
    lower, upper, work, mnt = (tmp_path / d for d in ("lower", "upper", "work", "mnt"))
    for d in (upper, work, mnt):
        d.mkdir()
    for i in range(50):
        p = lower / "c" / f"d{i % 5}" / f"f{i}"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    for name in ("s1", "s2"):  # outside the job's tree c/: one unmarked open each
        (lower / name).write_bytes(b"x")
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={lower},upperdir={upper},workdir={work}", str(mnt)], check=True)
    seen: list[str] = []
    w = FanotifyOpens(mnt, lambda rel: seen.append(rel) is None)

    def drained(sentinel: str) -> None:
        """Every event queued before a later open of ``sentinel`` is handled: one thread
        takes them in order, each file's ignore mark right after its callback."""
        subprocess.run(["cat", str(mnt / sentinel)], check=True, capture_output=True)
        wait_until(lambda: sentinel in seen, f"the open of {sentinel} was not reported")

    try:
        w.start()
        read = ("import os, sys\nfor _ in range(5):\n for d, _, fs in os.walk(sys.argv[1]):\n"
                "  for f in fs: open(os.path.join(d, f)).read()\n")
        subprocess.run([sys.executable, "-c", read, str(mnt / "c")], check=True)
        files = {f"c/d{i % 5}/f{i}" for i in range(50)}
        drained("s1")
        assert set(seen) == files | {"s1"}, "opens under the overlay were not reported"
        # 250 opens: about one event per file (an open racing its file's ignore mark
        # may add one), never one per open.
        first = w.events
        assert 50 <= first - 1 < 250
        subprocess.run([sys.executable, "-c", read, str(mnt / "c")], check=True)
        (mnt / "c" / "d0" / "f0").read_bytes()  # this process's own opens are not reported
        drained("s2")
        assert w.events == first + 1  # every file is marked: the kernel reports only s2
        w.reset()  # a new epoch: files still in use are reported again
        del seen[:]
        subprocess.run([sys.executable, "-c", read, str(mnt / "c")], check=True)
        wait_until(lambda: set(seen) == files, "opens after a new epoch were not reported")
    finally:
        w.stop()
        subprocess.run(["umount", "-l", str(mnt)], check=False)


READ = ("import os, sys\nfor d, _, fs in os.walk(sys.argv[1]):\n"
        " for f in fs:\n  assert open(os.path.join(d, f), 'rb').read() == b'x' + f.encode()\n")


@pytest.mark.expect_log(r"the open listener exited with status -\d+")
def test_listener_process_records_survives_kills_and_degrades(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The child-process listener: opens reach on_open here; a killed listener is
    started again (events queued meanwhile are kept), then recording stops with one
    line; the job's reads never fail."""
    if (why := overlay.unavailable_reason()) is not None:
        pytest.skip(why)
    monkeypatch.setattr(opens, "RESTART_DELAY", 0.05)
    lower, upper, work, mnt = (tmp_path / d for d in ("lower", "upper", "work", "mnt"))
    for d in (upper, work, mnt):
        d.mkdir()

    def make(gen: int) -> set[str]:
        names = {f"g{gen}/d{i % 3}/f{i}" for i in range(20)}
        for n in names:
            (lower / n).parent.mkdir(parents=True, exist_ok=True)
            (lower / n).write_bytes(b"x" + Path(n).name.encode())
        return names

    gens = [make(g) for g in range(4)]
    (lower / "own").write_bytes(b"own")
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={lower},upperdir={upper},workdir={work}", str(mnt)], check=True)
    seen: list[str] = []
    w = OpenWatchProcess(mnt, seen.append)
    caplog.set_level(logging.WARNING, logger="casfs.view.opens")
    try:
        w.start()
        subprocess.run([sys.executable, "-c", READ, str(mnt / "g0")], check=True, timeout=60)
        wait_until(lambda: gens[0] <= set(seen), "opens were not reported by the listener")
        assert all(not p.startswith("/") for p in seen)  # relative to the mount
        w.reset()  # a new epoch (the mount process flushes the child's ignore marks)
        del seen[:]
        subprocess.run([sys.executable, "-c", READ, str(mnt / "g0")], check=True, timeout=60)
        wait_until(lambda: gens[0] <= set(seen), "opens after a new epoch were not reported")
        for k in (1, 2):  # killed: started again, and nothing opened meanwhile is lost
            pid = w.pid
            assert pid is not None and pid != os.getpid()
            os.kill(pid, signal.SIGKILL)
            subprocess.run([sys.executable, "-c", READ, str(mnt / f"g{k}")], check=True,
                           timeout=60)
            wait_until(lambda k=k, pid=pid: w.restarts == k and w.pid not in (None, pid),
                       "the listener was not started again")
            wait_until(lambda k=k: gens[k] <= set(seen), "opens after a restart were lost")
        assert (mnt / "own").read_bytes() == b"own"  # the mount process's own opens
        pid = w.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # the third death: recording stops, reads go on
        wait_until(lambda: w.failed, "recording did not stop after the last restart")
        assert w.pid is None
        subprocess.run([sys.executable, "-c", READ, str(mnt / "g3")], check=True, timeout=60)
        assert not (gens[3] | {"own"}) & set(seen)
        assert "no longer recorded" in caplog.text
    finally:
        w.stop()
        subprocess.run(["umount", "-l", str(mnt)], check=False)
    assert w.pid is None


def test_listener_dies_with_the_mount_process(tmp_path: Path) -> None:
    if (why := overlay.unavailable_reason()) is not None:
        pytest.skip(why)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code = ("import sys, time\nfrom casfs.view.opens import OpenWatchProcess\n"
            "w = OpenWatchProcess(sys.argv[1], print)\nw.start()\n"
            "while w.pid is None: time.sleep(0.01)\n"
            "print(w.pid, flush=True)\ntime.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(mnt)], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None
        child = int(p.stdout.readline())
        os.kill(child, 0)  # it runs
    finally:
        p.kill()
        p.wait()
    # PR_SET_PDEATHSIG: the listener goes with the process that started it
    wait_until(lambda: not Path(f"/proc/{child}").exists()
               or "Z" in Path(f"/proc/{child}/stat").read_text().split(")")[-1][:3],
          "the listener outlived the mount process")
