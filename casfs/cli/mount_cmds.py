"""Mount commands: mount, umount, run, status, stats, publish, refresh."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from casfs import families
from casfs.cli.output import emit_json
from casfs.errors import CasfsError, DaemonUnavailableError, FuseUnavailableError, UsageError
from casfs.node import control
from casfs.node.config import HostConfig, MountConfig
from casfs.util.defaults import (
    default_root,
    default_serve_base,
    default_state_dir,
)

if TYPE_CHECKING:
    from casfs.fingerprint import JobEnv


def make_config(args: argparse.Namespace, family: str, mountpoint: Path,
                namespace: str | None) -> MountConfig:
    from casfs.daemon.config import load_tenants
    from casfs.fingerprint import AUTO, check_namespace, fingerprint
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
        wait_warm=args.wait_warm,
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
        _prewarm([w])
    print(f"mounted {cfg.namespace} at {cfg.mountpoint} (pid {w.proc.pid}, log {w.log_path})")
    return 0


def _find(mountpoint: str | None) -> list[dict[str, Any]]:
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


# How long a query waits for one mount (a stopped or wedged one must not hold the
# report on the others); publish and refresh do work, and wait longer.
QUERY_TIMEOUT = 10.0


def _ask(args: argparse.Namespace, cmd: str, timeout: float = 60.0) -> list[dict[str, Any]]:
    """One reply per namespace: the node's mount process answers for each it serves.

    A mount that does not answer within ``timeout`` gets an entry of its own
    (``ok`` false, ``unreachable`` true, ``error``) and the others are still
    asked; DaemonUnavailableError only when none answers.
    """
    out: list[dict[str, Any]] = []
    lost: list[dict[str, Any]] = []
    want = str(Path(args.mountpoint).absolute()) if args.mountpoint else None
    for m in _find(args.mountpoint):
        try:
            r = control.request(m["socket"], cmd, timeout=timeout)
        except DaemonUnavailableError as e:
            lost.append({"ok": False, "unreachable": True, "name": m.get("name"),
                         "mountpoint": m["mountpoint"], "pid": m.get("pid"),
                         "error": e.message})
            continue
        if not r.get("host"):
            out.append(r)
            continue
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
    try:
        replies = _ask(args, "status", QUERY_TIMEOUT)
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


def summary_line(family: str, st: dict[str, Any] | None) -> str:
    if st is None:
        return f"{family}: no statistics (the mount process died)"
    if st.get("shared"):
        return (f"{family}: {st.get('namespace')} is still used by another job on this node;"
                " it publishes when the last one leaves")
    c = st.get("counters", {})
    last = st.get("last_publish") or {}
    hits = c.get("lookup_lower", 0)
    return (f"{family}: restored {st.get('restored_entries', 0)} entries, {hits} lookups served"
            f" from the cache, {c.get('lookup_miss', 0)} of absent paths,"
            f" {c.get('promoted_files', 0)} promoted,"
            f" {c.get('files_published', 0)} published"
            + (f" ({st['namespace']}@{last['seq']})" if last.get("seq") else "")
            # a conflict is a path another node published first with other bytes: the
            # cluster keeps the first version, so this job's copy stays node-local
            + (f"; {c['publish_conflicts']} paths conflicted (another node's version kept;"
               " --report lists them)" if c.get("publish_conflicts") else "")
            + _not_published(last)
            + _readiness(st))


def _not_published(last: dict[str, Any]) -> str:
    """Why the job's last publication failed (a squatted namespace, a full root...):
    said once in the job's line, never only in the mount process's log."""
    if not last or last.get("ok", True):
        return ""
    return f"; NOT PUBLISHED: {last.get('message')}"


def _readiness(st: dict[str, Any]) -> str:
    """The two readiness points, when the mount reports them (its own process's)."""
    ready, warm = st.get("mount_ready_s"), st.get("warm_ready_s")
    if ready is None:
        return ""
    out = f"; mount-ready {ready:.2f}s"
    if warm is not None:
        out += f", warm-ready {warm:.2f}s"
    elif st.get("counters", {}).get("warm_wait_timeouts"):
        out += ", not warm-ready (--wait-warm timed out)"
    return out


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
    """Where casfs run/env keep the job interpreter's probe (casfs.fingerprint)."""
    return default_state_dir().absolute() / "run" / "probes.json"


def cache_vars(paths: dict[str, str], job_env: dict[str, str] | os._Environ[str],
               companions: bool) -> dict[str, str]:
    """The variables pointing each family's tools at its directory (the registry says which).

    A variable the job already set is never overridden; companions are opt-in.
    """
    return families.env_for(paths, dict(job_env), companions=companions)


def host_config(args: argparse.Namespace, *, for_run: bool) -> HostConfig:
    """The node's mount process this command starts when none runs."""
    from casfs.daemon.config import load_tenants
    from casfs.node.config import HostConfig

    return HostConfig(
        tenants=load_tenants().to_dict(),
        base=default_serve_base().absolute(), root=default_root(),
        state_dir=default_state_dir().absolute(), stable_after=args.stable_after,
        publish_interval=args.publish_interval, refresh_interval=args.refresh_interval,
        allow_other=args.allow_other, scratch_patterns=tuple(args.exclude or ()),
        fetch_timeout=args.fetch_timeout,
        # casfs run's own mount process: the last job out publishes and unmounts.
        grace=0.0 if for_run else 60.0, exit_when_idle=True,
    )


def cmd_env(args: argparse.Namespace) -> int:
    """Lease this job's caches from the node and print the variables pointing at them."""
    from casfs.fingerprint import job_env
    from casfs.node import client

    caches = _caches(_families(args.family, args.namespace), args.namespace,
                     lambda: job_env((), os.environ, args.python, cache=_probe_cache()))
    pid = args.pid or client.lease_pid_default()
    start = host_config(args, for_run=False) if args.start else None
    reply, _sock = client.lease(default_state_dir().absolute(), caches, pid, start=start)
    if args.json:
        emit_json(reply)
        return 0
    paths = {c["family"]: c["path"] for c in reply["caches"]}
    for var, value in cache_vars(paths, os.environ, args.companions).items():
        print(f"export {var}={shlex.quote(value)}")
    print(f"export CASFS_LEASE={shlex.quote(reply['lease'])}")
    return 0


def _why(e: BaseException) -> str:
    return e.message if isinstance(e, CasfsError) else str(e)


def _private_dirs(names: list[str], why: str) -> tuple[dict[str, str], Path]:
    tmp = Path(tempfile.mkdtemp(prefix="casfs-private-"))
    print(f"casfs: warning: {why}; the caches of this run are private and temporary ({tmp})",
          file=sys.stderr)
    out = {}
    for fam in names:
        (tmp / fam).mkdir()
        out[fam] = str(tmp / fam)
    return out, tmp


def _killed(rc: int) -> bool:
    """Whether a job's exit status says a signal ended it (directly, or a shell's
    128+N for its child): then what it was writing may be half-written."""
    return rc < 0 or 128 < rc <= 128 + 64


def cmd_run(args: argparse.Namespace) -> int:
    """Run one job with its caches: shared from the node's mount process when one runs."""
    from casfs.daemon.config import load_tenants
    from casfs.node import client, worker
    from casfs.node.tenant import own_tenant

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("casfs run needs a command: casfs run [--family F] -- CMD ARGS...")
    from casfs.fingerprint import job_env

    started = time.time()
    names = _families(args.family, args.namespace)
    state = default_state_dir().absolute()
    mode = args.mode
    start = host_config(args, for_run=True) if mode == "fuse" else None
    # The node's mount process starts while the job's interpreter is probed.
    early = client.start_early(state, start) if start is not None else None
    try:
        caches = _caches(names, args.namespace,
                         lambda: job_env(cmd, os.environ, args.python, cache=_probe_cache()))
    finally:
        if early is not None:
            early.join()
    paths: dict[str, str] = {}
    lease: tuple[Path, str] | None = None
    workers: list[worker.Worker] = []
    shares: list[_DirJob] = []
    private: Path | None = None
    if mode == "fuse":
        try:
            reply, sock = client.lease(state, caches, os.getpid(), start=start, run=True)
            lease = (sock, reply["lease"])
            paths = {c["family"]: c["path"] for c in reply["caches"]}
        except FuseUnavailableError as e:
            print(f"casfs: warning: {e.message}; serving the caches as plain directories"
                  " (dir mode)", file=sys.stderr)
            mode = "dir"
        except (CasfsError, OSError) as e:
            paths, private = _private_dirs(names, f"no cache can be served ({_why(e)})")
    if mode in ("dir", "overlay"):
        if args.family is None:  # a process per cache here: only the usual ones
            caches = [c for c in caches if c["family"] in families.DEFAULT_DAEMON]
        # One mount process per cache (overlay mounts are per namespace, not muxed).
        base = default_serve_base().absolute() / own_tenant(load_tenants()).id
        try:
            for c in caches:
                cfg = dataclasses.replace(make_config(args, c["family"], base / c["namespace"],
                                                      c["namespace"]), mode=mode,
                                          ingredients=dict(c.get("ingredients") or {}))
                if mode == "dir":
                    # No FUSE, so no node mount process and no leases: the jobs of the
                    # namespace share one dir-mode process, the last one out stops it
                    # (casfs.node.dirshare).
                    shares.append(_join_dir(cfg, c["family"], args.verbose))
                else:
                    workers.append(worker.spawn(cfg, verbose=args.verbose))
                paths[c["family"]] = str(cfg.mountpoint)
        except (CasfsError, OSError) as e:
            for w in workers:
                w.stop()
            for js in shares:
                _leave_dir(js)
            workers, shares = [], []
            paths, private = _private_dirs(names, f"no cache can be served ({_why(e)})")
        if mode == "overlay" and args.wait_warm:
            _prewarm(workers)
    env = dict(os.environ)
    env.update(cache_vars(paths, env, args.companions))
    if lease is not None:
        env["CASFS_LEASE"] = lease[1]
    rc = 1
    job_started = time.time()
    job_ended = job_started
    job_lease: str | None = None
    try:
        proc = subprocess.Popen(cmd, env=env)
        # Forwarded from the start: a Ctrl-C while the job's lease is asked for goes
        # to the job (and its status says it was killed), not into a traceback here.
        old = {s: signal.signal(s, lambda n, f: proc.send_signal(n))
               for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            if lease is not None:
                job_lease = client.follow(lease[0], caches, proc.pid, lease[1])
            rc = proc.wait()
        finally:
            job_ended = time.time()
            for s, h in old.items():
                signal.signal(s, h)
    except OSError as e:  # as a shell: 127 not found, 126 found but not runnable
        rc = 127 if isinstance(e, FileNotFoundError) else 126
        print(f"casfs: error: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
    finally:
        stats: list[tuple[str, dict[str, Any] | None]] = []
        if lease is not None:
            if job_lease is not None:
                client.release(lease[0], job_lease, wait=False)  # killed: said just below
            got = {st.get("namespace"): st
                   for st in client.release(*lease, wait=True, killed=_killed(rc))}
            stats = [(c["family"], got.get(c["namespace"])) for c in caches]
        if _killed(rc):
            _tell_torn([w.cfg.socket_path for w in workers]
                       + [Path(m["socket"]) for js in shares
                          if (m := _serving_dir(js.cfg)) is not None], job_ended)
        stats += [(w.cfg.family, w.stop()) for w in workers]
        stats += [(js.family, _leave_dir(js)) for js in shares]
        idle = [fam for fam, st in stats if len(stats) > 1 and _unused(st)]
        for fam, st in stats:
            if fam not in idle:
                print(f"casfs: {summary_line(fam, st)}", file=sys.stderr)
        if idle:
            print(f"casfs: not used by this job: {', '.join(idle)}", file=sys.stderr)
        for line in _miss_hints(caches, stats):
            print(f"casfs: {line}", file=sys.stderr)
        if args.report:
            _write_report(Path(args.report), cmd, rc, caches, stats,
                          {"setup_s": job_started - started, "job_s": job_ended - job_started,
                           "publish_s": time.time() - job_ended}, private is not None)
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)
    return rc if rc >= 0 else 128 - rc


def _tell_torn(sockets: list[Path], ended: float) -> None:
    """The job was killed: dir and overlay mode's processes hold what it changed just
    before (fuse mode's node mount process learns it from the lease's release)."""
    for sock in sockets:
        try:
            control.request(sock, "torn", timeout=10.0, late=max(0.0, time.time() - ended))
        except CasfsError as e:
            print(f"casfs: warning: a killed job's files may be published: {e.message}",
                  file=sys.stderr)


def _serving_dir(cfg: MountConfig) -> dict[str, Any] | None:
    """The registry entry of a running dir-mode process of ``cfg``'s namespace at its path
    (its pid checked to be the worker that wrote it: an entry left by a process killed
    outright may name a reused pid)."""
    from casfs.node import dirshare

    for m in control.registered(cfg.run_dir):
        if (m.get("namespace") == cfg.namespace and m.get("mountpoint") == str(cfg.mountpoint)
                and dirshare.serves(cfg.run_dir, m)):
            return m
    return None


@dataclasses.dataclass
class _DirJob:
    """This job's part in a dir-mode directory (``own``: the process it spawned, if
    it found none serving)."""

    family: str
    cfg: MountConfig
    share: Any  # casfs.node.dirshare.DirShare
    own: Any = None  # casfs.node.worker.Worker


def _join_dir(cfg: MountConfig, family: str, verbose: int) -> _DirJob:
    from casfs.node import dirshare, worker

    share = dirshare.DirShare(cfg.run_dir, cfg.mountpoint)
    with share.joining():
        other = _serving_dir(cfg)
        if other is not None and share.is_stopping(other):
            # Its final publication has started: what this job wrote would never be
            # watched. Wait for it to exit (nobody joins meanwhile: we hold the join
            # lock), then spawn a fresh one.
            timeout = cfg.shutdown_timeout + 15
            print(f"casfs: {family}: the dir-mode process at {cfg.mountpoint} (pid"
                  f" {other['pid']}) is stopping; waiting for it to exit", file=sys.stderr)
            if not dirshare.wait_exit(int(other["pid"]), timeout):
                raise CasfsError(f"the dir-mode process at {cfg.mountpoint} (pid"
                                 f" {other['pid']}) is stopping and did not exit within"
                                 f" {timeout:.0f}s")
            other = _serving_dir(cfg)
            if other is not None and share.is_stopping(other):
                raise CasfsError(f"the dir-mode process at {cfg.mountpoint} (pid"
                                 f" {other['pid']}) is stopping")
        own = None
        if other is None:
            own = worker.spawn(cfg, verbose=verbose)
            share.spawned(own.proc.pid)
        else:
            print(f"casfs: {family}: sharing {cfg.mountpoint} with another job's dir-mode"
                  f" process (pid {other['pid']}); the last job to end publishes",
                  file=sys.stderr)
        share.enter()
    return _DirJob(family, cfg, share, own)


def _leave_dir(js: _DirJob) -> dict[str, Any] | None:
    """Count this job out of its dir-mode directory; the last one out stops the process
    (final publication) and gets its final stats, the others a "shared" line."""
    from casfs.node import dirshare

    with js.share.leaving() as last:
        if not last:
            if js.own is not None:
                js.own.release()  # it keeps serving the jobs left; the last one stops it
            return {"shared": True, "namespace": js.cfg.namespace}
        if js.own is not None and js.own.proc.poll() is None:
            js.share.stopping(js.own.proc.pid)  # should this job die now: never joined
            return js.own.stop()
        # The one serving now (the one this job shared, or a replacement another job
        # spawned after it died), if a casfs run spawned it: a casfs mount's is not ours.
        other = _serving_dir(js.cfg)
        if other is not None and js.share.spawned() == int(other["pid"]):
            js.share.stopping(int(other["pid"]))
            return dirshare.stop_registered(js.cfg.run_dir, other,
                                            js.cfg.shutdown_timeout + 15)
        if js.own is not None:
            return js.own.stop()  # it died: its stats if it left any
        return {"shared": True, "namespace": js.cfg.namespace} if other is not None else None


def _prewarm(workers: list[Any]) -> None:
    """--wait-warm: the mounts are warm-ready; look the linked hot set up once through
    each overlay (from here, the job's side), so the job's first touch runs at warm
    speed (casfs.view.overlay.prewarm)."""
    from casfs.node.guard import mounts_at
    from casfs.view import overlay

    for w in workers:
        cfg = w.cfg
        top = mounts_at(cfg.mountpoint)[-1:]
        if top and top[0].fstype == "overlay":  # not a mount that fell back to fuse
            overlay.prewarm(overlay.OverlayPaths(cfg.upper, cfg.overlay_base).links,
                            cfg.mountpoint)


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


def _unused(st: dict[str, Any] | None) -> bool:
    """Nothing restored, looked up, written or published: the job never used this cache."""
    if st is None or st.get("shared"):
        return False
    c = st.get("counters", {})
    return not st.get("restored_entries") and not any(
        c.get(k) for k in ("lookup_lower", "lookup_upper", "promoted_files", "files_published",
                           "open_lower", "copy_up"))


def _miss_hints(caches: list[dict[str, Any]],
                stats: list[tuple[str, dict[str, Any] | None]]) -> list[str]:
    """One line per family that restored nothing while related namespaces exist."""
    from casfs.cli.explain import hint
    from casfs.daemon.config import load_tenants
    from casfs.fingerprint import Fingerprint
    from casfs.node.tenant import own_tenant
    from casfs.store.root import SharedRoot

    todo = [c for c, (_, st) in zip(caches, stats, strict=False)
            if st is not None and not st.get("restored_entries") and c.get("ingredients")]
    if not todo:
        return []
    try:
        gens = SharedRoot.open(default_root()).generations()
        tenant = own_tenant(load_tenants()).id
        out = [hint(gens, Fingerprint(c["family"], c["ingredients"]), tenant) for c in todo]
    except (CasfsError, OSError):
        return []  # a hint is a courtesy: never a failure of the run
    return [line for line in out if line]


def _write_report(path: Path, cmd: list[str], rc: int, caches: list[dict[str, Any]],
                  stats: list[tuple[str, dict[str, Any] | None]], timings: dict[str, float],
                  private: bool) -> None:
    """``casfs run --report FILE``: the job's outcome per family, for a launcher to collect."""
    import json
    import socket

    from casfs.util.atomic import write_atomic

    fams = []
    for c, (fam, st) in zip(caches, stats, strict=False):
        cnt = (st or {}).get("counters", {})
        last = (st or {}).get("last_publish") or {}
        fams.append({
            "family": fam, "namespace": c["namespace"],
            "served": st is not None and not private,
            "restored_entries": (st or {}).get("restored_entries", 0),
            "hits": cnt.get("lookup_lower", 0), "opens_from_cache": cnt.get("open_lower", 0),
            "misses": cnt.get("lookup_miss", 0),
            "fetched_objects": cnt.get("objects_fetched", 0),
            "fetched_bytes": cnt.get("bytes_fetched", 0),
            "promoted": cnt.get("promoted_files", 0),
            "published": cnt.get("files_published", 0),
            "published_seq": last.get("seq"),
            "errors": sum(v for k, v in cnt.items()
                          if k.endswith(("_errors", "_timeouts")) or k == "rejections"),
            "conflicts": cnt.get("publish_conflicts", 0),
            "conflict_paths": (st or {}).get("conflict_paths", [])[:10],
            # seconds from the mount's start: the job could start / the hot set was local
            "mount_ready_s": (st or {}).get("mount_ready_s"),
            "warm_ready_s": (st or {}).get("warm_ready_s"),
            "prefetched_files": cnt.get("prefetched_files", 0),
        })
    doc = {"casfs_run_report": 1, "host": socket.gethostname(), "command": cmd,
           "exit_status": rc, "time": time.time(),
           "timings": {k: round(v, 3) for k, v in timings.items()}, "families": fams}
    try:
        write_atomic(path, (json.dumps(doc, indent=1) + "\n").encode())
    except OSError as e:
        print(f"casfs: warning: cannot write the report {path}: {e}", file=sys.stderr)
def _positive(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text}")
    return v


def _non_negative(text: str) -> float:
    v = float(text)
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text}")
    return v


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def family_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--family", default=None,
                       help=f"comma list of {', '.join(families.names())} (default: every"
                            " family; in dir/overlay mode, one process each: "
                            f"{','.join(families.DEFAULT_DAEMON)})")
        p.add_argument("--python", metavar="PATH",
                       help="the job's interpreter, whose packages make the namespace"
                            " (default: the command's, else $VIRTUAL_ENV's, else python3)")
        p.add_argument("--companions", action="store_true",
                       help="also set the families' opt-in companion variables"
                            " (e.g. FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1)")

    def mount_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--wait-warm", type=_non_negative, nargs="?", const=60.0, default=0.0,
                       metavar="S",
                       help="overlay mode: start the job only once the namespace's access"
                            " profile (its hot set) is on the node, so the kernel serves it"
                            " natively; at most S seconds (default 60), then with what is"
                            " local")
        p.add_argument("--namespace", "-n", help="explicit namespace (default: auto)")
        p.add_argument("--name", help="mount name (default: the family)")
        p.add_argument("--stable-after", type=float, default=2.0, metavar="S")
        p.add_argument("--publish-interval", type=float, default=10.0, metavar="S")
        p.add_argument("--refresh-interval", type=float, default=30.0, metavar="S")
        p.add_argument("--fetch-timeout", type=_positive, default=10.0, metavar="S",
                       help="the longest an open waits for the shared root before the job"
                            " gets a miss (default 10)")
        p.add_argument("--allow-other", action="store_true")
        p.add_argument("--exclude", action="append", help="extra scratch glob (repeatable)")
        p.add_argument("--mode", choices=("fuse", "overlay", "dir"), default="fuse",
                       help="fuse (default): lazy overlay mount; overlay: kernel overlayfs over"
                            " local objects and a read-only FUSE view (native speed, needs"
                            " CAP_SYS_ADMIN, else fuse); dir: plain directory restored"
                            " by copy and watched with inotify, for hosts without FUSE")

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
