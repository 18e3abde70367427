"""Replacing a FUSE mount process under running jobs: the new one stacks, the old one drains.

A FUSE connection cannot change processes: libfuse answers every request with
EIO until it has seen FUSE_INIT, which the kernel sends once per connection,
and pyfuse3 has no way to mark a session initialised. So a planned restart
(docs/reliability.md, "Planned restarts") keeps the old connection and adds a
new one, with ``move_mount(2)``'s ``MOVE_MOUNT_BENEATH`` (Linux 6.5):

1. The successor (``spawn(..., replace=True)``, possibly a newer release) asks
   the predecessor named by the mount's registry entry to ``prepare``: it
   gives up the namespace's lock (holding ``ns-<ns>.draining`` shared instead),
   so the successor's MountService can be built. The predecessor serves on.
2. The successor mounts its FUSE session on a private staging directory
   (``<state>/run/staging-<name>``), serves it (its INIT completes there), and
   moves that mount *beneath* the predecessor's, at the mount point. Jobs see
   no change: the predecessor's mount is still on top.
3. It asks the predecessor to ``step_aside``: the predecessor checks that its
   own mount is the visible one with a FUSE mount right beneath it, detaches
   it (``umount2(MNT_DETACH)``: the top mount), and answers with the paths it
   holds open for writing. From that instant every new lookup reaches the
   successor; the mount point never shows the empty guard.
4. The predecessor keeps serving what jobs hold on its detached mount (open
   files, mapped ``.so`` files, cwds) for as long as they hold it; it stops
   refreshing and prefetching, keeps promoting and publishing what it tracks.
   The kernel ends the connection once the last reference is gone (its
   /dev/fuse read fails with ENODEV); then it promotes and publishes the rest
   (publication is multi-writer) and exits. It never unmounts a path then:
   the path is the successor's.

A predecessor that cannot (an older release: ``unknown command``; a format
version this one does not read; no CAP_SYS_ADMIN; a kernel before 6.5) makes
``prepare`` raise ``HandoverUnavailable``; the parent then stops the old
process and mounts again (casfs.node.worker.replace), saying so in one line.

overlay mode hands over the same way, its overlayfs mount in place of the FUSE
mount (``Handing.kind``): the successor mounts its own FUSE layer and links
layer (casfs.view.overlay, "per-process layers"), its overlay over the same
upper on the stage, and moves it beneath; the predecessor detaches its overlay
and its FUSE layer, and its connection ends when the last job lets go of the
old overlay (whose layers it holds). The predecessor's writers are found by
fdinfo's ``mnt_id`` (casfs.view.dirmode.writers_on_mount).

dir mode has no connection to keep: its jobs use a plain directory (the
tenant's filesystem's bind, with loopfs quotas). Its successor asks the
predecessor to ``leave``: it stops watching, publishes
what it tracks and exits leaving the directory and its bind in place; the
successor, which waited for that exit, binds nothing new and scans the
directory at its start for what was written meanwhile. Jobs see nothing.

The request and its replies carry ``handover_version`` (docs/format.md,
"Handover").
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from casfs.errors import CasfsError, DaemonStuckError
from casfs.node import control, guard, lifeline
from casfs.util import atomic
from casfs.util.crashpoint import crashpoint
from casfs.util.libc import libc

if TYPE_CHECKING:
    import trio

log = logging.getLogger(__name__)

HANDOVER_VERSION = 1  # the newest handover format this release speaks
HANDOVER_MIN_VERSION = 1  # the oldest it still reads
SYS_MOVE_MOUNT = {"x86_64": 429, "aarch64": 429}
AT_FDCWD = -100
MOVE_MOUNT_BENEATH = 0x200
MNT_DETACH = 2
_MS_BIND, _MS_PRIVATE = 4096, 1 << 18
PREPARE_TIMEOUT = 300.0  # a prepared predecessor whose successor never stepped it aside
CONTROL_TIMEOUT = 30.0


class HandoverUnavailable(CasfsError):
    """The mount process at the mount point cannot hand over: stop it, then mount again."""

    exit_code = 9


def unsupported() -> str | None:
    """Why this process cannot stack a mount beneath another (None: it can)."""
    if os.geteuid() != 0:
        return "moving a mount needs root (CAP_SYS_ADMIN)"
    if os.uname().machine not in SYS_MOVE_MOUNT:
        return f"move_mount's number on {os.uname().machine} is not known here"
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return None
    if (major, minor) < (6, 5):
        return f"Linux {os.uname().release} has no MOVE_MOUNT_BENEATH (6.5 or later)"
    return None


# --- mounts -------------------------------------------------------------------------
def _check(rc: int, what: str, path: Path) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}", str(path))


def move_mount(src: Path, dst: Path, beneath: bool) -> None:
    """The mount at ``src`` to ``dst``: on top, or beneath the mount visible there."""
    call = libc().syscall
    call.restype = ctypes.c_long
    rc = call(ctypes.c_long(SYS_MOVE_MOUNT[os.uname().machine]), ctypes.c_int(AT_FDCWD),
              ctypes.c_char_p(os.fsencode(src)), ctypes.c_int(AT_FDCWD),
              ctypes.c_char_p(os.fsencode(dst)),
              ctypes.c_uint(MOVE_MOUNT_BENEATH if beneath else 0))
    _check(int(rc), "move_mount", dst)


def detach(path: Path) -> None:
    """Lazily unmount the mount visible at ``path`` (the top one)."""
    _check(libc().umount2(os.fsencode(path), MNT_DETACH), "umount2", path)


def top(path: Path) -> guard.MountEntry | None:
    found = guard.mounts_at(path)
    return found[-1] if found else None


def stage_dir(run_dir: Path, name: str) -> Path:
    return run_dir / f"staging-{name}"


def prepare_stage(path: Path) -> None:
    """A private mount of the (root-only) staging dir itself: a mount can be moved
    only from under a parent that is not shared (systemd shares every mount)."""
    drop_stage(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = os.fsencode(path)
    _check(libc().mount(target, target, None, _MS_BIND, None), "bind", path)
    _check(libc().mount(None, target, None, _MS_PRIVATE, None), "make private", path)


def drop_stage(path: Path) -> None:
    """Detach whatever is left on the staging dir (its bind mount; a failed start's FUSE)."""
    for _ in range(8):
        if not guard.mounts_at(path):
            return
        with contextlib.suppress(OSError):
            detach(path)


# --- one session's part ---------------------------------------------------------------
@dataclass
class Handing:
    """A FUSE session's part in handovers (casfs.view.session.serve reads it)."""

    kind: str = "fuse"  # the mount handed over: "fuse", or "overlay" (overlay mode)
    stage: Path | None = None  # a successor's: the session mounts here first
    mount_id: int | None = None  # its mount, once mounted (a move keeps the id)
    moved: bool = False  # moved to the mount point: libfuse's own path is the stage's
    stepped_aside: bool = False  # detached for a successor: serve until the kernel ends it
    ended: bool = False  # stepped aside, and the kernel ended the connection: all closed
    drained: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def ours(self, m: guard.MountEntry | None) -> bool:
        """``m`` is a mount of the kind handed over here (a guard is not)."""
        return m is not None and m.fstype.startswith(self.kind) and not guard.is_guard(m)

    def mounted(self, path: Path) -> None:
        t = top(path)
        self.mount_id = t.id if t is not None and self.ours(t) else None

    def detach_own(self, mountpoint: Path) -> None:
        """Detach this session's mount, found by its id at the mount point or the
        stage (never a successor's), unless it stepped aside; then drop the stage."""
        if not self.stepped_aside and self.mount_id is not None:
            for path in (mountpoint, self.stage):
                found = guard.mounts_at(path) if path is not None else []
                if found and found[-1].id == self.mount_id:
                    try:
                        detach(path)  # type: ignore[arg-type]
                    except OSError as e:
                        log.error("could not unmount %s: %s", path, e)
        if self.stage is not None and not self.moved:
            # Once moved, the stage is no longer ours: a later successor may be staging
            # its mount there right now (found by a CI run: a predecessor's exit detached
            # it, and that successor's connection ended 0.5 s after its start).
            drop_stage(self.stage)

    def lower(self) -> LowerHanding:
        """The part of overlay mode's FUSE layer, whose mount is not the one handed over."""
        return LowerHanding(self)

    def prepare_stage(self) -> None:
        """Make the stage a mount of its own, to mount on first (casfs.view.session)."""
        if self.stage is not None:
            prepare_stage(self.stage)

    def close_session(self, pyfuse3: Any, mountpoint: Path) -> None:
        """End a session that took part in a handover. libfuse would unmount the path
        it mounted (the stage's, or the mount point that is a successor's now): never
        that. A session moved to the mount point that did not step aside detaches its
        own mount, found by its id, then closes its connection."""
        self.detach_own(mountpoint)
        pyfuse3.close(unmount=False)


class LowerHanding:
    """Overlay mode's FUSE layer in a handover (casfs.view.session.serve reads it): it
    mounts at its own path (no stage), and once the overlay stepped aside (which
    detaches this layer too) the end of its connection is the overlay's end."""

    stage = None

    def __init__(self, top: Handing) -> None:
        self.top = top
        self.mount_id: int | None = None

    @property
    def stepped_aside(self) -> bool:
        return self.top.stepped_aside

    @property
    def ended(self) -> bool:
        return self.top.ended

    @ended.setter
    def ended(self, value: bool) -> None:
        self.top.ended = value

    def prepare_stage(self) -> None:
        pass

    def mounted(self, path: Path) -> None:
        t = top(path)
        self.mount_id = t.id if t is not None and t.fstype.startswith("fuse") else None

    def close_session(self, pyfuse3: Any, mountpoint: Path) -> None:
        pyfuse3.close(unmount=False)  # detached when the overlay stepped aside


# --- the successor's side ---------------------------------------------------------------
@dataclass
class Predecessor:
    pid: int
    socket: Path
    version: int


def find_predecessor(run_dir: Path, name: str, mountpoint: Path) -> dict[str, Any] | None:
    """The live registry entry of the mount process serving ``name`` at ``mountpoint``."""
    for e in control.registered(run_dir):
        if (e.get("name") == name and e.get("mountpoint") == str(mountpoint)
                and e.get("pid") != os.getpid()):
            return e
    return None


def _ask(sock: Path, phase: str, timeout: float = CONTROL_TIMEOUT,
         **kw: Any) -> dict[str, Any]:
    return control.request(sock, "handover", timeout=timeout, phase=phase,
                           handover_version=HANDOVER_VERSION, pid=os.getpid(), **kw)


def _ask_predecessor(sock: Path, pid: int, mountpoint: Path, phase: str,
                     **kw: Any) -> dict[str, Any]:
    """The predecessor's ``ok`` answer to ``phase``; HandoverUnavailable otherwise."""
    try:
        reply = _ask(sock, phase, **kw)
    except CasfsError as e:
        raise HandoverUnavailable(f"the mount process at {mountpoint} (pid {pid}) did not"
                                  f" answer the handover: {e.message}") from None
    if not reply.get("ok"):
        raise HandoverUnavailable(f"the mount process at {mountpoint} (pid {pid}) cannot hand"
                                  f" over: {reply.get('error') or 'refused'}")
    return reply


def prepare(run_dir: Path, name: str, mountpoint: Path,
            kind: str = "fuse") -> Predecessor | None:
    """Ask the mount process now serving ``mountpoint`` to prepare its handover of a
    ``kind`` mount (it gives up its namespace locks); None if none serves it (a
    plain start). HandoverUnavailable when it cannot."""
    entry = find_predecessor(run_dir, name, mountpoint)
    if entry is None:
        return None
    pid = int(entry["pid"])
    why = unsupported()
    if why is not None:
        raise HandoverUnavailable(f"cannot take {mountpoint} over from pid {pid}: {why}")
    sock = Path(str(entry.get("socket") or ""))
    # "layer": absent from requests and replies before overlay mode handed over (fuse)
    reply = _ask_predecessor(sock, pid, mountpoint, "prepare", layer=kind)
    if reply.get("layer", "fuse") != kind:  # a release before overlay handovers
        raise HandoverUnavailable(f"the mount process at {mountpoint} (pid {pid}) cannot"
                                  f" hand over its {kind} mount (an older release)")
    v = reply.get("handover_version")
    if not isinstance(v, int) or v < HANDOVER_MIN_VERSION:
        raise HandoverUnavailable(f"the mount process at {mountpoint} (pid {pid}) speaks"
                                  f" handover format {v!r}; this release reads"
                                  f" {HANDOVER_MIN_VERSION}..{HANDOVER_VERSION}")
    return Predecessor(pid, sock, min(v, HANDOVER_VERSION))


def leave(run_dir: Path, name: str, mountpoint: Path, wait: float) -> int | None:
    """dir mode: ask the mount process serving ``mountpoint`` to leave its directory in
    place and exit, and wait at most ``wait`` seconds for that (it publishes first);
    its pid, or None if none serves it. HandoverUnavailable when it cannot (a release
    before this one answers ``unknown phase``) or does not exit in time."""
    entry = find_predecessor(run_dir, name, mountpoint)
    if entry is None:
        return None
    pid = int(entry["pid"])
    _ask_predecessor(Path(str(entry.get("socket") or "")), pid, mountpoint, "leave")
    deadline = time.monotonic() + wait
    while control.running(pid):
        if time.monotonic() > deadline:
            raise HandoverUnavailable(f"the mount process at {mountpoint} (pid {pid}) did not"
                                      f" exit within {wait:.0f}s of leaving")
        time.sleep(0.02)
    log.info("%s: pid %d left the directory to this process", mountpoint, pid)
    return pid


async def take_over(mountpoint: Path, handing: Handing, pred: Predecessor) -> list[str]:
    """Move the session served at ``handing.stage`` beneath the predecessor's mount and
    have the predecessor step aside; the paths it still holds open for writing."""
    import trio

    from casfs.view.session import clear_stale_mount

    assert handing.stage is not None
    t0 = time.monotonic()
    # The first request answered at the stage: our INIT is done there (the loop runs).
    await trio.to_thread.run_sync(os.stat, handing.stage)
    alive = await trio.to_thread.run_sync(lambda: not clear_stale_mount(mountpoint))
    over = top(mountpoint)
    beneath = alive and handing.ours(over)
    move_mount(handing.stage, mountpoint, beneath=beneath)
    handing.moved = True
    drop_stage(handing.stage)
    if not beneath:  # the predecessor's mount went meanwhile (it died): we are on top now
        log.warning("%s: no mount to take over from pid %d: mounted", mountpoint, pred.pid)
        return []
    try:
        reply = await trio.to_thread.run_sync(
            lambda: _ask(pred.socket, "step_aside", beneath=handing.mount_id))
    except CasfsError as e:
        reply = {"ok": False, "error": e.message}
    if not reply.get("ok"):
        now = await trio.to_thread.run_sync(top, mountpoint)
        if now is not None and now.id == handing.mount_id:
            # It stepped aside, and its answer was lost: with no job on its detached
            # mount the kernel ends that connection at once, and its process may exit
            # before it answers (seen under load). The mount table is the truth.
            log.info("%s: took over from pid %d (its answer was lost: %s)", mountpoint,
                     pred.pid, reply.get("error"))
            return []
        # Still beneath it: a dead predecessor's mount is cleared, a live one keeps serving
        # and this process fails its start (its mount goes when it exits).
        if await trio.to_thread.run_sync(clear_stale_mount, mountpoint):
            return []
        raise CasfsError(f"the mount process at {mountpoint} (pid {pred.pid}) did not step"
                         f" aside: {reply.get('error')}")
    log.info("%s: took over from pid %d in %.0f ms (format %d)", mountpoint, pred.pid,
             (time.monotonic() - t0) * 1000, pred.version)
    return [str(p) for p in reply.get("writing") or []]


DRAINING_FRESH_S = 10.0  # a writers file older than this is no live drainer's


def writers_file(run_dir: Path, ns: str, pid: int) -> Path:
    """The paths a draining process's jobs write (a JSON list: every release reads it)."""
    return run_dir / f"draining-{ns}.{pid}.json"


def mount_file(run_dir: Path, ns: str, pid: int) -> Path:
    """Beside it, which mount they write through: ``{"layer", "mount_id", "mountpoint"}``.
    A name a release before it parses as no pid (``<pid>.mount``), so it skips it."""
    return run_dir / f"draining-{ns}.{pid}.mount.json"


def draining_pids(run_dir: Path) -> set[int]:
    """Processes that handed their mount over and drain, this node's: each keeps its
    writers files fresh (every 0.5 s) while it serves what jobs hold. A casfsd that
    re-executed since its handover knows them only from here."""
    out: set[int] = set()
    now = time.time()
    for p in run_dir.glob("draining-*.json"):
        try:
            pid = int(p.name.rsplit(".", 2)[-2])
            fresh = now - p.stat().st_mtime < DRAINING_FRESH_S
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                ours = b"casfs.node." in f.read()
        except (ValueError, IndexError, OSError):
            continue
        if fresh and ours and pid != os.getpid() and control.running(pid):
            out.add(pid)
    return out


@dataclass
class Drained:
    """What draining predecessors' jobs hold of a namespace (``drained_writers``)."""

    writing: set[str] = field(default_factory=set)  # open for writing: not promoted now
    # A predecessor died with these open for writing through its FUSE mount: its
    # connection ended, so what is in the upper is half-written for good (held, removed).
    torn: dict[int, set[str]] = field(default_factory=dict)


def _read_writers(run_dir: Path, ns: str, pid: int) -> dict[str, Any] | None:
    """A drainer's paths and, where it wrote it, its mount (``mount_file``: a release
    before 2026-12-06 wrote none, its layer then unknown); None if unreadable."""
    try:
        paths = json.loads(writers_file(run_dir, ns, pid).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(paths, list):
        return None
    doc: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        mount = json.loads(mount_file(run_dir, ns, pid).read_bytes())
        if isinstance(mount, dict):
            doc.update(mount)
    doc["paths"] = {str(x) for x in paths}
    return doc


def _still_written(doc: dict[str, Any]) -> set[str]:
    """A dead overlay predecessor's paths while jobs still write through its detached
    overlay (overlayfs writes the upper without it); empty once none does."""
    from casfs.view import dirmode

    mount_id, mountpoint = doc.get("mount_id"), doc.get("mountpoint")
    if doc.get("layer") != "overlay" or type(mount_id) is not int or not mountpoint:
        return set()
    tops = {p.split("/", 1)[0] for p in doc["paths"]}
    live = dirmode.writers_on_mount(mount_id, Path(mountpoint), tops)
    return doc["paths"] | live if live else set()


def drained_writers(run_dir: Path, ns: str, claim: bool = True) -> Drained:
    """Paths of ``ns`` open for writing through the mounts of processes that handed it
    over and drain (their ``draining-<ns>.<pid>.json``).

    A dead drainer's file is removed once it says nothing more: an overlay one's
    paths stay written while jobs write through its detached overlay (the kernel's,
    it needs no process); a FUSE one's connection ended with it, so its paths are
    ``torn`` (a job's data still in flight never reached the upper). Only the process
    serving the namespace ``claim``s them: another drainer counts them as written."""
    out = Drained()
    prefix = f"draining-{ns}."
    for p in run_dir.glob(f"draining-{glob.escape(ns)}.*.json"):
        try:
            pid = int(p.name[len(prefix):-len(".json")])
        except ValueError:
            continue  # a mount file (<pid>.mount.json)
        if pid == os.getpid():
            continue  # our own (we drain): our tracker knows
        doc = _read_writers(run_dir, ns, pid)
        if control.running(pid) or not claim:
            out.writing |= doc["paths"] if doc is not None else set()
            continue
        held = _still_written(doc) if doc is not None else set()
        if held:
            out.writing |= held
            continue
        if doc is not None and doc.get("layer") != "overlay" and doc["paths"]:
            out.torn[pid] = doc["paths"]
        for f in (p, mount_file(run_dir, ns, pid)):
            with contextlib.suppress(OSError):
                f.unlink()
    return out


def busy_hook(run_dir: Path, ns: str, own: Callable[[list[str]], set[str]],
              torn: Callable[[int, set[str]], None],
              serving: Callable[[], bool] = lambda: True) -> Callable[[list[str]], set[str]]:
    """A mount's promotion ``busy`` hook: its own writers (``own``, as without the
    hook) and the paths draining predecessors hold open for writing: a file another
    process writes is never promoted half-written (first writer kept would keep that).
    A predecessor that died with files open through its FUSE mount: ``torn`` is told
    (once), and holds them; only while ``serving`` (a drainer of its own leaves a dead
    drainer's paths to the process that serves the namespace: its tracker sees the
    rewrites that lift the hold)."""

    def busy(paths: list[str]) -> set[str]:
        if not paths:
            return set()
        drained = drained_writers(run_dir, ns, claim=serving())
        for pid, rels in drained.torn.items():
            torn(pid, rels)
            drained.writing |= rels  # this round's paths were chosen before the hold
        return {p for p in paths if p in drained.writing} | own(paths)

    return busy


TELL_TIMEOUT = 2.0  # a successor that does not answer this soon: the change goes untold
TELL_PAUSE = 10.0  # after a failure, nothing is told for this long (no op waits on it)
TELL_BIND_WAIT = 0.5  # at most this long for the successor's control socket to appear


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def teller(socket: Path, ns: str) -> Callable[[list[str]], None]:
    """For a drainer's tracker (``on_change``): each upper path its jobs change (through
    a cwd or directory fd they hold on its detached mount) is told to the successor
    before the change's answer reaches the job, so a read through the successor's mount
    right after it sees the new bytes (close-to-open, as NFS). Its kernel caches the
    upper for an hour: it cannot see the change by itself. Made at the step aside, when
    ``socket`` is still this process's own: nothing is told until the successor's
    replaces it (told to ourselves, the answer would wait on this very thread): a
    change waits for that at most TELL_BIND_WAIT, else goes with the next one. Best
    effort: a successor that does not take it (an older release, gone, slow) is said
    once in the log, and nothing is told for TELL_PAUSE after each failure."""
    own = _identity(socket)
    said = False
    paused_until = 0.0
    pending: set[str] = set()  # changed before the successor's socket was there
    no_wait_until = 0.0

    def tell(paths: list[str]) -> None:
        nonlocal said, paused_until, no_wait_until
        now = time.monotonic()
        if now < paused_until:
            return
        ident = _identity(socket)
        wait_until = now + TELL_BIND_WAIT if now >= no_wait_until else now
        while (ident is None or ident == own) and time.monotonic() < wait_until:
            time.sleep(0.01)  # it binds right after its step aside answered
            ident = _identity(socket)
        if ident is None or ident == own:
            if len(pending) < 4096:
                pending.update(paths)
            no_wait_until = time.monotonic() + TELL_PAUSE  # no op waits for it again soon
            return
        told = sorted(pending.union(paths))
        pending.clear()
        try:
            r = control.request(socket, "upper_changed", timeout=TELL_TIMEOUT, ns=ns,
                                paths=told)
            ok, why = bool(r.get("ok")), r.get("error")
        except DaemonStuckError as e:
            ok, why = False, e.message
        except CasfsError as e:  # no process listens there: nothing caches what we change
            log.debug("%s: no successor to tell: %s", ns, e.message)
            paused_until = time.monotonic() + TELL_PAUSE
            return
        if ok:
            return
        paused_until = time.monotonic() + TELL_PAUSE
        if not said:
            said = True
            log.warning("%s: cannot tell the successor what this drained mount's jobs change"
                        " (%s): its readers may see the old bytes of a file replaced here"
                        " for as long as their kernel caches it", ns, why)

    return tell


# --- the predecessor's side -------------------------------------------------------------
class Drain:
    """A mount process's answers to a successor (control request ``handover``).

    ``give_locks`` releases the namespace locks and returns the namespaces whose
    ``draining`` lock to hold; ``retake_locks`` takes them back (True if it could)
    when a prepared handover is abandoned; ``writing`` lists the paths open for
    writing, by namespace; ``aside`` stops new work once stepped aside. One drain
    serves a mount process's one namespace, or the node host's many."""

    def __init__(self, mountpoint: Path, run_dir: Path, handing: Handing, *,
                 give_locks: Callable[[], list[str]], retake_locks: Callable[[], bool],
                 writing: Callable[[], dict[str, list[str]]],
                 aside: Callable[[], Awaitable[None]],
                 leave: Callable[[int], None] | None = None) -> None:
        self.mountpoint = mountpoint
        self.run_dir = run_dir
        self.handing = handing
        self.give_locks = give_locks
        self.retake_locks = retake_locks
        self.writing = writing
        self.aside = aside
        self.leave = leave  # dir mode: stop, leaving the directory to the successor
        self.nursery: trio.Nursery | None = None
        self._draining: list[int] = []
        self._namespaces: list[str] = []
        self._successor: int | None = None
        self._prepared_at = 0.0

    @property
    def prepared(self) -> bool:
        return self._successor is not None

    def close(self) -> None:
        for fd in self._draining:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._draining = []
        self._unlink_writers()

    def _unlink_writers(self) -> None:
        """Ours, whether we stepped aside or not: left behind, a later process would
        take their paths for a dead drainer's, torn (a step aside whose detach failed
        wrote them and served on)."""
        for ns in self._namespaces:
            for f in (writers_file(self.run_dir, ns, os.getpid()),
                      mount_file(self.run_dir, ns, os.getpid())):
                with contextlib.suppress(OSError):
                    f.unlink()

    def _publish_writers(self) -> None:
        """What this draining process's jobs write, for the other processes' promotion."""
        by_ns = self.writing()
        mount = {"layer": self.handing.kind, "mount_id": self.handing.mount_id,
                 "mountpoint": str(self.mountpoint)}
        for ns in self._namespaces:
            try:
                if not mount_file(self.run_dir, ns, os.getpid()).exists():  # first: it stays
                    atomic.write_atomic(mount_file(self.run_dir, ns, os.getpid()),
                                        json.dumps(mount).encode())
                atomic.write_atomic(writers_file(self.run_dir, ns, os.getpid()),
                                    json.dumps(by_ns.get(ns, [])).encode())
            except OSError as e:
                log.warning("%s: cannot record the files open for writing here: %s",
                            self.mountpoint, e)

    async def _keep_writers(self) -> None:
        import trio

        while True:
            await trio.sleep(0.5)
            await trio.to_thread.run_sync(self._publish_writers)

    async def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        v = req.get("handover_version")
        if not isinstance(v, int) or v < HANDOVER_MIN_VERSION:
            return {"ok": False, "handover_version": HANDOVER_VERSION,
                    "error": f"handover format {v!r} is not read here (reads"
                             f" {HANDOVER_MIN_VERSION}..{HANDOVER_VERSION})"}
        version = min(v, HANDOVER_VERSION)
        phase = req.get("phase")
        pid = req.get("pid")
        if not isinstance(pid, int):
            return {"ok": False, "handover_version": version, "error": "no successor pid"}
        if self.handing.stepped_aside:
            return {"ok": False, "handover_version": version, "error": "already stepped aside"}
        if phase == "prepare":
            layer = req.get("layer", "fuse")
            if layer != self.handing.kind:
                return {"ok": False, "handover_version": version,
                        "error": f"this is a {self.handing.kind} mount, not {layer!r}"}
            return self._prepare(pid, version)
        if phase == "step_aside":
            return await self._step_aside(pid, version, req.get("beneath"))
        if phase == "leave":
            if self.leave is None:
                return {"ok": False, "handover_version": version,
                        "error": "only a dir mode mount leaves its directory"}
            self.leave(pid)
            return {"ok": True, "handover_version": version, "pid": os.getpid()}
        return {"ok": False, "handover_version": version, "error": f"unknown phase {phase!r}"}

    def _prepare(self, pid: int, version: int) -> dict[str, Any]:
        from casfs.node import nsregistry

        if self.handing.mount_id is None:
            return {"ok": False, "handover_version": version,
                    "error": "this process's mount cannot be found (not stackable)"}
        if self._successor not in (None, pid) and control.running(self._successor):
            return {"ok": False, "handover_version": version,
                    "error": f"already handing over to pid {self._successor}"}
        if not self._draining:
            self._namespaces = self.give_locks()
            for ns in self._namespaces:
                self._draining.append(nsregistry.hold_draining(self.run_dir, ns))
        first = self._successor is None
        self._successor = pid
        self._prepared_at = time.monotonic()
        if first and self.nursery is not None:
            self.nursery.start_soon(self._watch)
        log.info("%s: handing over to pid %d (format %d)", self.mountpoint, pid, version)
        return {"ok": True, "handover_version": version, "pid": os.getpid(),
                "layer": self.handing.kind}

    async def _step_aside(self, pid: int, version: int, beneath: object) -> dict[str, Any]:
        import trio

        if pid != self._successor:
            return {"ok": False, "handover_version": version,
                    "error": f"pid {pid} did not prepare this handover"}
        stack = guard.mounts_at(self.mountpoint)
        if not stack or stack[-1].id != self.handing.mount_id:
            return {"ok": False, "handover_version": version,
                    "error": "this process's mount is not the visible one"}
        below = stack[-2] if len(stack) > 1 else None
        if (below is None or not self.handing.ours(below)
                or (isinstance(beneath, int) and below.id != beneath)):
            return {"ok": False, "handover_version": version,
                    "error": "the successor's mount is not beneath this one: not uncovering"
                             " the mount point"}
        self._publish_writers()  # before the successor serves: its first round reads it
        try:
            detach(self.mountpoint)
        except OSError as e:
            self._unlink_writers()  # serving on: no drainer's
            return {"ok": False, "handover_version": version, "error": str(e)}
        self.handing.stepped_aside = True
        lifeline.detach()  # drains and exits by itself: casfsd's end no longer matters
        crashpoint("handover-stepped-aside")  # tests: the answer lost (take_over checks)
        if self.nursery is not None:
            self.nursery.start_soon(self._keep_writers)
        writing = sorted({p for paths in self.writing().values() for p in paths})
        log.info("%s: stepped aside for pid %d; serving what jobs hold open here until"
                 " they let go (%d files open for writing)", self.mountpoint, pid,
                 len(writing))
        await trio.lowlevel.checkpoint()
        await self.aside()
        return {"ok": True, "handover_version": version, "pid": os.getpid(),
                "writing": writing}

    async def _watch(self) -> None:
        """Serve on if the successor never steps us aside (it died, or gave up)."""
        import trio

        while not self.handing.stepped_aside:
            await trio.sleep(0.5)
            succ = self._successor
            if self.handing.stepped_aside or succ is None:
                return
            if control.running(succ) and time.monotonic() - self._prepared_at < PREPARE_TIMEOUT:
                continue
            if self.retake_locks():
                self.close()
                self._successor = None
                log.warning("%s: the handover to pid %d was abandoned: serving on",
                            self.mountpoint, succ)
                return

