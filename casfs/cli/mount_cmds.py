"""Mount commands: mount, umount, run, status, stats, publish, refresh."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from casfs.cli.output import emit_json
from casfs.errors import CasfsError, DaemonUnavailableError, UsageError
from casfs.node import control
from casfs.node.config import MountConfig
from casfs.util.defaults import default_mountpoint, default_root, default_state_dir

ENV_VARS = {"triton": "TRITON_CACHE_DIR", "inductor": "TORCHINDUCTOR_CACHE_DIR"}


def make_config(args: argparse.Namespace, family: str, mountpoint: Path,
                namespace: str | None) -> MountConfig:
    from casfs.fingerprint import check_family, resolve_namespace

    check_family(family)
    return MountConfig(
        name=args.name or family,
        family=family,
        namespace=resolve_namespace(family, namespace),
        mountpoint=mountpoint.absolute(),
        root=default_root().absolute(),
        state_dir=default_state_dir().absolute(),
        stable_after=args.stable_after,
        publish_interval=args.publish_interval,
        refresh_interval=args.refresh_interval,
        allow_other=args.allow_other,
        scratch_patterns=tuple(args.exclude or ()),
        mode=args.mode,
    )


def cmd_mount(args: argparse.Namespace) -> int:
    from casfs.node import worker

    cfg = make_config(args, args.family, Path(args.mountpoint), args.namespace)
    if args.foreground:
        if cfg.mode == "fuse":
            worker.check_fuse()
        from casfs.node.mount import MountService

        MountService(cfg).serve()
        return 0
    w = worker.spawn(cfg, verbose=args.verbose)
    print(f"mounted {cfg.namespace} at {cfg.mountpoint} (pid {w.proc.pid}, log {w.log_path})")
    return 0


def _find(mountpoint: str | None) -> list[dict[str, Any]]:
    live = control.registered(default_state_dir() / "run")
    if mountpoint:
        mp = str(Path(mountpoint).absolute())
        live = [m for m in live if m["mountpoint"] == mp or m["name"] == mountpoint]
        if not live:
            raise DaemonUnavailableError(f"no running casfs mount at {mountpoint}")
    elif not live:
        raise DaemonUnavailableError("no casfs mount is running on this node (is casfsd up?)")
    return live


def cmd_umount(args: argparse.Namespace) -> int:
    from casfs.view.session import clear_stale_mount, is_mountpoint, lazy_unmount

    mp = Path(args.mountpoint).absolute()
    try:
        mounts = _find(str(mp))
    except DaemonUnavailableError:
        if clear_stale_mount(mp):
            print(f"cleared a dead mount at {mp}")
            return 0
        if is_mountpoint(mp):
            lazy_unmount(mp)
            print(f"unmounted {mp} (no casfs process was serving it)")
            return 0
        raise
    for m in mounts:
        os.kill(int(m["pid"]), signal.SIGTERM)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            try:
                os.kill(int(m["pid"]), 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise CasfsError(f"casfs mount at {mp} (pid {m['pid']}) did not stop in time")
        print(f"unmounted {m['mountpoint']}")
    return 0


def _ask(args: argparse.Namespace, cmd: str) -> list[dict[str, Any]]:
    return [control.request(m["socket"], cmd) for m in _find(args.mountpoint)]


def _daemon_status() -> dict[str, Any] | None:
    """What casfsd's own socket says, or None when no daemon runs on this state dir."""
    sock = default_state_dir() / "run" / "casfsd.sock"
    if not sock.exists():
        return None
    try:
        reply = control.request(sock, "status", timeout=5)
    except DaemonUnavailableError:
        return None
    return reply if reply.get("ok") else None


def cmd_status(args: argparse.Namespace) -> int:
    daemon = None if args.json or args.mountpoint else _daemon_status()
    try:
        replies = _ask(args, "status")
    except DaemonUnavailableError:
        if daemon is None:
            raise
        replies = []  # casfsd runs, but none of its mounts serves right now
    if args.json:
        emit_json(replies)
        return 0
    if daemon is not None:
        print(f"casfsd: pid {daemon['pid']}, up {daemon['uptime']}s; {daemon['summary']}")
        for m in daemon.get("mounts", []):
            if m.get("state") != "up":
                print(f"{m['name']}: {str(m['state']).upper()} at {m['mountpoint']}"
                      f" (last exit: {m.get('last_exit') or 'none'})")
    for r in replies:
        last = r.get("last_publish") or {}
        print(f"{r['name']}: {r['namespace']}@{r['served_seq']} at {r['mountpoint']}"
              f" (pid {r['pid']}, up {r['uptime']}s); pending promotion {r['pending_promotion']},"
              f" publication {r['pending_publication']}; last publication:"
              f" {last.get('message', 'none')}"
              + ("" if r.get("root_available")
                 else f"; SHARED ROOT UNAVAILABLE: {r['root_error']}"))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    replies = _ask(args, "stats")
    if args.json:
        emit_json([{"name": r["name"], "mountpoint": r["mountpoint"],
                    "counters": r["counters"]} for r in replies])
        return 0
    for r in replies:
        print(f"{r['name']} ({r['mountpoint']}):")
        for k, v in sorted(r["counters"].items()):
            print(f"  {k:<24} {v}")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    replies = _ask(args, "publish")
    if args.json:
        emit_json(replies)
    else:
        for r in replies:
            print(r.get("message") or r.get("error"))
    return 0 if all(r.get("ok") for r in replies) else 1


def cmd_refresh(args: argparse.Namespace) -> int:
    replies = _ask(args, "refresh")
    if args.json:
        emit_json(replies)
    else:
        for r in replies:
            print(f"serving generation {r['served_seq']}" if r.get("ok") else r.get("message"))
    return 0 if all(r.get("ok") for r in replies) else 1


def summary_line(family: str, st: dict[str, Any] | None) -> str:
    if st is None:
        return f"{family}: no statistics (the mount process died)"
    c = st.get("counters", {})
    last = st.get("last_publish") or {}
    hits = c.get("lookup_lower", 0)
    return (f"{family}: restored {st.get('restored_entries', 0)} entries, {hits} lookups served"
            f" from the cache, {c.get('lookup_miss', 0)} of absent paths,"
            f" {c.get('promoted_files', 0)} promoted,"
            f" {c.get('files_published', 0)} published"
            + (f" ({st['namespace']}@{last['seq']})" if last.get("seq") else ""))


def cmd_run(args: argparse.Namespace) -> int:
    from casfs.node import worker

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("casfs run needs a command: casfs run [--family F] -- CMD ARGS...")
    families = [f.strip() for f in args.family.split(",") if f.strip()]
    if args.namespace and len(families) != 1:
        raise UsageError("--namespace needs exactly one --family")
    workers: list[worker.Worker] = []
    env = dict(os.environ)
    try:
        for fam in families:
            cfg = make_config(args, fam, default_mountpoint(fam), args.namespace)
            workers.append(worker.spawn(cfg, verbose=args.verbose))
            if fam in ENV_VARS:
                env[ENV_VARS[fam]] = str(cfg.mountpoint)
            else:
                env["CASFS_CACHE_DIR"] = str(cfg.mountpoint)
        proc = subprocess.Popen(cmd, env=env)
        old = {s: signal.signal(s, lambda n, f: proc.send_signal(n))
               for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            rc = proc.wait()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
    except FileNotFoundError as e:
        rc = 127
        print(f"casfs: error: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
    finally:
        stats = [(w.cfg.family, w.stop()) for w in workers]
        for fam, st in stats:
            print(f"casfs: {summary_line(fam, st)}", file=sys.stderr)
    return rc if rc >= 0 else 128 - rc


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def mount_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--namespace", "-n", help="explicit namespace (default: auto)")
        p.add_argument("--name", help="mount name (default: the family)")
        p.add_argument("--stable-after", type=float, default=2.0, metavar="S")
        p.add_argument("--publish-interval", type=float, default=10.0, metavar="S")
        p.add_argument("--refresh-interval", type=float, default=30.0, metavar="S")
        p.add_argument("--allow-other", action="store_true")
        p.add_argument("--exclude", action="append", help="extra scratch glob (repeatable)")
        p.add_argument("--mode", choices=("fuse", "dir"), default="fuse",
                       help="fuse (default): lazy overlay mount; dir: plain directory restored"
                            " by copy and watched with inotify, for hosts without FUSE")

    p = sub.add_parser("mount", help="mount a namespace as a writable cache directory")
    p.add_argument("mountpoint")
    p.add_argument("--family", default="generic", help="triton, inductor or generic")
    p.add_argument("--foreground", "-f", action="store_true")
    mount_opts(p)
    p.set_defaults(func=cmd_mount)

    p = sub.add_parser("umount", help="publish and unmount a casfs mount")
    p.add_argument("mountpoint")
    p.add_argument("--timeout", type=float, default=60.0)
    p.set_defaults(func=cmd_umount)

    p = sub.add_parser("run", help="mount, run one command with the cache variables set,"
                                   " publish, unmount")
    p.add_argument("--family", default="triton,inductor", help="comma list (default: both)")
    mount_opts(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS")
    p.set_defaults(func=cmd_run)

    for name, fn, help in (
        ("status", cmd_status, "show running mounts"),
        ("stats", cmd_stats, "per-mount counters"),
        ("publish", cmd_publish, "promote and publish now"),
        ("refresh", cmd_refresh, "serve the newest generation now"),
    ):
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("mountpoint", nargs="?", help="mount point or name (default: all)")
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=fn)
