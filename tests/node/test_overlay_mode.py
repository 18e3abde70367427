"""The `overlay` view mode: kernel overlayfs over hard links to local objects and a
read-only casfs FUSE view; writes in a node-local upper, promoted and published."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from casfs.node import guard
from casfs.view import overlay

from .test_two_nodes import published, seed

pytestmark = pytest.mark.fuse


def _fstype(path: Path) -> str | None:
    target = os.path.realpath(path)
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if parts[4] == target:
                found = parts[parts.index("-") + 1]
    return found


def test_overlay_mode(cluster: dict[str, Any], tmp_path: Path) -> None:
    if (why := overlay.unavailable_reason()) is not None:
        pytest.skip(why)
    a, b = cluster["a"], cluster["b"]
    files = {f"K{i}/k.cubin": os.urandom(3000 + i) for i in range(4)}
    seed(cluster["root"], files, tmp=tmp_path)

    # Node b reads K0 once through a fuse mount: its object is now on the node.
    w = b.mount()
    assert (w.cfg.mountpoint / "K0" / "k.cubin").read_bytes() == files["K0/k.cubin"]
    b.stop(w)

    w = b.mount(mode="overlay")
    mnt = w.cfg.mountpoint
    assert _fstype(mnt) == "overlay"
    st = b.ask(w, "stats")["counters"]
    assert st["overlay_linked"] == 1  # K0's object; the rest comes through FUSE
    assert st["overlay_sealed_dirs"] == 1  # K0/ is wholly local: not merged with FUSE
    assert "overlay_synced" not in st  # no warm wait installed anything: nothing to sync
    for rel, data in files.items():
        assert (mnt / rel).read_bytes() == data

    # A write lands in the upper at native speed and is promoted and published.
    (mnt / "NEW").mkdir()
    (mnt / "NEW" / "k.so").write_bytes(b"new kernel")
    # Rewriting a linked file in place copies it up: the cached object stays intact.
    obj = b.state / "objects"
    digest = published(cluster["root"])["K0/k.cubin"].digest
    cached = obj / digest[:2] / digest[2:]
    with open(mnt / "K0" / "k.cubin", "r+b") as f:
        f.write(b"XX")
    assert cached.read_bytes() == files["K0/k.cubin"]
    assert (mnt / "K0" / "k.cubin").read_bytes()[:2] == b"XX"
    # Deleting a lower file: an overlayfs whiteout (0/0 char device) in the upper.
    os.unlink(mnt / "K1" / "k.cubin")
    assert not (mnt / "K1" / "k.cubin").exists()
    wh = os.lstat(w.cfg.upper / "K1" / "k.cubin")
    assert stat.S_ISCHR(wh.st_mode) and wh.st_rdev == 0

    def new_published() -> bool:
        b.ask(w, "publish")
        return "NEW/k.so" in published(cluster["root"])

    wait_until(new_published, "NEW/k.so never published")
    assert published(cluster["root"])["NEW/k.so"].extras["pack"]  # promoted into a pack
    assert "K1/k.cubin" in published(cluster["root"])  # local deletions are not published

    # Refresh under the mounted overlay: a new entry at a name never looked up appears.
    wa = a.mount(mountpoint=cluster["mnt"] / "a")
    (wa.cfg.mountpoint / "LATE").mkdir()
    (wa.cfg.mountpoint / "LATE" / "k.cubin").write_bytes(b"late")
    a.stop(wa)
    assert "LATE/k.cubin" in published(cluster["root"])
    assert b.ask(w, "refresh")["ok"]
    assert (mnt / "LATE" / "k.cubin").read_bytes() == b"late"

    b.stop(w)
    assert _fstype(mnt) is None
    assert _fstype(b.state / "overlay" / "testns" / "fuse") is None


def test_wait_warm_links_the_hot_set(cluster: dict[str, Any], tmp_path: Path) -> None:
    """wait_warm: a fresh node fetches the access profile's hot set before the overlay
    is mounted, so the kernel serves it from the links layer (no FUSE open), while a
    file outside the profile still comes through the FUSE layer."""
    if (why := overlay.unavailable_reason()) is not None:
        pytest.skip(why)
    a, b = cluster["a"], cluster["b"]
    seed(cluster["root"], {"COLD/k.bin": b"cold" * 500}, tmp=tmp_path)  # no profile
    hot = {f"H{i}/k.bin": os.urandom(5000 + i) for i in range(5)}
    w = a.mount()
    for rel, data in hot.items():
        (w.cfg.mountpoint / rel).parent.mkdir()
        (w.cfg.mountpoint / rel).write_bytes(data)
    wait_until(lambda: b.ask(w, "publish") and set(hot) <= set(published(cluster["root"])),
               "hot files never published")
    a.stop(w)  # publishes the profile: the files a wrote

    w = b.mount(mode="overlay", wait_warm=60)
    mnt = w.cfg.mountpoint
    st = b.ask(w, "stats")
    c = st["counters"]
    assert st["warm_ready_s"] is not None and st["mount_ready_s"] is not None
    assert st["warm_ready_s"] <= st["mount_ready_s"]  # warm before the job could start
    assert c["prefetched_files"] == 5 and c["warm_waits"] == 1
    assert "warm_wait_timeouts" not in c
    assert c["overlay_linked"] == 5  # every hot file, none of the cold one
    # linked as the prefetch installed them, during the wait (EarlyLinks), not after it
    assert c["overlay_linked_early"] == 5
    # what the wait installed is written to disk beside the job, not at its unmount
    wait_until(lambda: b.ask(w, "stats")["counters"].get("overlay_synced") == 1,
               "the fetched objects synced after mount-ready")
    # casfs run --wait-warm's prewarm: one lookup of each linked file through the
    # overlay; the hot dirs are sealed, so none reaches the FUSE layer
    links = b.state / "overlay" / "testns" / "links"
    stopped = threading.Event()
    stopped.set()  # the job ended before the prewarm began: it looks nothing up
    assert overlay.prewarm(links, mnt, stopped) == 0
    assert _fstype(mnt) == "overlay" and overlay.prewarm(links, mnt) == 5
    c2 = b.ask(w, "stats")["counters"]
    assert c2.get("lookup_lower", 0) == c.get("lookup_lower", 0)
    entries = published(cluster["root"])
    for rel, data in hot.items():
        assert (mnt / rel).read_bytes() == data
        obj = b.state / "objects" / entries[rel].digest[:2] / entries[rel].digest[2:]
        assert (links / rel).samefile(obj)
        assert os.stat(mnt / rel).st_ino == os.stat(obj).st_ino  # the cache object itself
    c = b.ask(w, "stats")["counters"]
    assert c.get("open_lower", 0) == 0  # the kernel served every hot file: no FUSE open
    assert (mnt / "COLD" / "k.bin").read_bytes() == b"cold" * 500
    # The cold file came through FUSE (the job's open, and fanotify's event fd's)
    c3 = b.ask(w, "stats")["counters"]
    assert c3["open_lower"] >= 1
    assert c3["lookup_lower"] > c2.get("lookup_lower", 0)  # the FUSE layer counts lookups
    final = b.stop(w)
    assert final is not None and final["warm_ready_s"] == st["warm_ready_s"]


def test_casfs_run_stops_its_overlay_processes_at_once(tmp_path: Path) -> None:
    """``casfs run --mode overlay`` serves each family from a process of its own; after
    the job they all get their stop signal together (each stop is a final publication
    and an unmount, ~0.45 s on a fresh node: two in a row were the job's wait twice)."""
    import subprocess
    import sys

    if (why := overlay.unavailable_reason()) is not None:
        pytest.skip(why)
    flag = tmp_path / "go"
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"), CASFS_STATE_DIR=str(tmp_path / "s"),
               CASFS_MOUNT_BASE=str(tmp_path / "mnt"), CASFS_SERVE_BASE=str(tmp_path / "serve"),
               CASFS_SOCKET=str(tmp_path / "no-casfsd.sock"),
               CASFS_PAUSEPOINT="overlay-shutdown", CASFS_PAUSEPOINT_FILE=str(flag),
               CASFS_PAUSEPOINT_MAX="60")
    job = ("import os\nfor v in ('TRITON_CACHE_DIR', 'TORCHINDUCTOR_CACHE_DIR'):\n"
           "    open(os.path.join(os.environ[v], 'x'), 'w').write(v)\n")
    proc = subprocess.Popen([sys.executable, "-m", "casfs.cli.main", "run", "--mode", "overlay",
                             "--family", "triton,inductor", "--", sys.executable, "-c", job],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reached = Path(f"{flag}.reached")
    try:
        # Both processes hold in their stop before either may go on: stopped one after
        # another, the second is signalled only once the first is gone (after its
        # stop's 45 s bound, here: it holds until the flag).
        wait_until(lambda: reached.exists() and len(reached.read_text().split()) == 2,
                   "both overlay processes stopping at once", timeout=30, proc=proc)
    finally:
        flag.touch()
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert len(set(reached.read_text().split())) == 2  # two processes, one line each
    assert "triton" in err and "inductor" in err  # each family's summary line


def test_a_replaced_file_refreshed_under_the_overlay_never_reads_estale(
        cluster: dict[str, Any], tmp_path: Path) -> None:
    """A replaced path (the CUDA ComputeCache's ``index``, rewritten in place) served
    through the overlay's FUSE layer, then a newer version published and refreshed
    under the mounted overlay: reads give a whole version, never ESTALE. (The FUSE
    layer gave the path a new inode and invalidated its entry, which overlayfs, holding
    the old lower dentry, answered with ESTALE for the overlay's life.)"""
    if (why := overlay.unavailable_reason()) is not None:
        pytest.skip(why)
    a, b = cluster["a"], cluster["b"]
    w = a.mount(family="cuda", mountpoint=cluster["mnt"] / "a")
    (w.cfg.mountpoint / "index").write_bytes(b"v1" * 100)
    a.stop(w)
    assert "index" in published(cluster["root"])

    w = b.mount(family="cuda", mode="overlay", prefetch=False)  # served by the FUSE layer
    mnt = w.cfg.mountpoint
    assert (mnt / "index").read_bytes() == b"v1" * 100
    st = b.ask(w, "stats")["counters"]
    assert st.get("overlay_linked", 0) == 0  # nothing local at mount: not in the links

    wa = a.mount(family="cuda", mountpoint=cluster["mnt"] / "a")
    (wa.cfg.mountpoint / "index").write_bytes(b"version-2" * 300)  # longer
    a.stop(wa)
    assert published(cluster["root"])["index"].size == 9 * 300
    assert b.ask(w, "refresh")["ok"]
    for _ in range(3):
        data = (mnt / "index").read_bytes()  # an OSError (ESTALE) fails the test
        assert data in (b"v1" * 100, b"version-2" * 300), data[:40]
        assert os.stat(mnt / "index").st_size == len(data)
    assert data == b"version-2" * 300  # the newest version, replaced in place
    b.stop(w)


@pytest.mark.expect_log(r"detaching the (overlay a dead mount process left|dead FUSE layer)")
def test_a_killed_overlay_mount_process_leaves_nothing_the_next_start_fails_on(
        cluster: dict[str, Any], tmp_path: Path) -> None:
    """kill -9 of an overlay mode mount process nobody adopts (`casfs run`'s own): its
    dead FUSE layer and its overlay at the mount point stayed, and every later start of
    the namespace on the node failed on them (ENOTCONN: its jobs uncached for good; a
    review). The next start detaches both and serves."""
    if (why := overlay.unavailable_reason()) is not None:
        pytest.skip(why)
    a = cluster["a"]
    files = {"K0/k.cubin": os.urandom(3000)}
    seed(cluster["root"], files, tmp=tmp_path)
    w = a.mount(mode="overlay")
    mnt = w.cfg.mountpoint
    assert (mnt / "K0" / "k.cubin").read_bytes() == files["K0/k.cubin"]
    w.proc.kill()
    w.proc.wait(30)
    a.workers.remove(w)
    w = a.mount(mode="overlay")
    assert _fstype(w.cfg.mountpoint) == "overlay"
    assert (mnt / "K0" / "k.cubin").read_bytes() == files["K0/k.cubin"]
    (mnt / "after").write_bytes(b"written after the kill")
    assert a.ask(w, "publish")["ok"]
    assert "after" in published(cluster["root"])
    assert [m.fstype for m in guard.mounts_at(mnt)] == ["overlay"]  # one, not two stacked
