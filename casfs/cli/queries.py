"""Queries and control of running mounts: status, stats, publish, refresh."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from casfs.cli.mounts import find
from casfs.cli.output import emit_json
from casfs.errors import DaemonUnavailableError
from casfs.node import control
from casfs.util.defaults import default_state_dir

# How long a query waits for one mount (a stopped or wedged one must not hold the
# report on the others); publish and refresh do work, and wait longer.
QUERY_TIMEOUT = 10.0
CONNECT_WAIT = 2.0  # seconds a query tries again while a mount's socket is not bound


def _ask(args: argparse.Namespace, cmd: str, timeout: float = 60.0,
         hosts: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One reply per namespace: the node's mount process answers for each it serves.

    A mount that does not answer within ``timeout`` gets an entry of its own
    (``ok`` false, ``unreachable`` true, ``error``) and the others are still
    asked; DaemonUnavailableError only when none answers. An on-demand mount's own
    reply, less its namespaces, goes to ``hosts`` where given.
    """
    out: list[dict[str, Any]] = []
    lost: list[dict[str, Any]] = []
    want = str(Path(args.mountpoint).absolute()) if args.mountpoint else None
    for m in find(args.mountpoint):
        try:
            # connect_wait: a mount process being replaced (a restart, an upgrade) leaves
            # its socket path unbound for a moment; that is no unreachable mount.
            r = control.request(m["socket"], cmd, timeout=timeout, connect_wait=CONNECT_WAIT)
        except DaemonUnavailableError as e:
            lost.append({"ok": False, "unreachable": True, "name": m.get("name"),
                         "mountpoint": m["mountpoint"], "pid": m.get("pid"),
                         "error": e.message})
            continue
        if not r.get("host"):
            out.append(r)
            continue
        if hosts is not None:
            hosts.append({k: v for k, v in r.items() if k != "namespaces"})
        for ns in r.get("namespaces", []):
            if want is None or want == m["mountpoint"] or ns.get("path") == want:
                out.append(ns)
    if lost and not out:
        raise DaemonUnavailableError(lost[0]["error"])
    return out + lost


def _unreachable_line(r: dict[str, Any]) -> str:
    return (f"{r.get('name')}: UNREACHABLE at {r['mountpoint']} (pid {r.get('pid')}): "
            f"{r['error']}")


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
    hosts: list[dict[str, Any]] = []
    try:
        replies = _ask(args, "status", QUERY_TIMEOUT, hosts)
    except DaemonUnavailableError:
        if daemon is None:
            raise
        replies = []  # casfsd runs, but none of its mounts serves right now
    failed = 1 if any(r.get("unreachable") for r in replies) else 0
    if args.json:
        emit_json(replies)
        return failed
    if daemon is not None:
        print(f"casfsd: pid {daemon['pid']}, up {daemon['uptime']}s; {daemon['summary']}")
        for m in daemon.get("mounts", []):
            if m.get("state") != "up":
                print(f"{m['name']}: {str(m['state']).upper()} at {m['mountpoint']}"
                      f" (last exit: {m.get('last_exit') or 'none'})")
    for h in hosts:
        if "handles_per_tenant" in h:  # (a mount process from before the bound: none)
            print(f"on-demand mount at {h['mountpoint']} (pid {h['pid']}, up {h['uptime']}s):"
                  f" {h['leases']} leases; open files at most {h['handles_per_tenant']} a"
                  f" tenant, {h['handles_refused']} refused")
    for r in replies:
        if r.get("unreachable"):
            print(_unreachable_line(r))
            continue
        last = r.get("last_publish") or {}
        print(f"{r['name']}: {r['namespace']}@{r['served_seq']} at {r['mountpoint']}"
              f" (pid {r['pid']}, up {r['uptime']}s); pending promotion {r['pending_promotion']},"
              f" publication {r['pending_publication']}; last publication:"
              f" {last.get('message', 'none')}"
              + ("" if r.get("root_available")
                 else f"; SHARED ROOT UNAVAILABLE: {r['root_error']}"))
    return failed


def cmd_stats(args: argparse.Namespace) -> int:
    replies = _ask(args, "stats", QUERY_TIMEOUT)
    failed = 1 if any(r.get("unreachable") for r in replies) else 0
    if args.json:
        emit_json([r if r.get("unreachable") else
                   {"name": r["name"], "mountpoint": r["mountpoint"],
                    "mount_ready_s": r.get("mount_ready_s"),
                    "warm_ready_s": r.get("warm_ready_s"),
                    "counters": r["counters"]} for r in replies])
        return failed
    for r in replies:
        if r.get("unreachable"):
            print(_unreachable_line(r))
            continue
        print(f"{r['name']} ({r['mountpoint']}):")
        c = r["counters"]
        if c.get("entries_hit") or c.get("entries_missed"):
            from casfs.cli.summary import saved_text

            print(f"  compile time saved {saved_text(c.get('compile_ms_saved', 0))}"
                  f" ({c.get('entries_hit', 0)} entries hit,"
                  f" {c.get('entries_missed', 0)} missed; an estimate)")
        # The two readiness points: the job may start / the profile's hot set is local.
        for k in ("mount_ready_s", "warm_ready_s"):
            if r.get(k) is not None:
                print(f"  {k:<24} {r[k]}")
        for k, v in sorted(r["counters"].items()):
            print(f"  {k:<24} {v}")
    return failed


def cmd_publish(args: argparse.Namespace) -> int:
    replies = _ask(args, "publish")
    if args.json:
        emit_json(replies)
    else:
        for r in replies:
            if r.get("unreachable"):
                print(_unreachable_line(r))
                continue
            for one in r.get("namespaces") or [r]:  # a node's mount process serves several
                where = f"{one['path']}: " if one.get("path") else ""
                print(where + str(one.get("message") or one.get("error")))
    return 0 if all(r.get("ok") for r in replies) else 1


def cmd_refresh(args: argparse.Namespace) -> int:
    replies = _ask(args, "refresh")
    if args.json:
        emit_json(replies)
    else:
        for r in replies:
            print(f"serving generation {r['served_seq']}" if r.get("ok") else
                  _unreachable_line(r) if r.get("unreachable") else r.get("message"))
    return 0 if all(r.get("ok") for r in replies) else 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
