"""``casfs doctor``: check this node's setup, one line per check."""

from __future__ import annotations

import argparse
import functools
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from casfs.cli.output import emit_json
from casfs.errors import CasfsError
from casfs.util.defaults import default_root, default_serve_base, default_state_dir
from casfs.util.location import S3Location

MIN_FREE_BYTES = 1 << 30


def _fuse() -> tuple[str, str]:
    from casfs.util.fusesupport import fuse_missing

    why = fuse_missing()  # pyfuse3 is the 'fuse' extra: dir mode works without it
    if why is not None:
        return "warn", f"{why}; casfs run serves the caches as plain directories (dir mode)"
    if not os.path.exists("/dev/fuse"):
        return "fail", "/dev/fuse is missing (containers: --device /dev/fuse --cap-add SYS_ADMIN)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "fail", "/dev/fuse is not readable and writable by this user"
    if shutil.which("fusermount3") is None:
        return "warn", "fusermount3 is missing (package fuse3): unprivileged mounts will fail"
    return "ok", "/dev/fuse and fusermount3 present"


def _state() -> tuple[str, str]:
    from casfs.util.fsinfo import check_local_fs

    state = default_state_dir()
    probe = state if state.exists() else state.parent
    while not probe.exists():
        probe = probe.parent
    fstype = check_local_fs(probe, "node state dir")
    free = shutil.disk_usage(probe).free
    if free < MIN_FREE_BYTES:
        return "warn", f"{state} ({fstype}): only {free >> 20} MiB free"
    return "ok", f"{state} on {fstype}, {free >> 30} GiB free"


def _index() -> tuple[str, str]:
    from casfs.index.lmdbenv import index_path
    from casfs.index.node_index import NodeIndex

    state = default_state_dir()
    if not index_path(state).exists():
        return "ok", "no node index yet (created on first mount)"
    with NodeIndex.open(state, readonly=True) as idx:
        return "ok", f"node index opens (node id {idx.node_id})"


def _root() -> tuple[str, str]:
    from casfs.store.root import SharedRoot

    root = default_root()
    if isinstance(root, S3Location):
        return _s3_root(root)
    if not root.exists():
        return "ok", f"no shared root at {root} yet (created on first use)"
    r = SharedRoot.open(root)
    tmp = r.path / "tmp"
    if not os.access(tmp, os.W_OK):
        return "warn", f"{r.path}: read-only for this user (mounts serve but cannot publish)"
    free = shutil.disk_usage(r.path).free
    n = len(r.generations().namespaces())
    return "ok", f"{r.path}: format ok, {n} namespaces, {free >> 30} GiB free"


def _s3_root(loc: S3Location) -> tuple[str, str]:
    """Endpoint reachable, credentials accepted, create-only honoured, root readable."""
    from casfs.store.root import SharedRoot, probe_create_only

    r = SharedRoot.open(loc, timeout=10.0)  # reaches the endpoint and reads the marker
    probe_create_only(r.backend, str(loc))
    n = len(r.generations().namespaces())
    return "ok", f"{loc}: reachable, credentials accepted, create-only writes honoured," \
                 f" format ok, {n} namespaces"


MOUNT_PROBE_S = 5.0  # a mount whose process is stuck answers nothing: never wait on it


def _mounts() -> tuple[str, str]:
    from casfs.errors import UsageError
    from casfs.node import control, guard
    from casfs.util.bounded import StillBlocked, call_bounded
    from casfs.view.session import is_dead

    live = control.registered(default_state_dir() / "run")
    dead: list[str] = []
    problems: list[str] = []
    # Left by a casfs run killed with its mount process: in no registry, still mounted.
    known = {str(Path(m["mountpoint"])) for m in live}
    left = [mp for mp in guard.casfs_mounts_under(default_serve_base()) if mp not in known]
    for mp in [Path(m["mountpoint"]) for m in live] + [Path(p) for p in left]:
        try:  # the mount table first: a tenant's FUSE mount stacked there is never asked
            guard.refuse_foreign(mp, "nothing")
            if call_bounded(f"doctor:{mp}", functools.partial(is_dead, mp), MOUNT_PROBE_S):
                dead.append(str(mp))
        except UsageError as e:
            problems.append(e.message.split(";")[0])
        except StillBlocked:
            problems.append(f"{mp}: no answer within {MOUNT_PROBE_S:g} s (its process is"
                            " stuck: see its log, or casfs umount it)")
    if dead:
        problems.insert(0, f"dead mounts (ENOTCONN): {', '.join(dead)}; run casfs umount"
                           " on them")
    if problems:
        return "fail", "; ".join(problems)
    return "ok", f"{len(live)} running mounts"


# Counters that mean the store or the root misbehaved (docs/reliability.md).
_DAMAGE_COUNTERS = ("bad_generations", "newer_format_generations", "unresolved_generations",
                    "oversize_generations", "rejections", "fetch_timeouts",
                    "publish_refused_newer_format", "publish_deferred", "publish_errors")


def _health() -> tuple[str, str]:
    """What the running mounts saw: failing promotion or publication, damage, timeouts."""
    from casfs.node import control

    problems: list[str] = []
    for m in control.registered(default_state_dir() / "run"):
        try:
            reply = control.request(m["socket"], "status", timeout=5)
        except (CasfsError, OSError):
            continue  # a dead mount: _mounts says so
        for st in reply.get("namespaces") or [reply]:
            name = st.get("namespace") or m.get("name", "?")
            last = st.get("last_publish") or {}
            if st.get("promotion_error"):
                problems.append(f"{name}: {st.get('pending_promotion')} files cannot be"
                                f" promoted: {st['promotion_error']}")
            elif last and not last.get("ok"):
                problems.append(f"{name}: last publication: {last.get('message')}")
            counters = st.get("counters") or {}
            seen = [f"{k}={counters[k]}" for k in _DAMAGE_COUNTERS if counters.get(k)]
            if seen:
                problems.append(f"{name}: {', '.join(seen)}")
    if problems:
        return "warn", "; ".join(problems)
    return "ok", "no failing promotion or publication, no damage seen by running mounts"


def _tenant() -> tuple[str, str]:
    """Which tenant this user's jobs are, under the node's policy, and how they get caches."""
    from casfs.node.client import jobs_socket
    from casfs.node.tenant import load_tenants, own_tenant

    policy = load_tenants()
    t = own_tenant(policy)
    sock = jobs_socket()
    how = (f"casfsd's jobs socket {sock} is there (eval \"$(casfs env)\")" if sock.exists()
           else f"no casfsd jobs socket at {sock} (casfs run serves this user alone)")
    detail = f"tenant {t.id} (mode {policy.mode}, trust {policy.trust}); {how}"
    if policy.trust == "signature" and policy.signing_key is None and not sock.exists():
        return "warn", (detail + "; this user cannot sign, so what casfs run publishes is not"
                        " served by signature-checking nodes")
    return "ok", detail


def _squatted() -> tuple[str, str]:
    """This user's namespaces on a POSIX root that someone else made first.

    Without casfsd (root) to move such a directory aside, the tenant publishes
    nothing there: say so, with who owns it, instead of failing silently.
    """
    from casfs.node.tenant import load_tenants, own_tenant
    from casfs.store.tenancy import TenantTrust
    from casfs.tenants import SEP

    root = default_root()
    policy = load_tenants()
    if isinstance(root, S3Location) or policy.trust != "owner" or policy.mode != "uid":
        return "ok", "not applicable (object store, signatures or cluster mode)"
    prefix = own_tenant(policy).id + SEP
    try:
        names = [n for n in os.listdir(root / "namespaces") if n.startswith(prefix)]
    except FileNotFoundError:
        return "ok", "no namespaces yet"
    trust = TenantTrust(policy, root)
    bad = []
    for ns in sorted(names):
        try:
            trust.check_namespace(ns)
        except CasfsError as e:
            bad.append(e.message)
    if bad:
        return "warn", ("; ".join(bad) + ": this user's jobs publish nothing there; a root"
                        " casfsd moves such a directory aside, or an admin can")
    return "ok", f"{len(names)} namespaces of this tenant, each its own"


CHECKS: list[tuple[str, Callable[[], tuple[str, str]]]] = [
    ("fuse", _fuse), ("state_dir", _state), ("index", _index), ("shared_root", _root),
    ("mounts", _mounts), ("health", _health), ("tenant", _tenant), ("namespaces", _squatted),
]


def cmd_doctor(args: argparse.Namespace) -> int:
    results: list[dict[str, Any]] = []
    for name, fn in CHECKS:
        try:
            status, detail = fn()
        except (CasfsError, OSError) as e:
            status, detail = "fail", str(e)
        results.append({"check": name, "status": status, "detail": detail})
    if args.json:
        emit_json(results)
    else:
        for r in results:
            print(f"{r['status'].upper():<4} {r['check']:<11} {r['detail']}")
    return 1 if any(r["status"] == "fail" for r in results) else 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("doctor", help="check this node's casfs setup")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor)
