"""A tenant's FUSE mount inside her directory never holds up casfs (a review's note,
2026-12-05; confirmed here before the fix).

Where /etc/fuse.conf has ``user_allow_other`` (common on HPC nodes) a user may
mount a FUSE file system, served by a process of hers, on a directory or a file
she owns with ``allow_other``: root's calls into it are then sent to her server,
which need never answer. Before: dir mode's watch opened her mount point as a
directory to watch it, promotion's walk and its lstat crossed into it, and the
busy check stat()ed every fd open at a path of her directory, each a request
her server left unanswered: the watch's reader, the release's flush or walk,
and with them every job's publication on the mount, stuck for good. Now nothing
crosses a mount point beneath a tenant's directory (``RESOLVE_NO_XDEV``; the
fallback checks the kernel's mount-root attribute), a file's identity is read
without asking a FUSE server (casfs.util.statx), and what lies beneath a mount
is a miss, and root enters no directory on another user's FUSE mount (hers,
stacked over the directory she owns). The servers are mounted in a real user's
directory by root, or as her (``user_id`` hers, as fusermount3 would make it
with ``user_allow_other``; this machine's fuse.conf is left alone), and answer
nothing once told to.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from casfs.node import control
from casfs.util import beneath
from casfs.util.bounded import StillBlocked, call_bounded
from casfs.view import session
from casfs.view.dirmode import open_for_writing
from casfs.view.inowatch import TreeWatch
from tests.security.hangfs import abort
from tests.security.test_dir_mode_symlinks import publish, service
from tests.users import RealUser, open_tmp, real_users

T = TypeVar("T")
_calls = itertools.count()
REPO = Path(__file__).resolve().parents[2]
BOUND_S = 20.0


def bounded(fn: Callable[[], T]) -> T:
    """``fn()``'s result (or its exception) if it returns within BOUND_S, else a failure
    naming where it waits (the thread stays blocked until the fixture aborts her
    server's connection)."""
    key = f"hangfs-{next(_calls)}"
    try:
        return call_bounded(key, fn, BOUND_S)
    except StillBlocked:
        stuck = next((t for t in threading.enumerate() if t.name == f"bounded:{key}"), None)
        frame = sys._current_frames().get(stuck.ident or 0) if stuck else None
        where = "".join(traceback.format_stack(frame)[-4:]) if frame else "?"
        pytest.fail(f"waited on her FUSE server, at:\n{where}")


class HerMounts:
    """Her two mounts in ``directory``: one on the directory KEY, one on the file
    FILE/k.bin; ``hang()`` makes both servers stop answering."""

    def __init__(self, directory: Path, user: RealUser) -> None:
        self.directory, self.flag = directory, directory.parent / "hang-now"
        (directory / "KEY").mkdir()
        (directory / "FILE").mkdir()
        (directory / "FILE" / "k.bin").write_bytes(b"underneath\n")
        for p in ("KEY", "FILE", "FILE/k.bin"):
            os.chown(directory / p, user.uid, user.gid)
        self.points = [directory / "KEY", directory / "FILE" / "k.bin"]
        self.procs: list[subprocess.Popen[str]] = []
        for mp in self.points:
            proc = subprocess.Popen([sys.executable, "-m", "tests.security.hangfs", str(mp),
                                     str(self.flag)], cwd=REPO, stdout=subprocess.PIPE,
                                    text=True)
            self.procs.append(proc)
            line = proc.stdout.readline().strip() if proc.stdout else ""
            assert line == "mounted", f"her server did not mount at {mp}"
        assert (directory / "KEY" / "k").read_bytes() == b"hers\n"  # served, for now

    def hang(self) -> None:
        self.flag.write_text("")

    def close(self) -> None:
        for mp in self.points:
            abort(mp)
        for proc in self.procs:
            proc.kill()
            proc.wait()


@pytest.fixture
def setting() -> Iterator[tuple[RealUser, Path]]:
    with open_tmp() as d, real_users(1, d) as users:
        yield users[0], d


@pytest.fixture
def her(setting: tuple[RealUser, Path]) -> Iterator[HerMounts]:
    user, d = setting
    directory = d / "hers"
    directory.mkdir()
    os.chown(directory, user.uid, user.gid)
    mounts = HerMounts(directory, user)
    try:
        yield mounts
    finally:
        mounts.close()


@pytest.fixture(params=["openat2", "fallback"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "fallback":
        monkeypatch.setattr(beneath, "use_openat2", False)
    return str(request.param)


def test_nothing_beneath_her_mount_is_reached(her: HerMounts, resolver: str) -> None:
    her.hang()
    base = beneath.open_base(her.directory)
    try:
        calls: list[Callable[[], object]] = [
            lambda: beneath.lstat(base, "KEY"),
            lambda: beneath.lstat(base, "KEY/k"),
            lambda: beneath.lstat(base, "FILE/k.bin"),
            lambda: beneath.open_read(base, "FILE/k.bin"),
            lambda: beneath.open_read(base, "KEY/k"),
            lambda: beneath.open_dir(base, "KEY"),
            lambda: beneath.create(base, "KEY/new"),
            lambda: beneath.mkdirs(base, "KEY/sub"),
        ]
        for call in calls:
            with pytest.raises(OSError) as refused:
                bounded(call)
            assert refused.value.errno in beneath.REFUSED, refused.value
        # A walk lists the mount point's name (from the directory it sits in), never
        # what her server would say is beneath it.
        assert bounded(lambda: list(beneath.walk(base, "FILE"))) == ["FILE/k.bin"]
        assert bounded(lambda: list(beneath.walk(base, "KEY"))) == []
        assert not beneath.lexists(base, "nothing-here")
    finally:
        os.close(base)


class Quiet:
    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *a: None


def test_the_watch_and_the_busy_check_never_ask_her_server(her: HerMounts) -> None:
    # Her process holds a file of her mount open for writing at a path of her directory
    # (what the busy check looks for), then her server stops answering.
    holder = subprocess.Popen(["sh", "-c", f"exec 3>>{her.directory}/KEY/k; echo held;"
                               " exec sleep 60"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        her.hang()
        assert bounded(lambda: open_for_writing(her.directory, ["KEY/k", "FILE/k.bin"])) \
            == set()  # hers, beneath a mount: nothing casfs would publish
        w = bounded(lambda: TreeWatch(her.directory, Quiet(), opens=True).start())
        try:
            (her.directory / "new.bin").write_bytes(b"x")
            assert bounded(w.flush)  # it can vouch: nothing casfs serves went untold
        finally:
            w.stop()
            w.join(5)
    finally:
        abort(her.points[0])  # her fd's close would wait on the server too
        holder.kill()
        holder.wait()


def test_a_dir_mode_mount_promotes_around_her_mounts(setting: tuple[RealUser, Path]) -> None:
    """The mount as casfsd runs it (dir mode, root, the tenant a real user): her hanging
    mounts in the directory, her job's new kernel beside them; the final promotion walks
    the directory (nothing watched it here), publishes the kernel, and the mount closes."""
    user, d = setting
    svc = service(d, user, "generic", stable_after=0.0)
    cfg = svc.cfg
    mounts: HerMounts | None = None
    try:
        svc.server.restore()  # type: ignore[attr-defined]  # what serving starts with
        mp = cfg.mountpoint
        mounts = HerMounts(mp, user)
        r = user.sh(f"mkdir -p {mp}/NEW && echo kernel > {mp}/NEW/k.bin")
        assert r.returncode == 0, r.stderr
        mounts.hang()
        assert bounded(lambda: svc.promote_once(final=True)) == 1
        out = bounded(lambda: svc.publish_once(final=True))
        assert out["ok"] and out["added"] == 1, out  # NEW/k.bin: nothing of hers
        bounded(svc.close)
    finally:
        if mounts is not None:
            mounts.close()
        svc.close()



@pytest.mark.expect_log(r"on a FUSE file system of uid \d+: not entered")
def test_her_mount_over_the_whole_directory_is_not_entered(
        setting: tuple[RealUser, Path]) -> None:
    """She owns the directory itself, so she may stack her mount on it: casfs stops
    acting there (a warning naming it), never waits on her server, and closes."""
    user, d = setting
    ns = f"{user.tenant}~ns"
    publish(d / "root", ns, {"KEY/k.json": b"{}"})
    svc = service(d, user, "generic", stable_after=0.0)
    mp = svc.cfg.mountpoint
    flag = d / "hang-now"
    proc: subprocess.Popen[str] | None = None
    try:
        svc.server.restore()  # type: ignore[attr-defined]
        assert (mp / "KEY/k.json").read_bytes() == b"{}"
        (mp / "KEY/mine.bin").write_bytes(b"the job's")  # unpublished, beneath her mount
        proc = subprocess.Popen([sys.executable, "-m", "tests.security.hangfs", str(mp),
                                 str(flag), str(user.uid)], cwd=REPO,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "mounted"
        flag.write_text("")
        publish(d / "root", ns, {"OTHER/x": b"x"})
        assert bounded(svc.refresh_once)["ok"]
        assert bounded(lambda: svc.promote_once(final=True)) == 0
        bounded(svc.close)
    finally:
        abort(mp)
        if proc is not None:
            proc.kill()
            proc.wait()
        svc.close()
    assert not (mp / "OTHER").exists()  # her mount gone: nothing was written through it
    assert (mp / "KEY/mine.bin").read_bytes() == b"the job's"


@contextlib.contextmanager
def hanging_on(mp: Path, user: RealUser, as_her: bool = True
               ) -> Iterator[subprocess.Popen[str]]:
    """Her server (``user_id`` hers, or root's) mounted on the new directory ``mp`` she
    owns, answering nothing from the start; aborted and stopped on exit."""
    mp.mkdir()
    os.chown(mp, user.uid, user.gid)
    flag = mp.parent / f"hang-now-{mp.name}"
    proc = subprocess.Popen([sys.executable, "-m", "tests.security.hangfs", str(mp), str(flag),
                             *([str(user.uid)] if as_her else [])], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "mounted"
        flag.write_text("")
        yield proc
    finally:
        abort(mp)
        proc.kill()
        proc.wait()


def test_a_stale_mount_check_never_asks_her_server(setting: tuple[RealUser, Path]) -> None:
    """Before serving, a mount point is probed for a dead casfs mount (stat, statfs:
    ENOTCONN). Her mount stacked there (``user_id`` hers) is not casfs's: never asked."""
    user, d = setting
    mp = d / "mp"
    with hanging_on(mp, user):
        assert bounded(lambda: session.clear_stale_mount(mp)) is False


@pytest.mark.parametrize("who", ["hers", "stuck"])
def test_casfs_doctor_never_waits_on_a_mount(setting: tuple[RealUser, Path], who: str) -> None:
    """``casfs doctor`` (an operator's first command at 3 a.m.) stat()ed every running
    mount's mount point: it waited for good, reporting nothing, on a tenant's FUSE mount
    stacked there, and on one of casfs's own whose process is stuck. Now it reads the
    mount table first (hers: never asked) and bounds its probe of its own (5 s), and
    its report names each. (A thread stuck on a FUSE request cannot be killed, so in
    the second case the process itself ends only once the mount answers or is
    aborted: the report is written before.)"""
    user, d = setting
    mp = d / "mp"
    doctor: subprocess.Popen[bytes] | None = None
    # "stuck": a FUSE mount of root's whose server answers nothing (as a casfs mount
    # process that hangs would); "hers": her own, stacked on her mount point.
    with hanging_on(mp, user, as_her=who == "hers") as proc:
        state = d / "state"
        control.write_registry(state / "run", "hangfs", {
            "name": "hangfs", "pid": proc.pid, "mountpoint": str(mp),
            "socket": str(d / "nothing.sock")})
        report = d / "report.json"
        with open(report, "wb") as out:
            doctor = subprocess.Popen(
                [sys.executable, "-m", "casfs.cli.main", "--root", str(d / "root"),
                 "--state-dir", str(state), "doctor", "--json"], stdout=out,
                stderr=subprocess.DEVNULL)
        checks = bounded(lambda: _report(report))
        assert checks["mounts"]["status"] == "fail", checks["mounts"]
        want = ("another user's FUSE mount (hangfs) is stacked on it" if who == "hers"
                else "no answer within 5 s")
        assert f"{mp}: {want}" in checks["mounts"]["detail"], checks["mounts"]
    assert doctor is not None and doctor.wait(30) == 1  # it ends (1: a failed check) once freed


def _report(path: Path) -> dict[str, dict[str, str]]:
    """casfs doctor's --json report, once it is whole."""
    while True:
        try:
            return {c["check"]: c for c in json.loads(path.read_text())}
        except ValueError:
            time.sleep(0.1)


def test_casfs_umount_takes_her_mount_off_a_path_without_asking_it(
        setting: tuple[RealUser, Path]) -> None:
    """``casfs umount PATH`` where no casfs process serves: her hanging mount there is
    detached (its mount root read from the kernel's attribute; before, an lstat of it
    waited on her server for good)."""
    user, d = setting
    mp = d / "mp"
    with hanging_on(mp, user):
        out = bounded(lambda: subprocess.run(
            [sys.executable, "-m", "casfs.cli.main", "--state-dir", str(d / "state"),
             "umount", str(mp)], capture_output=True, text=True, check=False))
        assert out.returncode == 0, out.stderr
        assert f"unmounted {mp}" in out.stdout
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        assert not any(ln.split()[1] == str(mp) for ln in mounts)


@pytest.mark.expect_log(r"detached a FUSE mount \(hangfs\) of uid \d+ stacked on it")
def test_her_mount_on_her_mount_point_is_detached_at_start(
        setting: tuple[RealUser, Path]) -> None:
    """Her own FUSE mount on her dir-mode mount point (no ``allow_other`` needed: root's
    stat is then EACCES) stopped casfsd's start, for every tenant: the mount process's
    first stat of the path went to her server (found by a review on 2026-12-06). The
    mount table names it; it is detached (MNT_DETACH asks her server nothing) and the
    namespace is served there."""
    from casfs.node.config import MountConfig
    from casfs.node.guard import mounts_at
    from casfs.node.mount import MountService
    from casfs.tenants import DEFAULT_POLICY

    user, d = setting
    tenant = user.tenant
    (d / "mnt" / tenant).mkdir(parents=True)
    mp = d / "mnt" / tenant / "ns"
    cfg = MountConfig(name=f"{tenant}/ns", family="generic", namespace=f"{tenant}~ns",
                      mountpoint=mp, root=d / "root", state_dir=d / "state", mode="dir",
                      tenant=tenant, tenants=DEFAULT_POLICY.to_dict(), stable_after=0.2)
    with hanging_on(mp, user):
        svc = bounded(lambda: MountService(cfg, hosted=True))
        try:
            assert not any(m.fstype.startswith("fuse") for m in mounts_at(mp))
            assert mp.is_dir() and mp.stat().st_uid == user.uid  # hers, served by casfs
        finally:
            svc.close()
