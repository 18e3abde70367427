"""casfs.view.inowatch: the batched recursive inotify watch of a tenant's tree.

Real inotify on a real directory. What the promoter relies on: every file
made is reported (a directory filled before its watch was added too), a
move is one move (not a delete and a create), watches follow a directory
moved inside the tree and leave one moved out, nothing outside the tree is
ever watched (a symlink is never followed), lost events are recovered by a
walk, and events are read in batches rather than one wakeup each.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_idle

from casfs.promote.tracker import WriteTracker
from casfs.view import dirmode, inowatch
from casfs.view.inowatch import TreeWatch


class Record:
    """A Sink that keeps every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.walked: list[float] = []
        self.batches: list[int] = []  # the size of each opened() call

    def opened(self, rels: list[str]) -> None:
        self.batches.append(len(rels))
        self.calls.extend(("opened", rel) for rel in rels)

    def written(self, rel: str) -> None:
        self.calls.append(("written", rel))

    def closed(self, rel: str) -> None:
        self.calls.append(("closed", rel))

    def created(self, rel: str) -> None:
        self.calls.append(("created", rel))

    def changed(self, rel: str) -> None:
        self.calls.append(("changed", rel))

    def moved(self, src: str, dest: str) -> None:
        self.calls.append(("moved", src, dest))

    def removed(self, rel: str) -> None:
        self.calls.append(("removed", rel))

    def overflowed(self) -> None:  # called at each walk after an overflow
        self.calls.append(("overflowed",))
        self.walked.append(time.monotonic())

    def paths(self, kind: str) -> set[str]:
        return {c[1] for c in self.calls if c[0] == kind}

    def take(self) -> list[tuple[str, ...]]:
        out, self.calls = self.calls, []
        return out


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[Path, Record, TreeWatch]]:
    d = tmp_path / "tree"
    d.mkdir()
    (d / "pre" / "x").mkdir(parents=True)
    rec = Record()
    w = TreeWatch(d, rec, opens=True).start()
    try:
        yield d, rec, w
    finally:
        w.stop()
        w.join(5)
        assert not w.is_alive()


def _write(p: Path, data: bytes = b"x") -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def test_a_directory_filled_before_its_watch_is_reported_and_then_watched(tree) -> None:
    d, rec, w = tree
    # all of it lands before the reader's next batch: the watches for a, a/b, a/b/c
    # are added after their files were written
    for i in range(20):
        _write(d / "a" / "b" / "c" / f"f{i}")
    _write(d / "pre" / "x" / "g")
    wait_idle(w)
    assert {f"a/b/c/f{i}" for i in range(20)} <= rec.paths("created")
    assert "pre/x/g" in rec.paths("closed")
    assert {"", "pre", "pre/x", "a", "a/b", "a/b/c"} == set(w._wds)
    rec.take()
    _write(d / "a" / "b" / "c" / "later")
    wait_idle(w)
    assert ("closed", "a/b/c/later") in rec.calls


def test_a_rename_is_one_move_and_watches_follow_a_moved_directory(tree) -> None:
    d, rec, w = tree
    _write(d / "k" / "sub" / "f")
    wait_idle(w)
    rec.take()
    os.rename(d / "k" / "sub" / "f", d / "k" / "sub" / "g")
    os.rename(d / "k", d / "pre" / "k2")
    wait_idle(w)
    assert rec.take() == [("moved", "k/sub/f", "k/sub/g"), ("moved", "k", "pre/k2")]
    assert "pre/k2/sub" in w._wds and "k/sub" not in w._wds
    _write(d / "pre" / "k2" / "sub" / "h")  # its old watch, named by its new path
    wait_idle(w)
    assert ("closed", "pre/k2/sub/h") in rec.calls
    assert not any(c[1] == "k/sub/h" for c in rec.calls)


def test_a_directory_moved_out_is_unwatched_and_one_moved_in_is_walked(
        tree, tmp_path: Path) -> None:
    d, rec, w = tree
    _write(d / "out" / "deep" / "f")
    wait_idle(w)
    rec.take()
    os.rename(d / "out", tmp_path / "gone")
    wait_idle(w)
    assert rec.take() == [("removed", "out")]
    assert not any(k.startswith("out") for k in w._wds)
    _write(tmp_path / "gone" / "deep" / "after")  # outside now: never reported
    _write(tmp_path / "elsewhere" / "in" / "q")
    os.rename(tmp_path / "elsewhere", d / "came")
    wait_idle(w)
    assert rec.paths("created") == {"came", "came/in", "came/in/q"}
    assert not any("after" in c[-1] for c in rec.calls)
    rec.take()
    _write(d / "came" / "in" / "q2")
    wait_idle(w)
    assert ("closed", "came/in/q2") in rec.calls


def test_a_symlink_is_never_followed_out_of_the_tree(tree, tmp_path: Path) -> None:
    d, rec, w = tree
    outside = tmp_path / "secret"
    _write(outside / "file")
    os.symlink(outside, d / "link")
    wait_idle(w)
    assert rec.paths("created") == {"link"}
    # a directory swapped for a symlink between its event and its watch: the walk
    # opens it beneath the root with no symlink followed, and refuses
    w._add_tree("link", report=True)
    assert "link" not in w._wds and "link/file" not in rec.paths("created")
    _write(outside / "new")
    wait_idle(w)
    assert not any("new" in c[-1] for c in rec.calls)


@pytest.mark.expect_log(r"the kernel's event queue overflowed")
def test_lost_events_are_recovered_by_a_walk(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A real IN_Q_OVERFLOW: the watch's queue made 8 events deep (the limit is read
    when an inotify instance is made), then 200 files written during one gather; then
    overflows again at once: its walk waits OVERFLOW_WALK_S after the first."""
    if os.geteuid() != 0:
        pytest.skip("setting fs.inotify.max_queued_events needs root")
    d = tmp_path / "tree"
    (d / "sub").mkdir(parents=True)
    knob = Path("/proc/sys/fs/inotify/max_queued_events")
    was = knob.read_text()
    real = inowatch.libc()

    class ShortQueue:  # the node-wide knob changed for as short a time as can be
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def inotify_init1(self, flags: int) -> int:
            knob.write_text("8")
            try:
                return int(real.inotify_init1(flags))
            finally:
                knob.write_text(was)

    rec = Record()
    tracker = WriteTracker()
    monkeypatch.setattr(inowatch, "OVERFLOW_WALK_S", 0.6)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(inowatch, "libc", lambda: ShortQueue())
        w = TreeWatch(d, rec).start()
    assert knob.read_text() == was
    try:
        with open(d / "sub" / "open_for_writing", "wb") as held:
            held.write(b"1")
            time.sleep(0.2)  # its IN_MODIFY read: open for writing
            for i in range(200):
                _write(d / "sub" / f"f{i}")
            _settle(w)
        assert w.overflows >= 1 and w.walks >= 1 and ("overflowed",) in rec.calls
        assert {f"sub/f{i}" for i in range(200)} <= rec.paths("created")
        assert w.flush() is False  # events were lost: a release walks the tree
        walks = w.walks
        for i in range(200):  # into a watched directory (a new one may be walked whole)
            _write(d / "sub" / f"g{i}")
        _settle(w)
        assert w.walks > walks and len(rec.walked) == w.walks
        assert {f"sub/g{i}" for i in range(200)} <= rec.paths("created")
        gaps = [b - a for a, b in zip(rec.walked, rec.walked[1:], strict=False)]
        assert min(gaps) >= 0.6 - 0.01, gaps  # never two walks within OVERFLOW_WALK_S
    finally:
        w.stop()
        w.join(5)
    # the handler: what was being written counts as closed (its close may be lost)
    h = dirmode._Handler(tracker)
    h.written("sub/open_for_writing")
    assert tracker.has_writers("sub/open_for_writing")
    h.overflowed()
    assert not tracker.has_writers("sub/open_for_writing") and not h.writing
    assert "sub/open_for_writing" in tracker.quiet(0.0)


def _settle(w: TreeWatch) -> None:
    """Until no walk is due and no event came for a while."""
    deadline = time.monotonic() + 10
    while True:
        wait_idle(w)
        if w._walk_due is None or time.monotonic() > deadline:
            return


def test_events_are_read_in_batches_not_one_wakeup_each(tree) -> None:
    d, rec, w = tree
    wait_idle(w)
    before_events, before_drains = w.events, w.drains
    for i in range(300):  # a Triton-like put: a temp file written, closed, renamed
        tmp = d / "pre" / f".tmp{i}"
        _write(tmp, b"kernel" * 100)
        os.rename(tmp, d / "pre" / f"k{i}.so")
    wait_idle(w)
    events, drains = w.events - before_events, w.drains - before_drains
    assert events >= 300 * 4
    assert drains * 10 <= events, (events, drains)  # woken per event: drains ~ events
    assert {f"k{i}.so" for i in range(300)} <= {c[2].rsplit("/", 1)[-1] for c in rec.calls
                                                 if c[0] == "moved"}


def test_a_jobs_opens_are_told_in_batches(tree) -> None:
    """dir mode records each open in the access profile with an index lookup: a job's
    start opens thousands of files, told a drain at a time (one batched lookup each)."""
    d, rec, w = tree
    for i in range(400):
        _write(d / "pre" / "x" / f"f{i}")
    wait_idle(w)
    rec.take()
    rec.batches.clear()
    for i in range(400):
        (d / "pre" / "x" / f"f{i}").read_bytes()
    wait_idle(w)
    assert rec.paths("opened") == {f"pre/x/f{i}" for i in range(400)}
    assert sum(rec.batches) >= 400 and len(rec.batches) * 10 <= sum(rec.batches), rec.batches


def test_stop_is_prompt_while_events_flow(tree) -> None:
    d, _, w = tree
    _write(d / "f")
    time.sleep(0.01)
    t0 = time.monotonic()
    w.stop()
    w.join(5)
    assert not w.is_alive() and time.monotonic() - t0 < inowatch.GATHER_S * 4
    # its fds are closed, and a later stop writes to none (the number may be reused:
    # a byte written there would land in some other file of the mount process)
    r, wfd = os.pipe()
    try:
        assert w._stop_w == -1 and w._fd == -1
        w.stop()
        os.set_blocking(r, False)
        with pytest.raises(BlockingIOError):
            os.read(r, 1)
    finally:
        os.close(r)
        os.close(wfd)


def test_the_dir_mode_handler_feeds_the_tracker(tmp_path: Path) -> None:
    """dirmode.watch end to end: written, closed, renamed, removed, with a real tracker."""
    tracker = WriteTracker()
    opened: list[str] = []
    w = dirmode.watch(tmp_path, tracker, on_open=opened.extend)
    try:
        f = open(tmp_path / "a.tmp", "wb")  # noqa: SIM115 (held open across the check)
        f.write(b"1")
        f.flush()
        wait_idle(w)
        assert tracker.has_writers("a.tmp")
        f.close()
        os.rename(tmp_path / "a.tmp", tmp_path / "a")
        _write(tmp_path / "d" / "b")
        wait_idle(w)
        assert not tracker.has_writers("a.tmp") and not tracker.has_writers("a")
        assert {"a", "d/b"} <= set(tracker.quiet(0.0))
        assert "a.tmp" not in tracker.quiet(0.0)
        (tmp_path / "a").read_bytes()
        os.remove(tmp_path / "d" / "b")
        wait_idle(w)
        assert "a" in opened and "d/b" not in tracker.quiet(0.0)
        tracker.forget("a")
        assert "a" not in tracker.quiet(0.0)
        os.chmod(tmp_path / "a", 0o755)  # a mode change is promoted again, and no writer
        wait_idle(w)
        assert "a" in tracker.quiet(0.0) and not tracker.has_writers("a")
    finally:
        w.stop()
        w.join(5)


@pytest.mark.expect_log(r"not watching .* for writes: .*Too many open files")
def test_a_node_out_of_inotify_instances_mounts_unwatched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """inotify_init1 failing (EMFILE: fs.inotify.max_user_instances, 128 by default,
    reached by a node's other watchers) is a warning, not a failed mount."""
    import ctypes
    import errno

    class NoInstances:
        def inotify_init1(self, flags: int) -> int:
            ctypes.set_errno(errno.EMFILE)
            return -1

    monkeypatch.setattr(inowatch, "libc", lambda: NoInstances())
    with pytest.raises(OSError, match="Too many open files"):
        TreeWatch(tmp_path, Record()).start()
    w = dirmode.watch(tmp_path, WriteTracker())
    w.stop()
    w.join(1)
    assert not isinstance(w, TreeWatch)


@pytest.mark.expect_log(r"and further directories not watched: 3 directories watched")
def test_a_tenant_cannot_use_up_roots_inotify_watches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Watches count against root's node-wide limit: a tree gets at most its budget
    (an eighth of fs.inotify.max_user_watches), one warning, and the rest goes
    unwatched (found by the rescans)."""
    limit = int(Path("/proc/sys/fs/inotify/max_user_watches").read_text())
    assert inowatch.watch_budget() == max(1024, limit // 8)
    monkeypatch.setattr(inowatch, "watch_budget", lambda: 3)
    for i in range(6):
        (tmp_path / f"d{i}").mkdir()
    rec = Record()
    w = TreeWatch(tmp_path, rec).start()
    try:
        assert len(w._wds) == 3 and "" in w._wds
        (tmp_path / "new").mkdir()
        _write(tmp_path / "new" / "f")
        wait_idle(w)
        assert len(w._wds) == 3 and ("created", "new") in rec.calls
        assert w.flush() is False  # writes beneath "new" go untold
    finally:
        w.stop()
        w.join(5)


def test_a_directory_filled_and_renamed_into_place_is_tracked_at_its_new_path(
        tmp_path: Path) -> None:
    """Triton's and Inductor's way: a temp dir made, filled and renamed into place,
    often all before the reader's next batch (its creation read after the rename:
    the walk then finds it at its new path only). Either way the tracker ends with
    the final paths dirty and no temp path."""
    tracker = WriteTracker()
    w = dirmode.watch(tmp_path, tracker)
    try:
        for i in range(20):
            tmp = tmp_path / f".tmp.{i}"
            tmp.mkdir()
            for j in range(3):
                (tmp / f"k{j}").write_bytes(b"x" * 100)
            os.rename(tmp, tmp_path / f"key{i}")
            if i % 5 == 0:
                time.sleep(inowatch.GATHER_S * 1.5)  # some land after a drain, some in one
        assert isinstance(w, TreeWatch)
        wait_idle(w)
        dirty = set(tracker.quiet(0.0))
        assert {f"key{i}/k{j}" for i in range(20) for j in range(3)} <= dirty
        assert not any(p.startswith(".tmp") for p in dirty)
        assert {f"key{i}" for i in range(20)} <= set(w._wds)
        (tmp_path / "key7" / "late").write_bytes(b"y")
        wait_idle(w)
        assert "key7/late" in tracker.quiet(0.0)
    finally:
        w.stop()
        w.join(5)


@pytest.mark.expect_log(r"an event not handled \(1 so far\)")
def test_a_failing_sink_does_not_stop_the_watch(tmp_path: Path) -> None:
    """A recording that raises (dir mode's on_open writes the index) costs that event
    only: the watch goes on, and logs the first failure with its traceback."""

    class Flaky(Record):
        def created(self, rel: str) -> None:
            if rel == "bad":
                raise RuntimeError("recording failed")
            super().created(rel)

    rec = Flaky()
    w = TreeWatch(tmp_path, rec).start()
    try:
        _write(tmp_path / "bad")
        wait_idle(w)
        _write(tmp_path / "good")
        wait_idle(w)
        assert w.is_alive() and w.errors == 1
        assert ("created", "good") in rec.calls and ("closed", "bad") in rec.calls
        assert w.flush() is False  # the sink may not know "bad"
    finally:
        w.stop()
        w.join(5)


def test_flush_tells_what_is_queued_now_and_vouches_for_it(tree) -> None:
    """A release (or `casfs publish`) of a dir-mode directory asks the watch instead of
    walking every restored file: ``flush`` dispatches, in the caller's thread, every
    event queued so far, including a new directory's files written before its watch,
    and says the watch missed nothing. The reader is held off meanwhile (its drain
    lock), so only the flush can have told these."""
    d, rec, w = tree
    wait_idle(w)
    rec.take()
    with w._drain_lock:
        for i in range(50):
            _write(d / "pre" / f"k{i}")
        _write(d / "new" / "deep" / "f")  # its watch is added by the flush itself
        tmp = d / "pre" / "x" / ".tmp"
        _write(tmp)
        os.rename(tmp, d / "pre" / "x" / "done")
        time.sleep(inowatch.GATHER_S * 2)  # the reader would have woken by now
        assert rec.calls == []
        assert w.flush() is True
        assert {f"pre/k{i}" for i in range(50)} <= rec.paths("closed")
        assert "new/deep/f" in rec.paths("created") and "new/deep" in w._wds
        assert ("moved", "pre/x/.tmp", "pre/x/done") in rec.calls
    w.stop()
    w.join(5)
    assert w.flush() is False  # stopped: nothing is told any more
