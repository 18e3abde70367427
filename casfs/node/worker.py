"""A mount in its own process (pyfuse3 allows one FUSE session per process).

``casfs mount``, ``casfs run`` and ``casfsd`` all start mounts through
``spawn``: the child runs ``python -m casfs.node.worker``, builds a
MountService, and writes ``READY`` to an inherited pipe once the mount
serves (or an error line if it failed), so the parent knows without polling.
On SIGTERM the child publishes (bounded), unmounts, writes its final stats
to ``--stats-out`` and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Protocol

from casfs.errors import CasfsError, FuseUnavailableError
from casfs.node import logfmt
from casfs.node.config import HostConfig, MountConfig, dump_config, load_config
from casfs.util import owned
from casfs.util.child import CHILD_CWD, child_env, python_module
from casfs.util.fdwait import readable, wait_exit

log = logging.getLogger(__name__)


def config_to_json(cfg: MountConfig) -> str:
    return dump_config(cfg)


def config_from_json(text: str) -> MountConfig:
    return load_config(MountConfig, text, ("mountpoint", "state_dir"))


def send_config(fd: int, text: str) -> None:
    """Write a child's configuration into its pipe and close it (argv is public: /proc)."""
    try:
        with open(fd, "wb") as f:  # small: fits the pipe buffer, never blocks
            f.write(text.encode())
    except OSError:
        pass  # the child died already: its ready line says why


def read_config(fd: int | None, text: str | None) -> str:
    if fd is None:
        return text or ""
    with open(fd, "rb") as f:
        return f.read().decode()


def check_fuse() -> None:
    from casfs.util.fusesupport import fuse_missing

    # pyfuse3 is the optional 'fuse' extra: without it casfs run falls back to dir mode
    # (FuseUnavailableError), saying how to install it, instead of starting a mount
    # process that fails at its first import.
    why = fuse_missing(load=False)
    if why is not None:
        raise FuseUnavailableError(why)
    if not os.path.exists("/dev/fuse"):
        raise FuseUnavailableError(
            "FUSE is not available here (/dev/fuse is missing); casfs needs it to mount"
            " (in a container: --device /dev/fuse --cap-add SYS_ADMIN), or use --mode dir"
        )
    from shutil import which

    if os.geteuid() != 0 and which("fusermount3") is None:
        raise FuseUnavailableError("fusermount3 is missing: install the fuse3 package")


class Worker:
    """A spawned mount process, as seen by its parent."""

    def __init__(self, cfg: MountConfig, proc: subprocess.Popen[bytes], stats_out: Path,
                 log_path: Path | None, lifeline: int | None = None) -> None:
        self.cfg = cfg
        self.proc = proc
        self.stats_out = stats_out
        self.log_path = log_path  # None: the worker logs to the parent's stderr
        self.lifeline = lifeline  # write end of the die-with-parent pipe

    def release(self) -> None:
        """Close the lifeline (after the process is gone)."""
        if self.lifeline is not None:
            with contextlib.suppress(OSError):
                os.close(self.lifeline)
            self.lifeline = None

    def stop(self, timeout: float | None = None) -> dict[str, Any] | None:
        """SIGTERM (final publication, unmount), wait, then force; returns final stats."""
        timeout = timeout if timeout is not None else self.cfg.shutdown_timeout + 15
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                wait_exit(self.proc, timeout)
            except subprocess.TimeoutExpired:
                log.error("%s: mount process did not stop in %.0fs; killing it",
                          self.cfg.name, timeout)
                self.proc.kill()
                self.proc.wait()
                from casfs.view.session import lazy_unmount

                lazy_unmount(self.cfg.mountpoint)
        self.release()
        try:
            return dict(json.loads(self.stats_out.read_bytes()))
        except (OSError, ValueError):
            return None


def spawn(cfg: MountConfig, *, ready_timeout: float = 120.0, verbose: int = 0,
          log_to_stderr: bool = False, log_format: str | None = None,
          log_level: str | None = None, die_with_parent: bool = False,
          adopt_grace: float = 0.0, replace: bool = False,
          adopt: tuple[int, int] | None = None) -> Worker:
    """Start a mount process and wait until it serves; CasfsError with its reason if not.

    ``adopt``: (fd, pid): serve the FUSE connection ``fd`` (held by the caller) of
    this mount's crashed process ``pid`` instead of mounting (casfs.view.adopt).

    ``replace``: the new process takes the mount point over from the one serving it
    (casfs.node.handover): no job sees the change. HandoverUnavailable if that one
    cannot hand over (then nothing was changed: see ``replace``).

    By default the worker logs to ``<state_dir>/log/<name>.log``; ``log_to_stderr``
    makes it inherit the caller's stderr instead (casfsd: the journal), in
    ``log_format`` at ``log_level``. ``die_with_parent``: the worker shuts down
    cleanly (final publication, unmount) when the caller's process ends, even
    by SIGKILL, through an inherited pipe whose write end only the caller holds;
    with ``adopt_grace`` it serves on that long first, for the next casfsd to adopt
    it (casfs.node.lifeline).
    """
    if cfg.mode in ("fuse", "overlay"):
        check_fuse()
    cfg.check()
    return start_process(
        "casfs.node.worker", cfg, config_to_json(cfg), where=f"mount {cfg.name} at",
        ready_timeout=ready_timeout + cfg.wait_warm, verbose=verbose,
        log_to_stderr=log_to_stderr, log_format=log_format, log_level=log_level,
        die_with_parent=die_with_parent, adopt_grace=adopt_grace, replace=replace,
        adopt=adopt)


def replace(old: Worker, spawn_fn: Callable[..., Worker] | None = None,
            cfg: Any = None, **kw: Any) -> tuple[Worker, bool]:
    """Put a new mount process (this release) in ``old``'s place: (the new one, whether
    it was handed over seamlessly).

    The new process takes the mount point over while ``old`` serves (casfs.node.handover);
    ``old`` then drains what jobs hold open and exits by itself (the caller reaps it).
    If ``old`` cannot hand over (an older release, no CAP_SYS_ADMIN, a kernel before
    6.5, another mode) it is stopped first and the new one mounts after it, as
    every restart did before: jobs see the gap. One WARNING line says so.
    """
    from casfs.node.handover import HandoverUnavailable

    cfg = cfg if cfg is not None else old.cfg
    spawn_fn = spawn_fn or spawn
    if old.proc.poll() is None:
        try:
            return spawn_fn(cfg, replace=True, **kw), True
        except HandoverUnavailable as e:
            log.warning("%s: no seamless handover (%s): stopping pid %d, then mounting again"
                        " (jobs see the gap)", cfg.name, e.message, old.proc.pid)
    old.stop()
    return spawn_fn(cfg, **kw), False


def check_paths(cfg: Any) -> None:
    """The state dir, the mount point's directory and a POSIX shared root must belong
    to this user (or root): casfs.util.owned, UnsafePathError naming the component.

    Missing directories are made here, one at a time: 0700, or 0755 as root (the
    mount base holds casfsd's jobs socket, which every user reaches)."""
    mode = 0o755 if os.geteuid() == 0 else 0o700
    owned.private_dir(cfg.state_dir, "state dir")
    owned.check_mountpoint(cfg.mountpoint, "mount point", create_mode=mode)
    if isinstance(cfg.root, Path):
        try:
            owned.check_dir(cfg.root, "shared root", shared=True)
        except FileNotFoundError:  # made by the mount (SharedRoot): its parent must pass
            owned.check_dir(cfg.root.parent, "shared root", create_mode=mode)


def start_process(module: str, cfg: Any, cfg_json: str, *, where: str,
                  ready_timeout: float = 120.0, verbose: int = 0, log_to_stderr: bool = False,
                  log_format: str | None = None, log_level: str | None = None,
                  die_with_parent: bool = False, adopt_grace: float = 0.0,
                  replace: bool = False, adopt: tuple[int, int] | None = None) -> Worker:
    """Run ``python -m module`` with ``cfg_json`` and wait for its READY line.

    The one way casfs starts a mount process (a single mount, or the node's
    host): ``cfg`` needs ``name``, ``state_dir``, ``run_dir`` and ``mountpoint``.
    """
    check_paths(cfg)
    log_path: Path | None = None
    if not log_to_stderr:
        log_dir = cfg.state_dir / "log"
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{cfg.name}.log"
    stats_out = cfg.run_dir / f"{cfg.name}.final-stats"
    cfg.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    stats_out.unlink(missing_ok=True)
    r, w = os.pipe()
    # The configuration goes through a pipe, not argv: argv is readable by every
    # local user through /proc. (Credentials are never in it either way: they
    # come from the AWS environment/profile chain the worker inherits.)
    cfg_r, cfg_w = os.pipe()
    cmd = [*python_module(module), "--config-fd", str(cfg_r),
           "--ready-fd", str(w), "--stats-out", str(stats_out)] + ["-v"] * verbose
    if log_format:
        cmd += ["--log-format", log_format]
    if log_level:
        cmd += ["--log-level", log_level]
    if replace:
        cmd.append("--replace")
    pass_fds = [w, cfg_r]
    if adopt is not None:
        cmd += ["--adopt", f"{adopt[0]}:{adopt[1]}"]
        pass_fds.append(adopt[0])
    life_r = life_w = None
    if die_with_parent:
        life_r, life_w = os.pipe()
        pass_fds.append(life_r)
        cmd += ["--lifeline-fd", str(life_r)]
        if adopt_grace > 0:
            cmd += ["--adopt-grace", f"{adopt_grace:g}"]
    try:
        with open(log_path, "ab") if log_path else contextlib.nullcontext() as logf:
            out: Any = logf if logf is not None else sys.stderr.fileno()
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    pass_fds=pass_fds, start_new_session=True,
                                    cwd=CHILD_CWD, env=child_env())
    except BaseException:
        for fd in (r, life_w, cfg_w):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        for fd in (w, life_r, cfg_r):
            if fd is not None:
                os.close(fd)
    send_config(cfg_w, cfg_json)
    slow = None
    wait_warm = getattr(cfg, "wait_warm", 0.0)
    if wait_warm and not replace and adopt is None:
        # Said where the job's output goes: a warm wait may hold its start for long.
        slow = (SLOW_START_NOTE_S, lambda: print(
            f"casfs: {cfg.name}: waiting for the cache to be local before the job starts"
            f" (at most {wait_warm:g}s, --wait-warm; log: {log_path or 'stderr'})",
            file=sys.stderr, flush=True))
    try:
        line = _read_line(r, ready_timeout, proc, slow)
    finally:
        os.close(r)
    if line != "READY":
        # A child that said why exits at once; its status tells whether FUSE itself
        # was the problem (casfs run then falls back to dir mode, not to a private dir).
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5 if line else 0.1)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if life_w is not None:
            os.close(life_w)
        last = _last_log_line(log_path) if log_path else ""
        reason = line or last or "it exited without saying why"
        if proc.returncode == FuseUnavailableError.exit_code:
            raise FuseUnavailableError(f"{where} {cfg.mountpoint} failed: {reason}")
        if replace and proc.returncode == HANDOVER_EXIT:
            from casfs.node.handover import HandoverUnavailable

            raise HandoverUnavailable(reason)
        raise CasfsError(f"{where} {cfg.mountpoint} failed: {reason}")
    return Worker(cfg, proc, stats_out, log_path, life_w)


def _read_line(fd: int, timeout: float, proc: subprocess.Popen[bytes],
               slow: tuple[float, Callable[[], None]] | None = None) -> str:
    """The child's first line (READY, or why not); ``slow``: (seconds, what to call once
    if no line came within them)."""
    buf = b""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while b"\n" not in buf:
        now = time.monotonic()
        left = deadline - now
        if left <= 0:
            return f"not ready after {timeout:.0f}s"
        if slow is not None and now - t0 >= slow[0]:
            slow[1]()
            slow = None
        if readable(fd, min(left, 0.5)):
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
        elif proc.poll() is not None:
            break
    return buf.split(b"\n", 1)[0].decode(errors="replace").strip()


def _last_log_line(path: Path) -> str:
    """The log's last line that says why: a traceback's frames, its group drawing
    (``|``, ``+-``) and INFO lines are skipped, its final ``Error: ...`` line kept."""
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    for ln in reversed(lines):
        body = ln.strip().lstrip("|+-").strip()
        if not body or body.startswith(_TRACEBACK_NOISE):
            continue
        inside = ln[:1].isspace() or ln.lstrip().startswith(("|", "+"))
        if inside and _EXCEPTION_LINE.match(body):
            return body
        if not inside and not any(f" {lv} " in ln or f"\t{lv}\t" in ln for lv in _QUIET):
            return body
    return ""


_QUIET = ("INFO", "DEBUG")  # a process's last words, not its reason

_TRACEBACK_NOISE = ("File ", "Traceback", "^", "~", "During handling", "The above exception",
                    "Exception Group Traceback", "ExceptionGroup:", "BaseExceptionGroup:")
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Group|Exit)\b.*")


def _environment_error(eg: BaseExceptionGroup[Any]) -> CasfsError | OSError | None:
    """The CasfsError or OSError inside a group trio's nursery raised, where nothing but
    those and cancellations is in it (the environment, e.g. a full disk at READY)."""
    leaves: list[BaseException] = []

    def walk(g: BaseExceptionGroup[Any]) -> None:
        for e in g.exceptions:
            if isinstance(e, BaseExceptionGroup):
                walk(e)
            else:
                leaves.append(e)

    walk(eg)
    found = [e for e in leaves if isinstance(e, CasfsError | OSError)]
    other = [e for e in leaves
             if not isinstance(e, CasfsError | OSError) and type(e).__name__ != "Cancelled"]
    return found[0] if found and not other else None


def _failed(e: CasfsError | OSError, tell: Callable[[str], None]) -> int:
    if isinstance(e, CasfsError):
        log.error("%s", e)
        tell(e.message)
        return e.exit_code
    log.error("%s", e, exc_info=log.isEnabledFor(logging.DEBUG))
    tell(str(e))
    return 1


def _fuse_import(e: ImportError) -> FuseUnavailableError:
    """pyfuse3 (the 'fuse' extra) found but not loadable in the mount process: FUSE is
    unavailable (exit status 8: casfs run serves in dir mode). Any other import error is
    a bug, raised as it is."""
    from casfs.util.fusesupport import fuse_missing

    why = fuse_missing()
    if why is None:
        raise e
    return FuseUnavailableError(why)


class _Service(Protocol):  # built by ``build(cfg)``, or ``build(cfg, replace=True)``
    def serve(self, on_ready: Callable[[], None]) -> None: ...
    def final_stats(self) -> dict[str, Any]: ...


HANDOVER_EXIT = 9  # casfs.node.handover.HandoverUnavailable.exit_code
SLOW_START_NOTE_S = 5.0  # a warm wait this long without READY is said on stderr, once
FD_LIMIT_MAX = 1 << 20  # what a mount process lifts its soft RLIMIT_NOFILE to, at most


def lift_fd_limit() -> None:
    """Lift the soft RLIMIT_NOFILE to the hard limit (at most FD_LIMIT_MAX).

    Each file a job holds open through the mount is an fd here too, for every
    job and cache the process serves, plus the idle fds it keeps; the soft
    limit a login shell hands down (often 1,024) is sized for one program.
    Raising the soft limit up to the hard one needs no privilege (casfsd's
    unit sets both: LimitNOFILE). Every wait on an fd here uses poll, not
    select, which fails above 1,023.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FD_LIMIT_MAX if hard == resource.RLIM_INFINITY else min(hard, FD_LIMIT_MAX)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (OSError, ValueError) as e:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, want, e)


def run_child(prog: str, argv: list[str] | None, load: Callable[[str], Any],
              build: Callable[..., _Service]) -> int:
    """The child side of ``start_process``: config from its pipe, READY once serving.

    ``load`` parses the configuration JSON; ``build`` makes the service (a
    MountService, or the node's host) whose ``serve`` returns at shutdown.
    """
    ap = argparse.ArgumentParser(prog=prog)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--config-json")
    src.add_argument("--config-fd", type=int, help="read the configuration JSON from this fd")
    ap.add_argument("--ready-fd", type=int)
    ap.add_argument("--stats-out")
    ap.add_argument("-v", "--verbose", action="count", default=0)
    ap.add_argument("--log-format", choices=logfmt.FORMATS, default=logfmt.PLAIN)
    ap.add_argument("--log-level", choices=sorted(logfmt.LEVELS))
    ap.add_argument("--lifeline-fd", type=int,
                    help="shut down when this pipe's write end closes (the parent died)")
    ap.add_argument("--adopt-grace", type=float, default=0.0,
                    help="when the lifeline closes, serve on this many seconds for a new"
                         " casfsd to adopt this process (casfs.node.lifeline)")
    ap.add_argument("--replace", action="store_true",
                    help="take the mount point over from the process serving it (handover)")
    ap.add_argument("--adopt", metavar="FD:PID",
                    help="serve the FUSE connection FD of this mount's crashed process PID")
    args = ap.parse_args(argv)
    cfg_text = read_config(args.config_fd, args.config_json)
    cfg = load(cfg_text)
    level = (logfmt.LEVELS[args.log_level] if args.log_level
             else logging.DEBUG if args.verbose > 1 else logging.INFO)
    tag = f"[{cfg.name}] " if args.log_format == logfmt.JOURNAL else ""
    logfmt.setup(level, args.log_format, tag=tag)
    if args.lifeline_fd is not None:
        from casfs import __version__
        from casfs.node import lifeline
        from casfs.util.buildid import build_id

        lifeline.watch(args.lifeline_fd, args.adopt_grace, {
            "config": cfg_text, "stats_out": args.stats_out, "version": __version__,
            "build": build_id() if args.adopt_grace > 0 else None})
    lift_fd_limit()  # before anything sizes a bound from it (idle fds, memfds)

    def tell(msg: str) -> None:
        if args.ready_fd is not None:
            with contextlib.suppress(OSError):
                os.write(args.ready_fd, msg.encode() + b"\n")
                os.close(args.ready_fd)
            args.ready_fd = None

    try:
        if args.adopt:
            fd, pid = (int(x) for x in args.adopt.split(":"))
            svc = build(cfg, adopt=(fd, pid))
        else:
            svc = build(cfg, replace=True) if args.replace else build(cfg)
    except (CasfsError, OSError) as e:
        return _failed(e, tell)
    except ImportError as e:
        return _failed(_fuse_import(e), tell)
    try:
        svc.serve(on_ready=lambda: tell("READY"))
    except (CasfsError, OSError) as e:
        # an OSError here is the environment (mount point unusable, disk full), not a bug:
        # tell the parent in one line instead of dying with only a traceback in a log
        return _failed(e, tell)
    except BaseExceptionGroup as eg:  # the same, from inside the serving nursery
        leaf = _environment_error(eg)
        if leaf is None:
            raise
        return _failed(leaf, tell)
    except ImportError as e:
        return _failed(_fuse_import(e), tell)
    finally:
        if args.stats_out:
            try:
                Path(args.stats_out).write_text(json.dumps(svc.final_stats(), default=str))
            except Exception:  # stats are best effort; the mount is already gone
                log.exception("writing final stats failed")
    return 0


def exit_now(rc: int) -> NoReturn:
    """End a mount process whose ``run_child`` returned: its work is done (the final
    publication, the unmount, the final stats written), and ``casfs run`` waits for
    its exit. The interpreter's own teardown (finalising modules and objects: boto3,
    a namespace's tree) took ~0.1 s of that wait after every job and does nothing
    more when every thread left is a daemon (the workers' watchdogs and readers,
    Trio's cache; the workers end with their parent, by their lifeline; the index is
    closed): then logs and stdio are flushed and the process _exits. Any other
    thread still alive (none is expected): the interpreter's exit, which waits."""
    me = threading.current_thread()
    if any(not t.daemon for t in threading.enumerate() if t is not me):
        sys.exit(rc)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(rc)


def spawn_host(cfg: HostConfig, *, ready_timeout: float = 120.0, log_to_stderr: bool = False,
               log_format: str | None = None, log_level: str | None = None,
               die_with_parent: bool = False, adopt_grace: float = 0.0, verbose: int = 0,
               replace: bool = False, adopt: tuple[int, int] | None = None) -> Worker:
    """Start the node's mount process (casfs.node.host); a Worker once it serves.

    ``replace``: it takes every namespace over from the one serving them (casfs.node.host,
    casfs.node.handover); HandoverUnavailable if that one cannot. ``adopt``: as spawn's."""
    check_fuse()
    cfg.check()
    return start_process(
        "casfs.node.hoststart", cfg, cfg.to_json(), where="the mount process at",
        ready_timeout=ready_timeout, verbose=verbose, log_to_stderr=log_to_stderr,
        log_format=log_format, log_level=log_level, die_with_parent=die_with_parent,
        adopt_grace=adopt_grace, replace=replace, adopt=adopt)


def fresh_start(args: list[str]) -> bool:
    """Whether a mount process starts anew: neither replacing nor adopting another (whose
    root and namespaces it takes over as they are)."""
    return not any(a in ("--replace", "--adopt") or a.startswith("--adopt=") for a in args)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    fresh = fresh_start(args)

    def load(text: str) -> MountConfig:
        cfg = config_from_json(text)
        if fresh:
            # The namespace's first round trips to an object store root, while the mount's
            # imports (~0.11 s: trio alone 0.07) run: what casfs.node.hoststart does for
            # the node's host. MountService takes the result (casfs.node.rootlink).
            from casfs.node import preopen

            try:
                preopen.begin(cfg)
            except Exception as e:  # a head start only: the mount opens the root itself
                log.debug("not reading %s ahead: %s", cfg.namespace, e)
        return cfg

    def build(cfg: MountConfig, replace: bool = False,
              adopt: tuple[int, int] | None = None) -> _Service:
        from casfs.node.mount import MountService

        return MountService(cfg, replace=replace, adopt=adopt)

    return run_child("casfs-worker", args, load, build)


if __name__ == "__main__":
    exit_now(main())
