"""Mounts of one namespace at a path: mount, umount."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from casfs import families
from casfs.cli.options import mount_opts
from casfs.errors import CasfsError, DaemonUnavailableError, UsageError
from casfs.node import control
from casfs.node.config import MountConfig
from casfs.util.defaults import default_root, default_state_dir
from casfs.util.libc import libc

log = logging.getLogger(__name__)


def make_config(args: argparse.Namespace, family: str, mountpoint: Path,
                namespace: str | None) -> MountConfig:
    from casfs.fingerprint import AUTO, check_namespace, fingerprint
    from casfs.node.tenant import load_tenants
    from casfs.tenants import Credentials

    families.check(family)
    if args.wait_warm and args.mode != "overlay":
        raise UsageError("--wait-warm needs --mode overlay (other modes serve prefetched"
                         " files as soon as they arrive)")
    # This process's own tenant: a mount it starts is served to it alone.
    policy = load_tenants()
    tenant = policy.resolve(Credentials.of_self())
    ingredients: dict[str, Any] = {}
    if namespace is None or namespace == AUTO:
        fp = fingerprint(family)
        namespace, ingredients = fp.namespace, dict(fp.ingredients)
    state_dir = default_state_dir().absolute()
    return MountConfig(
        name=args.name or _free_name(state_dir, family),
        family=family,
        namespace=tenant.store_namespace(check_namespace(namespace)),
        ingredients=ingredients,
        tenant=tenant.id,
        tenants=policy.to_dict(),
        mountpoint=mountpoint.absolute(),
        root=default_root(),
        state_dir=state_dir,
        stable_after=args.stable_after,
        publish_interval=args.publish_interval,
        refresh_interval=args.refresh_interval,
        allow_other=args.allow_other,
        scratch_patterns=tuple(args.exclude or ()),
        mode=args.mode,
        fetch_timeout=args.fetch_timeout,
        wait_warm=args.wait_warm, prefetch_budget=args.prefetch_budget,
    )


def _free_name(state_dir: Path, family: str) -> str:
    """The family's name, or ``family-N`` when a running mount has it already: the name
    keys a mount's socket and registry, so two mounts sharing one would shadow each
    other (``casfs umount``/``status`` would find only one, and publish neither)."""
    taken = {m.get("name") for m in control.registered(state_dir / "run")}
    n = 1
    name = family
    while name in taken:
        n += 1
        name = f"{family}-{n}"
    return name


def cmd_mount(args: argparse.Namespace) -> int:
    from casfs.node import worker

    cfg = make_config(args, args.family, Path(args.mountpoint), args.namespace)
    if args.foreground:
        if cfg.mode in ("fuse", "overlay"):
            worker.check_fuse()
        from casfs.node.mount import MountService

        MountService(cfg).serve()
        return 0
    w = worker.spawn(cfg, verbose=args.verbose)
    if cfg.wait_warm:
        prewarm([w])
    print(f"mounted {cfg.namespace} at {cfg.mountpoint} (pid {w.proc.pid}, log {w.log_path})")
    return 0


MNT_DETACH = 2


def find(mountpoint: str | None) -> list[dict[str, Any]]:
    live = control.registered(default_state_dir() / "run")
    if mountpoint:
        mp = str(Path(mountpoint).absolute())
        live = [m for m in live if m["mountpoint"] == mp or m["name"] == mountpoint
                or (m.get("host") and mp.startswith(m["mountpoint"] + "/"))]
        if not live:
            raise DaemonUnavailableError(f"no running casfs mount at {mountpoint}")
    elif not live:
        raise DaemonUnavailableError("no casfs mount is running on this node (is casfsd up?)")
    return live


def cmd_umount(args: argparse.Namespace) -> int:
    from casfs.util import beneath
    from casfs.view.session import clear_stale_mount

    mp = Path(args.mountpoint).absolute()
    try:
        # walked through fds, following only root's own symlinks: a tenant's
        # /tmp/casfs-<uid> swapped for a link to casfsd's mount base must not steer
        # root's umount onto casfsd's own mount
        fd: int | None = beneath.open_named(str(mp))
    except FileNotFoundError:
        fd = None  # a mount's name (``casfs umount triton``), or nothing there
    except OSError as e:
        raise UsageError(f"{mp}: {e.strerror} at {e.filename!r}: name the mount point by a"
                         " path of root's own, with no symlink another user could make") from None
    try:
        if fd is not None:
            mp = Path(os.readlink(f"/proc/self/fd/{fd}"))  # where the walk really ended
        try:
            mounts = find(str(mp) if fd is not None else args.mountpoint)
        except DaemonUnavailableError:
            if fd is not None and _detach_unserved(fd, mp):
                return 0
            raise
    finally:
        if fd is not None:
            os.close(fd)
    inside = [m for m in mounts if m.get("host") and m["mountpoint"] != str(mp)]
    if inside:
        raise UsageError(
            f"{mp} is a namespace of this node's mount process (pid {inside[0]['pid']}): it is"
            " published and released when its last job is gone; `casfs umount"
            f" {inside[0]['mountpoint']}` stops every namespace it serves")
    for m in mounts:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(m["pid"]), signal.SIGTERM)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            if not control.running(int(m["pid"])):
                break
            time.sleep(0.1)
        else:
            raise CasfsError(f"casfs mount at {mp} (pid {m['pid']}) did not stop in time")
        # A process that died instead of unmounting (killed meanwhile) leaves its
        # FUSE mount dead (ENOTCONN): never report "unmounted" over one.
        clear_stale_mount(Path(m["mountpoint"]))
        print(f"unmounted {m['mountpoint']}")
    return 0


def _detach_unserved(fd: int, mp: Path) -> bool:
    """Lazily detach the mount (dead, or served by no casfs process) whose root ``fd``
    is, acting on that fd, never on a path string again; False if it is no mount."""
    from casfs.util import statx
    from casfs.view.session import is_dead, lazy_unmount

    at = f"/proc/self/fd/{fd}"  # (a magic link: followed, to exactly the fd's mount)
    dead = is_dead(Path(at))
    root = statx.ident(fd, "").mount_root
    if root is None:  # (a kernel before 5.8 does not say)
        with contextlib.suppress(OSError):
            up = os.open("..", os.O_PATH | os.O_CLOEXEC, dir_fd=fd)
            try:
                root = statx.ident(up, "").dev != statx.ident(fd, "").dev
            finally:
                os.close(up)
    if not dead and not root:
        return False
    if os.geteuid() == 0:
        if libc().umount2(at.encode(), MNT_DETACH) != 0:
            e = ctypes.get_errno()
            raise CasfsError(f"could not unmount {mp}: {os.strerror(e)}")
    else:
        lazy_unmount(mp)  # fusermount3 (setuid) checks the mount is this user's
    print(f"cleared a dead mount at {mp}" if dead
          else f"unmounted {mp} (no casfs process was serving it)")
    return True


def prewarm(workers: list[Any], stop: threading.Event | None = None) -> None:
    """--wait-warm: the mounts are warm-ready; look the linked hot set up once through
    each overlay (from here, the job's side), so the job's first touch runs at warm
    speed (casfs.view.overlay.prewarm). ``stop`` set: no more of it."""
    from casfs.node.guard import mounts_at
    from casfs.view import overlay

    for w in workers:
        cfg = w.cfg
        top = mounts_at(cfg.mountpoint)[-1:]
        if top and top[0].fstype == "overlay":  # not a mount that fell back to fuse
            links = overlay.links_of(top[0].options)  # a successor's are its own
            if links is not None:
                overlay.prewarm(links, cfg.mountpoint, stop)


class Prewarm:
    """``prewarm`` in a thread, beside the job's start; ``stop`` ends it (the job ended:
    its mounts go next) and waits for it, briefly: a lookup stuck in a mount that no
    longer answers must not hold the job's exit (the thread is a daemon)."""

    JOIN = 1.0  # seconds

    def __init__(self, workers: list[Any]) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(workers,),
                                        name="casfs-prewarm", daemon=True)
        self._thread.start()

    def _run(self, workers: list[Any]) -> None:
        try:
            prewarm(workers, self._stop)
        except Exception as e:  # a head start only: the job looks its files up itself
            log.debug("prewarm: %s", e)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.JOIN)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("mount", help="mount a namespace as a writable cache directory")
    p.add_argument("mountpoint")
    p.add_argument("--family", default=families.FALLBACK, help=", ".join(families.names()))
    p.add_argument("--foreground", "-f", action="store_true")
    mount_opts(p)
    p.set_defaults(func=cmd_mount)

    p = sub.add_parser("umount", help="publish and unmount a casfs mount")
    p.add_argument("mountpoint")
    p.add_argument("--timeout", type=float, default=60.0)
    p.set_defaults(func=cmd_umount)
