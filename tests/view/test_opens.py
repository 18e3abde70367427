"""fanotify open recording on an overlay mount (casfs.view.opens): every open under
the mount reaches the callback, once per file per epoch (ignore marks)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from casfs.view import overlay
from casfs.view.opens import FanotifyOpens


def _wait(cond: object, what: str) -> None:
    deadline = time.monotonic() + 20
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_one_event_per_file_per_epoch(tmp_path: Path) -> None:
    if (why := overlay.unavailable_reason()) is not None:
        pytest.skip(why)
    lower, upper, work, mnt = (tmp_path / d for d in ("lower", "upper", "work", "mnt"))
    for d in (upper, work, mnt):
        d.mkdir()
    for i in range(50):
        p = lower / f"d{i % 5}" / f"f{i}"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={lower},upperdir={upper},workdir={work}", str(mnt)], check=True)
    seen: list[str] = []
    w = FanotifyOpens(mnt, lambda rel: seen.append(rel) is None)
    try:
        w.start()
        read = ("import os, sys\nfor _ in range(5):\n for d, _, fs in os.walk(sys.argv[1]):\n"
                "  for f in fs: open(os.path.join(d, f)).read()\n")
        subprocess.run([sys.executable, "-c", read, str(mnt)], check=True)
        files = {f"d{i % 5}/f{i}" for i in range(50)}
        _wait(lambda: set(seen) == files, "opens under the overlay were not reported")
        time.sleep(0.3)  # the last ignore marks are added just after the callbacks
        # 250 opens: about one event per file (an open racing its file's ignore mark
        # may add one), never one per open.
        first = w.events
        assert 50 <= first < 250
        subprocess.run([sys.executable, "-c", read, str(mnt)], check=True)
        (mnt / "d0" / "f0").read_bytes()  # this process's own opens are not reported
        time.sleep(0.3)
        assert w.events == first  # every file is marked: the kernel reports nothing more
        w.reset()  # a new epoch: files still in use are reported again
        del seen[:]
        subprocess.run([sys.executable, "-c", read, str(mnt)], check=True)
        _wait(lambda: set(seen) == files, "opens after a new epoch were not reported")
    finally:
        w.stop()
        subprocess.run(["umount", "-l", str(mnt)], check=False)
