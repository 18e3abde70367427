"""A job's caches: casfs env (lease, print the variables), casfs run (lease, run, publish,
say how it went), casfs reclaim. The mechanics live in the node layer
(casfs.node.client, casfs.node.jobrun); this module parses, probes the job's
interpreter and prints."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from casfs import families
from casfs.cli import summary
from casfs.cli.mounts import Prewarm, make_config
from casfs.cli.options import family_opts, mount_opts
from casfs.cli.output import emit_json
from casfs.errors import CasfsError, UsageError
from casfs.node.config import HostConfig, MountConfig
from casfs.util.defaults import default_root, default_serve_base, default_state_dir

if TYPE_CHECKING:
    from casfs.fingerprint import JobEnv


def _families(spec: str | None, namespace: str | None) -> list[str]:
    if spec is None:
        if namespace:
            raise UsageError("--namespace needs exactly one --family")
        return list(families.default_run())
    names = [families.check(f.strip()) for f in spec.split(",") if f.strip()]
    if namespace and len(names) != 1:
        raise UsageError("--namespace needs exactly one --family")
    return names


def _caches(names: list[str], namespace: str | None,
            job: Callable[[], JobEnv]) -> list[dict[str, Any]]:
    """The job's namespaces and their ingredients, computed on the job's side for the node.

    ``job`` probes the job's interpreter (a subprocess): called only when an
    ``auto`` namespace needs it.
    """
    from casfs.fingerprint import AUTO, check_namespace, fingerprint

    out: list[dict[str, Any]] = []
    for f in names:
        if namespace is None or namespace == AUTO:
            fp = fingerprint(f, job())
            out.append({"family": f, "namespace": fp.namespace, "ingredients": fp.ingredients})
        else:
            out.append({"family": f, "namespace": check_namespace(namespace)})
    return out


def _probe_cache() -> Path:
    """Where casfs run/env keep the job interpreter's probe (casfs.fingerprint), and
    beside it the node's nvidia-smi answer (both valid while what they depend on is)."""
    from casfs.fingerprint import keep_gpus_in

    run = default_state_dir().absolute() / "run"
    keep_gpus_in(run / "gpus.json")
    return run / "probes.json"


def cache_vars(paths: dict[str, str], job_env: dict[str, str] | os._Environ[str],
               companions: bool) -> dict[str, str]:
    """The variables pointing each family's tools at its directory (the registry says which).

    A variable the job already set is never overridden; companions are opt-in.
    """
    return families.env_for(paths, dict(job_env), companions=companions)


def host_config(args: argparse.Namespace, *, for_run: bool) -> HostConfig:
    """The node's mount process this command starts when none runs."""
    from casfs.node.tenant import load_tenants

    return HostConfig(
        tenants=load_tenants().to_dict(),
        base=default_serve_base().absolute(), root=default_root(),
        state_dir=default_state_dir().absolute(), stable_after=args.stable_after,
        publish_interval=args.publish_interval, refresh_interval=args.refresh_interval,
        allow_other=args.allow_other, scratch_patterns=tuple(args.exclude or ()),
        fetch_timeout=args.fetch_timeout, prefetch_budget=args.prefetch_budget,
        # casfs run's own mount process: the last job out publishes and unmounts.
        grace=0.0 if for_run else 60.0, exit_when_idle=True,
    )


def _preopened(start: HostConfig, caches: list[dict[str, Any]]) -> HostConfig:
    """``start`` reading ``caches``' namespaces from the root while it starts, should it
    be the one that serves them (casfs.node.preopen; the tenant: this user's)."""
    from casfs.node.tenant import own_tenant

    try:
        tenant = own_tenant(start.policy).id
    except CasfsError:  # no tenant here: the lease says so
        return start
    return dataclasses.replace(start, preopen=tuple(
        (tenant, str(c["family"]), str(c["namespace"])) for c in caches))


def cmd_env(args: argparse.Namespace) -> int:
    """Lease this job's caches from the node and print the variables pointing at them."""
    from casfs.fingerprint import job_env
    from casfs.node import client

    probes = _probe_cache()
    caches = _caches(_families(args.family, args.namespace), args.namespace,
                     lambda: job_env((), os.environ, args.python, cache=probes))
    pid = args.pid or client.lease_pid_default()
    start = _preopened(host_config(args, for_run=False), caches) if args.start else None
    reply, _sock = client.lease(default_state_dir().absolute(), caches, pid, start=start)
    if args.json:
        emit_json(reply)
        return 0
    paths = {c["family"]: c["path"] for c in reply["caches"]}
    for var, value in cache_vars(paths, os.environ, args.companions).items():
        print(f"export {var}={shlex.quote(value)}")
    print(f"export CASFS_LEASE={shlex.quote(reply['lease'])}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run one job with its caches: shared from the node's mount process when one runs."""
    from casfs.fingerprint import AUTO, gpus_known, job_env, job_env_kept
    from casfs.node import client, jobrun
    from casfs.node.tenant import load_tenants, own_tenant

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("casfs run needs a command: casfs run [--family F] -- CMD ARGS...")
    started = time.time()
    names = _families(args.family, args.namespace)
    state = default_state_dir().absolute()
    start = host_config(args, for_run=True) if args.mode == "fuse" else None

    probes = _probe_cache()  # and the GPU's answer kept beside it from now on

    def probe() -> JobEnv:
        return job_env(cmd, os.environ, args.python, cache=probes)

    # Namespaces known now (named, or from the job's interpreter probed by an earlier
    # job): the mount process, if it is ours to start, reads them from the root while it
    # starts. Else it starts while the job's interpreter is probed (and, on a GPU node's
    # first job, nvidia-smi asked: the fingerprints name the GPU).
    kept = job_env_kept(cmd, os.environ, args.python, cache=probes) \
        if args.namespace in (None, AUTO) and gpus_known() else None
    caches = _caches(names, args.namespace, lambda: kept if kept is not None else probe()) \
        if args.namespace not in (None, AUTO) or kept is not None else None
    if start is not None and caches is not None:
        start = _preopened(start, caches)
    early = client.start_early(state, start) if start is not None else None
    try:
        if caches is None:
            caches = _caches(names, args.namespace, probe)
    finally:
        if early is not None:
            early.join()

    def config_for(c: dict[str, Any]) -> MountConfig:
        # One mount process per cache (overlay mounts are per namespace, not muxed).
        base = default_serve_base().absolute() / own_tenant(load_tenants()).id
        cfg = make_config(args, c["family"], base / c["namespace"], c["namespace"])
        return dataclasses.replace(cfg, ingredients=dict(c.get("ingredients") or {}))

    # A process per cache in dir/overlay mode: only the usual ones unless the job named some.
    jc = jobrun.serve(caches, names, args.mode, state, start=start, config_for=config_for,
                      default_families=(list(families.DEFAULT_DAEMON) if args.family is None
                                        else None),
                      verbose=args.verbose)
    # The linked hot set looked up through each overlay beside the job's start (its
    # interpreter's, its imports': tens of ms to seconds), not before it: a name the
    # job reaches first it looks up itself, as it would without.
    warming = Prewarm(jc.workers) if (jc.workers and args.mode == "overlay"
                                      and args.wait_warm) else None
    env = dict(os.environ)
    env.update(cache_vars(jc.paths, env, args.companions))
    if jc.lease is not None:
        env["CASFS_LEASE"] = jc.lease[1]
    rc = 1
    job_started = job_ended = time.time()
    try:
        proc = subprocess.Popen(cmd, env=env)
        # Forwarded from the start: a Ctrl-C while the job's lease is asked for goes
        # to the job (and its status says it was killed), not into a traceback here.
        # Not a terminal's Ctrl-C when the job is in our foreground group: the kernel
        # sent it to the job too, and a second one broke the job's own handling of it
        # (a review: a checkpoint saved on Ctrl-C, interrupted by the copy).
        tty_shared = _terminal_group_is_ours()

        def forward(n: int, _frame: object) -> None:
            if not (n == signal.SIGINT and tty_shared and _in_our_group(proc.pid)):
                proc.send_signal(n)

        old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            jc.follow(proc.pid)
            rc = proc.wait()
        finally:
            job_ended = time.time()
            if warming is not None:
                warming.stop()
            for s, h in old.items():
                signal.signal(s, h)
    except OSError as e:  # as a shell: 127 not found, 126 found but not runnable
        rc = 127 if isinstance(e, FileNotFoundError) else 126
        print(f"casfs: error: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
    finally:
        stats = jc.finish(rc, job_ended)
        idle = [fam for fam, st in stats if len(stats) > 1 and summary.unused(st)]
        for fam, st in stats:
            if fam not in idle:
                print(f"casfs: {summary.summary_line(fam, st)}", file=sys.stderr)
        if idle:
            print(f"casfs: not used by this job: {', '.join(idle)}", file=sys.stderr)
        look = summary.RootLook(jc.caches, stats)
        hints, causes = summary.bounded_look(look)
        for line in hints:
            print(f"casfs: {line}", file=sys.stderr)
        for mc in causes.values():
            if (line := mc.line()) is not None:
                print(f"casfs: {line}", file=sys.stderr)
        if args.report:
            summary.write_report(
                Path(args.report), cmd, rc, jc.caches, stats,
                {"setup_s": job_started - started, "job_s": job_ended - job_started,
                 "publish_s": time.time() - job_ended}, jc.private is not None, causes)
        jc.cleanup()
    return rc if rc >= 0 else 128 - rc


def _in_our_group(pid: int) -> bool:
    """Whether ``pid`` is still in this process's group (a job may make its own)."""
    try:
        return os.getpgid(pid) == os.getpgrp()
    except OSError:
        return False


def _terminal_group_is_ours() -> bool:
    """Whether this process's group is its terminal's foreground group (the job, a child
    left in it, gets the terminal's Ctrl-C from the kernel as we do)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def cmd_reclaim(args: argparse.Namespace) -> int:
    """Publish what is left of idle namespaces on this node, then drop their node state."""
    from casfs.node.reclaim import reclaim_idle

    out = reclaim_idle(default_state_dir().absolute(), args.idle)
    if args.json:
        emit_json(out)
    else:
        for r in out:
            print(f"{r['namespace']}: reclaimed ({r.get('published', 0)} files published first)"
                  if r["reclaimed"] else f"{r['namespace']}: kept ({r['why']})")
    return 0 if all(r["reclaimed"] for r in out) else 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("env", help="lease this job's caches from the node; print the"
                                   " variables (eval \"$(casfs env)\")")
    family_opts(p)
    p.add_argument("--pid", type=int, help="the process holding the lease (default: the caller)")
    p.add_argument("--start", action="store_true",
                   help="start the node's mount process if none runs (it exits after the"
                        " last lease)")
    p.add_argument("--json", action="store_true")
    mount_opts(p)
    p.set_defaults(func=cmd_env)

    p = sub.add_parser("run", help="run one command with its caches (shared with other jobs"
                                   " on the node), publish when the last job leaves")
    family_opts(p)
    mount_opts(p)
    p.add_argument("--report", metavar="FILE",
                   help="write the job's outcome per family as JSON (namespace, restored"
                        " entries, hits, misses, fetched bytes, promoted, published, errors,"
                        " timings)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("reclaim", help="publish, then drop the node state of namespaces not"
                                       " served for --idle seconds")
    p.add_argument("--idle", type=float, default=7 * 86400.0, metavar="S",
                   help="idle time before a namespace is reclaimed (default: 7 days)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_reclaim)
