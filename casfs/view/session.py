"""Running one FUSE mount: init, trio main loop, signals, and guaranteed unmount.

pyfuse3 allows one session per process. ``serve`` blocks until the mount ends
(SIGTERM/SIGINT, an external unmount, or a failing background task), and
always unmounts on the way out so no dead mount is left behind.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from casfs.errors import FuseUnavailableError
from casfs.util import fusectl, statx

if TYPE_CHECKING:
    import pyfuse3

    from casfs.view.adopt import Adoption


class Handing(Protocol):
    """A session's part in a handover (implemented by casfs.node.handover.Handing)."""

    stage: Path | None
    stepped_aside: bool
    ended: bool

    def mounted(self, path: Path) -> None: ...
    def prepare_stage(self) -> None: ...
    def close_session(self, pyfuse3: Any, mountpoint: Path) -> None: ...

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stop_signals() -> Iterator[AsyncIterator[int]]:
    """trio's receiver of SIGTERM/SIGINT; once it is left, both are ignored.

    A second signal must not kill the process during its shutdown (the final
    publication, the unmount). On leaving, trio puts back the handlers it found:
    ignoring the signals only after that (as before) left a moment in which a
    second one met the default action and killed the process (rc -15, no final
    publication: 2 of 40 dir-mode stops under a burst of SIGTERMs). So a Python
    handler that swallows them goes in first, and is what trio puts back; a
    signal it takes before the receiver is in place is sent again to the receiver.
    """
    early: list[int] = []

    def swallow(signum: int, frame: object) -> None:
        early.append(signum)

    for s in STOP_SIGNALS:
        signal.signal(s, swallow)
    try:
        with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
            for signum in set(early):
                os.kill(os.getpid(), signum)
            early.clear()
            yield signals
    finally:
        for s in STOP_SIGNALS:  # ignored by the kernel too: the interpreter's exit
            signal.signal(s, signal.SIG_IGN)  # puts back the default for Python handlers


def mount_options(fsname: str, *, allow_other: bool, debug: bool,
                  read_only: bool = False) -> set[str]:
    # nodev: device nodes may be created (as on any directory) but never opened through
    # a cache directory. nosuid: nor a setuid or setgid bit honoured (a JIT cache holds
    # no program that needs one; a file of one member's in a group's view never runs
    # with her ids). libfuse sets both by default; said here, where it is relied on.
    opts = {"default_permissions", "nodev", "nosuid", f"fsname={fsname}", "subtype=casfs"}
    if read_only:
        opts.add("ro")
    if allow_other:
        opts.add("allow_other")
    if debug:
        opts.add("debug")
    return opts


def serve(
    ops: pyfuse3.Operations,
    mountpoint: Path,
    *,
    fsname: str = "casfs",
    allow_other: bool = False,
    debug: bool = False,
    read_only: bool = False,
    on_ready: Callable[[], None] | None = None,
    background: Callable[[trio.Nursery], Awaitable[None]] | None = None,
    on_shutdown: Callable[[], Awaitable[None]] | None = None,
    handing: Handing | None = None,
    adoption: Adoption | None = None,
) -> None:
    """Mount ``ops`` at ``mountpoint`` and serve until told to stop.

    ``on_ready`` runs once the mount is up (e.g. sd_notify READY=1).
    ``background(nursery)`` may start long-running tasks (publication, refresh)
    in the mount's nursery. On SIGTERM/SIGINT, ``on_shutdown`` is awaited first
    (e.g. a final publication) while the mount still serves, then the FUSE loop
    ends and background tasks are cancelled.

    ``handing`` (casfs.node.handover): the session's part in replacements. With
    a ``stage``, it mounts there first (``background`` moves it to the mount
    point); once it has stepped aside, the end of its connection (the kernel's:
    the last job let go) runs ``on_shutdown`` too, and nothing is unmounted at
    the end (the mount point is the successor's).

    ``adoption`` (casfs.view.adopt): serve the connection of a crashed process
    already mounted at ``mountpoint`` instead of mounting. Nothing may look at
    the mount point until this process serves it (a stat would wait on it).
    """
    if not os.path.exists("/dev/fuse"):
        raise FuseUnavailableError("/dev/fuse is missing: FUSE is not available here")
    import pyfuse3  # here, not at the top: dir mode imports this module on hosts without it

    mountpoint = Path(mountpoint)
    at = str(mountpoint)
    if adoption is not None:
        at = adoption.mountpoint()
        _adopt_at_init(ops, adoption)
    else:
        clear_stale_mount(mountpoint)
        if handing is not None and handing.stage is not None:
            at = str(handing.stage)
            handing.prepare_stage()
    try:
        pyfuse3.init(ops, at, mount_options(fsname, allow_other=allow_other,
                                            debug=debug, read_only=read_only))
    except RuntimeError as e:
        raise FuseUnavailableError(f"cannot mount {at}: {e}") from e
    fusectl.widen_background(at)  # one tenant's closes never queue ahead of the others'
    if adoption is not None:
        adoption.probe(str(mountpoint))
    if handing is not None:
        handing.mounted(mountpoint if adoption is not None else Path(at))
    unmounted = False
    wake = _install_read_wake()
    try:
        trio.run(_main, on_ready, background, on_shutdown, wake, handing)
    except BaseException:
        log.exception("FUSE main loop failed")
        raise
    finally:
        if wake:
            _remove_read_wake()
        try:
            if handing is not None and (handing.stepped_aside or handing.stage is not None):
                handing.close_session(pyfuse3, mountpoint)
            elif adoption is not None:  # libfuse mounted nothing: the mount is ours to end
                pyfuse3.close(unmount=False)
                lazy_unmount(mountpoint)
            else:
                pyfuse3.close(unmount=True)
            unmounted = True
        finally:
            if not unmounted:
                clear_stale_mount(mountpoint)
    if handing is not None and handing.stepped_aside:
        log.info("the last job let go of the mount handed over at %s", mountpoint)
    else:
        log.info("unmounted %s", mountpoint)


ADOPT_FIRST_REQUEST_S = 5.0  # the probe's lookup arrives at once; a bound all the same


def _adopt_at_init(ops: pyfuse3.Operations, adoption: Adoption) -> None:
    """Take the held connection over when libfuse has processed the synthetic INIT,
    and answer what the dead process had read, before the loop reads on."""
    init = ops.init

    def adopted_init() -> None:
        adoption.take_over()
        adoption.recover_lost(ADOPT_FIRST_REQUEST_S)
        init()

    ops.init = adopted_init  # type: ignore[method-assign]


async def _main(
    on_ready: Callable[[], None] | None,
    background: Callable[[trio.Nursery], Awaitable[None]] | None,
    on_shutdown: Callable[[], Awaitable[None]] | None,
    wake: bool = False,
    handing: Handing | None = None,
) -> None:
    # Caught before READY (a job that ends at once is stopped right after it), and from
    # the first signal on, more are swallowed: one between here and the unmount would
    # leave a dead mount (ENOTCONN) behind. SIGKILL still works.
    with stop_signals() as signals:
        await _session(signals, on_ready, background, on_shutdown, wake, handing)


async def _session(
    signals: AsyncIterator[int],
    on_ready: Callable[[], None] | None,
    background: Callable[[trio.Nursery], Awaitable[None]] | None,
    on_shutdown: Callable[[], Awaitable[None]] | None,
    wake: bool = False,
    handing: Handing | None = None,
) -> None:
    import pyfuse3

    shut = trio.Lock()
    done = False

    async def shutdown() -> None:
        nonlocal done
        async with shut:  # once: a signal may come while a drained mount publishes
            if done or on_shutdown is None:
                return
            done = True
            try:
                await on_shutdown()
            except Exception:
                log.exception("shutdown hook failed")

    async with trio.open_nursery() as nursery:
        if wake:
            nursery.start_soon(_keep_read_wake_off)

        async def fuse_loop() -> None:
            await pyfuse3.main()
            if handing is not None and handing.stepped_aside:
                # Handed over, and the kernel ended the connection: the last job let go
                # of the detached mount. Publish what it wrote, then exit.
                handing.ended = True
                log.info("the mount handed over is no longer used: final publication")
                await shutdown()
            nursery.cancel_scope.cancel()  # unmounted from outside: stop background work

        async def watch_signals() -> None:
            async for signum in signals:
                log.info("signal %d: shutting down", signum)
                break
            await shutdown()
            pyfuse3.terminate()

        nursery.start_soon(fuse_loop)
        nursery.start_soon(watch_signals)
        if background is not None:
            await background(nursery)
        if on_ready is not None:
            on_ready()


# --- the FUSE loop's blocking read ----------------------------------------------------
# pyfuse3 reads the session fd (a blocking one, holding the GIL) once trio says it is
# readable. The kernel can take the request back in between: an unread request whose
# process got SIGKILL is dropped, and a queued INTERRUPT goes when its request is
# answered first. The read then blocks the event loop (the control socket,
# publication, lease checks, every other request) and every other thread of the
# process until some process sends the next request; with none (the job was killed,
# nothing else uses the mount) the mount process hung for good.
#
# A dead man's switch: while the loop runs, a task keeps pushing a one-shot
# ITIMER_REAL back. Once the loop has been stuck for READ_WAKE_AFTER_S the timer's
# SIGALRM reaches the main thread (the thread group leader, which runs the loop);
# the blocked read returns EINTR, which pyfuse3 answers by waiting for readability
# again. A loop that is merely busy gets a no-op handler call at most.
READ_WAKE_AFTER_S = 1.0
read_wakes = 0  # SIGALRMs the switch fired (the loop was stuck that long)


def _on_read_wake(signum: int, frame: object) -> None:
    global read_wakes
    read_wakes += 1


def _install_read_wake() -> bool:
    """The SIGALRM handler, if this is the main thread and SIGALRM is nobody's."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None):
        log.debug("SIGALRM is handled already: no wake for a stuck FUSE read")
        return False
    signal.signal(signal.SIGALRM, _on_read_wake)
    return True


def _remove_read_wake() -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)


async def _keep_read_wake_off() -> None:
    seen = read_wakes
    try:
        while True:
            signal.setitimer(signal.ITIMER_REAL, READ_WAKE_AFTER_S)
            if read_wakes != seen:
                seen = read_wakes
                log.info("the FUSE loop was stuck for over %.0fs (a blocked read of a request"
                         " the kernel took back, or a long step): woken (%d so far)",
                         READ_WAKE_AFTER_S, seen)
            await trio.sleep(READ_WAKE_AFTER_S / 4)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def is_mountpoint(path: Path) -> bool:
    """True if ``path`` is a mount point (including a dead FUSE mount)."""
    if is_dead(path):
        return True
    try:  # the kernel's mount-root attribute: a FUSE server (another user's) never asked
        root = statx.ident(statx.AT_FDCWD, str(path)).mount_root
        if root is not None:
            return root
        st = os.lstat(path)
    except OSError:
        return False
    try:
        pst = os.lstat(os.path.join(path, ".."))
    except OSError:
        return False
    return st.st_dev != pst.st_dev or st.st_ino == pst.st_ino


def clear_stale_mount(path: Path) -> bool:
    """Lazy-unmount a dead FUSE mount (ENOTCONN) at ``path``; True if one was found.

    statfs is asked too because stat may be answered from attributes the kernel
    cached before the daemon died; statfs always reaches the (dead) connection.
    """
    if not is_dead(path):
        return False
    log.warning("clearing a dead mount at %s", path)
    lazy_unmount(path)
    return True


def is_dead(path: Path) -> bool:
    """Whether ``path`` is a dead FUSE mount (ENOTCONN); another user's is never asked."""
    # Another user's FUSE mount stacked on ``path`` (a directory she can write): its
    # server may never answer stat or statfs. Not ours, and never asked.
    try:
        if statx.others_fuse(statx.ident(statx.AT_FDCWD, str(path), follow=True).dev):
            return False
    except OSError as e:
        return e.errno == errno.ENOTCONN
    for probe in (os.stat, os.statvfs):
        try:
            probe(path)
        except OSError as e:
            return e.errno == errno.ENOTCONN
    return False


def lazy_unmount(path: Path) -> None:
    """Detach the mount at ``path`` now; the kernel finishes when it is no longer busy."""
    for cmd in (["fusermount3", "-u", "-z"], ["fusermount", "-u", "-z"], ["umount", "-l"]):
        if shutil.which(cmd[0]) is None:
            continue
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            r = subprocess.run([*cmd, str(path)], capture_output=True, timeout=30, check=False)
            if r.returncode == 0:
                return
    log.error("could not unmount %s", path)
