"""Slow and stalled shared roots (issue 8 item 7), the view driven in-process.

I4: no open waits longer than fetch_timeout (10 s by default, here shortened).
I2: the job gets ENOENT or the correct bytes. A fetch still receiving bytes
finishes in the background and serves the next open; a stalled one hides
the path for a while. A stalled *real* root is in test_stalled_root.py.
"""

from __future__ import annotations

import errno
import functools
import os
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import pyfuse3
import pytest
import trio
from waiting import wait_until

from casfs.index.node_index import NodeIndex
from casfs.index.objcache import LocalObjectCache
from casfs.node.config import MountConfig
from casfs.store.entry import Entry
from casfs.store.objects import digest_bytes
from casfs.util.counters import Counters
from casfs.view import op_copyup
from casfs.view.lower import DictLowerTree
from casfs.view.ops import OverlayOperations
from casfs.view.testserve import RecordingTracker

pytestmark = pytest.mark.expect_log(
    r"serving a miss: no answer from the shared root",
    r"the shared root answered none of the last 3 fetches",
)

CTX = pyfuse3.RequestContext()
DATA = os.urandom(1 << 16)


class SlowSource:
    """Delivers an object in 8 chunks, ``pause`` seconds apart, after ``gate`` opens;
    the chunks after the first wait for ``hold``."""

    def __init__(self, pause: float) -> None:
        self.pause = pause
        self.gate = threading.Event()
        self.gate.set()
        self.hold = threading.Event()
        self.hold.set()

    def get_into(self, digest: str, expected_size: int | None, out: BinaryIO) -> int:
        self.gate.wait(60)
        step = len(DATA) // 8
        for i in range(0, len(DATA), step):
            out.write(DATA[i:i + step])
            self.hold.wait(60)
            time.sleep(self.pause)
        return len(DATA)


class _Source(Protocol):
    def get_into(self, digest: str, expected_size: int | None, out: BinaryIO) -> int: ...


def _ops(tmp_path: Path, source: _Source, timeout: float,
         blobs: dict[str, bytes] | None = None) -> OverlayOperations:
    """A view over ``blobs`` (default: big.so), fetched from ``source`` into a real
    object cache; the breaker's brief wait scaled as fetch_timeout is (0.1 of 1 s)."""
    tree = DictLowerTree()
    for name, data in (blobs or {"big.so": DATA}).items():
        tree.add(Entry(name, digest_bytes(data), len(data), 0o644, 1))
    index = NodeIndex.open(tmp_path / "state")
    cache = LocalObjectCache(tmp_path / "state" / "objects", index, source, 1 << 30)
    (tmp_path / "upper").mkdir()
    ops = OverlayOperations(tree, cache, tmp_path / "upper", RecordingTracker(), Counters(),
                            fetch_timeout=timeout)
    ops.breaker.brief = 0.1
    return ops


async def _open_read(ops: OverlayOperations, name: str = "big.so") -> bytes | int:
    try:
        ino = (await ops.lookup(pyfuse3.ROOT_INODE, name.encode(), CTX)).st_ino
        fi = await ops.open(ino, os.O_RDONLY, CTX)
    except pyfuse3.FUSEError as e:
        return e.errno
    data = await ops.read(fi.fh, 0, 1 << 20)
    await ops.release(fi.fh)
    return data


def test_slow_but_progressing_fetch_serves_the_next_open(tmp_path: Path) -> None:
    """I2, I4: the first open misses at the timeout, the fill finishes, the next open hits."""
    src = SlowSource(pause=0.0)
    src.hold.clear()  # one chunk arrives, the rest only after the first open gave up
    ops = _ops(tmp_path, src, timeout=1.0)
    digest = digest_bytes(DATA)

    async def main() -> list[Any]:
        first = await _open_read(ops)
        src.hold.set()  # the fill goes on in the background meanwhile
        # (bytes arrived, so no progress means no fill in flight: it finished)
        wait_until(lambda: ops.fetcher.fill_progress(digest) is None, "the background fill")
        return [first, await _open_read(ops)]

    first, second = trio.run(main)
    assert first == errno.ENOENT
    assert second == DATA  # the background fill, not a second fetch and not a hidden path
    c = ops.counters.snapshot()
    assert c["fetch_slow"] == 1 and c.get("fetch_timeouts", 0) == 0


def test_stalled_fetch_is_a_bounded_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """I4: nothing arrives: the open misses at fetch_timeout and the path is hidden a while."""
    monkeypatch.setattr(op_copyup, "STALL", 0.2)
    src = SlowSource(pause=0.0)
    src.gate.clear()  # a root that does not answer
    ops = _ops(tmp_path, src, timeout=0.5)

    async def main() -> tuple[float, Any, Any]:
        t = time.monotonic()
        first = await _open_read(ops)
        waited = time.monotonic() - t
        again = await _open_read(ops)  # hidden for retry_after: no second wait
        return waited, first, again

    try:
        waited, first, again = trio.run(main)
    finally:
        src.gate.set()
    assert first == errno.ENOENT and again == errno.ENOENT
    assert waited < 5  # bounded by fetch_timeout (0.5 s here), not by the root
    assert ops.counters.get("fetch_timeouts") == 1


def test_default_fetch_timeout_is_within_the_no_hang_bound() -> None:
    """I4: the default wait of an open is at most 10 s."""
    cfg = MountConfig(name="x", family="generic", namespace="ns", mountpoint=Path("/x"),
                      root=Path("/r"), state_dir=Path("/s"))
    assert cfg.fetch_timeout <= 10


def test_fetch_timeout_flag_is_checked(tmp_path: Path) -> None:
    """`casfs mount/run --fetch-timeout S` exists and refuses a non-positive value."""
    import subprocess
    import sys

    for cmd in (["mount", str(tmp_path / "m")], ["run"]):
        r = subprocess.run([sys.executable, "-m", "casfs.cli.main", *cmd, "--fetch-timeout",
                            "0", "--", "true"], capture_output=True, text=True, timeout=60,
                           check=False)
        assert r.returncode == 2 and "must be a number > 0" in r.stderr, (cmd, r.stderr)


def test_a_root_that_stops_answering_costs_a_few_full_waits_then_lifts_at_its_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """I4 for a whole job: a root that takes requests and never answers costs the job
    the full fetch_timeout for its first few cold opens only (casfs.view.breaker), not
    for every one; the root's first answer lifts that, and its opens hit again."""
    monkeypatch.setattr(op_copyup, "STALL", 0.2)
    src = SlowSource(pause=0.0)
    src.gate.clear()
    blobs = {f"k{i}.so": os.urandom(1000) + bytes([i]) for i in range(8)}

    class Source:  # each object's bytes, once the gate opens
        def get_into(self, digest: str, expected_size: int | None, out: BinaryIO) -> int:
            src.gate.wait(60)
            data = next(d for d in blobs.values() if digest_bytes(d) == digest)
            out.write(data)
            return len(data)

    ops = _ops(tmp_path, Source(), 1.0, blobs)

    async def read(name: str) -> tuple[float, bytes | int]:
        t = time.monotonic()
        got = await _open_read(ops, name)
        return time.monotonic() - t, got

    async def main() -> tuple[list[tuple[float, bytes | int]], tuple[float, bytes | int]]:
        stalled = [await read(f"k{i}.so") for i in range(6)]
        src.gate.set()  # the root answers again: the fetches in flight end, the breaker lifts
        wait_until(lambda: not ops.breaker.open, "the root's first answer")
        return stalled, await read("k7.so")

    try:
        stalled, after = trio.run(main)
    finally:
        src.gate.set()
    assert all(r == errno.ENOENT for _, r in stalled)  # misses, never an error
    assert [w >= 1.0 for w, _ in stalled] == [True] * 3 + [False] * 3  # 3 full waits, then brief
    assert after[1] == blobs["k7.so"]  # the first open after the root's answer hits
    c = ops.counters.snapshot()
    assert c["fetch_timeouts"] == 3 and c["fetch_breaker_misses"] == 3


def test_a_slow_root_still_sending_bytes_never_trips_the_breaker(tmp_path: Path) -> None:
    """A slow but healthy root (large objects, bytes arriving throughout) answers: three
    fetches that outlast fetch_timeout while progressing leave the breaker shut, and a
    medium object it delivers within the timeout is a hit (a review of the breaker's
    first form: a miss after the brief wait)."""
    blobs = {f"big{i}.so": os.urandom(1 << 16) + bytes([i]) for i in range(3)}
    blobs["medium.so"] = os.urandom(1 << 15)

    class Source:  # the big ones take 1.5 x fetch_timeout, the medium one 0.4 s
        def get_into(self, digest: str, expected_size: int | None, out: BinaryIO) -> int:
            name, data = next((n, d) for n, d in blobs.items() if digest_bytes(d) == digest)
            total = 1.5 if name.startswith("big") else 0.4
            step = len(data) // 16
            for i in range(0, len(data), step):
                out.write(data[i:i + step])
                time.sleep(total / 17)
            return len(data)

    ops = _ops(tmp_path, Source(), 1.0, blobs)
    read = functools.partial(_open_read, ops)

    async def main() -> list[bytes | int]:
        out: list[bytes | int] = []

        async def one(name: str) -> None:
            out.append(await read(name))

        async with trio.open_nursery() as nursery:  # three ranks open their big files
            for i in range(3):
                nursery.start_soon(one, f"big{i}.so")
        return [*out, await read("medium.so")]

    got = trio.run(main)
    assert got[:3] == [errno.ENOENT] * 3  # slow: misses for these opens, filled behind
    assert got[3] == blobs["medium.so"]
    assert not ops.breaker.open
    assert ops.counters.get("fetch_slow") == 3 and not ops.counters.get("fetch_breaker_misses")
