"""Reclaim the node state of namespaces nobody has served for a long time.

Each namespace a node serves leaves node state behind: its upper directory,
its lower entries and promotion records in the index. Once no mount has served
a namespace for ``idle_after`` seconds, that state is reclaimed: anything in
the upper not yet published is promoted and published first (the shared root
keeps everything, so the namespace is as good as new next time, restored
lazily from the root); if that publication does not complete, nothing is
removed and the next round tries again.

Which namespaces, and how they were served, is recorded by every mount in
``<state>/served/<namespace>.json`` (its MountConfig and the time it was last
served). A namespace whose lock is held is being served right now: skipped.
Dir-mode namespaces are skipped: their files are the job's own directory.

A mount attaching the namespace while it is being reclaimed (a job's `casfs
run`) waits for the reclaim instead of being refused: the reclaim holds
``<state>/run/ns-<namespace>.reclaim`` as long as it holds the namespace's
lock, and the waiting mount holds ``ns-<namespace>.wanted`` (shared). A
reclaim that finds it wanted before it has dropped anything keeps the node
state and lets the mount in (before its promotion, or once its publication
is done); one past that point finishes, and the mount starts as on a fresh
node, restoring lazily from the root. A namespace served again between the
listing that found it idle and the reclaim taking its lock is kept.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

from casfs.errors import CasfsError
from casfs.node.config import MountConfig
from casfs.node.mount import MountService
from casfs.node.nsregistry import (
    SERVED_DIR,
    idle_namespaces,
    last_served,
    lock_file,
    record_path,
    record_served,
    wanted,
)
from casfs.util.crashpoint import pausepoint
from casfs.util.flock import try_flock

log = logging.getLogger(__name__)

__all__ = ["SERVED_DIR", "idle_namespaces", "last_served", "reclaim_idle", "reclaim_one",
           "record_path", "record_served", "unpublished"]


def reclaim_one(cfg: MountConfig, listed: float | None = None) -> dict[str, Any]:
    """Publish what is left, then drop the namespace's node state. Never loses a file.

    ``listed``: when it was last served by the listing that found it idle; served
    again since (a mount came and went before this took its lock), it is kept.
    """
    pausepoint("reclaim-listed")
    ns = cfg.namespace
    fd = lock_file(cfg.run_dir, ns, "reclaim")
    try:
        if not try_flock(fd):
            return {"namespace": ns, "reclaimed": False,
                    "why": "in use: another process is reclaiming it"}
        return _reclaim_locked(cfg, listed)
    finally:
        os.close(fd)  # after the namespace's lock: a waiting mount then finds that free


def _reclaim_locked(cfg: MountConfig, listed: float | None) -> dict[str, Any]:
    ns = cfg.namespace
    try:
        # hosted: the mount point is not ours to touch (it may be served by another).
        svc = MountService(replace(cfg, guard=False), hosted=True, wait_for_reclaim=False)
    except (CasfsError, OSError) as e:  # its lock is held: in use right now
        return {"namespace": ns, "reclaimed": False, "why": f"in use or unavailable: {e}"}
    try:
        if svc.root is None:
            return {"namespace": ns, "reclaimed": False,
                    "why": f"shared root unavailable: {svc.root_error}"}
        pausepoint("reclaim-locked")
        if wanted(cfg.run_dir, ns):  # a job's mount waits for it: let it in at once
            return {"namespace": ns, "reclaimed": False,
                    "why": "in use: a mount is waiting for it"}
        if listed is not None and (last := last_served(cfg)) is not None and last > listed:
            return {"namespace": ns, "reclaimed": False,
                    "why": "in use: served again since it was found idle"}
        svc.promote_once(final=True)
        pub = svc.publish_once() if svc.pending_publication() else {"ok": True}
        left = unpublished(svc)
        if not pub.get("ok") or left:
            return {"namespace": ns, "reclaimed": False,
                    "why": f"{len(left)} files not published yet (e.g. {left[:1]})"
                           f" {pub.get('message', '')}".strip()}
        pausepoint("reclaim-published")
        if wanted(cfg.run_dir, ns):  # a job's mount waits for it: keep its state warm
            return {"namespace": ns, "reclaimed": False,
                    "why": "in use: a mount is waiting for it (published first)",
                    "published": (pub.get("added") or 0)}
        upper = cfg.upper
        entries = svc.index.drop_namespace(ns)
        svc.index.forget_all_promoted(ns)
        svc.index.sync()
        pausepoint("reclaim-dropped")
        shutil.rmtree(upper, ignore_errors=True)
        with contextlib.suppress(OSError):
            (cfg.state_dir / f"restored-{ns}.json").unlink()
        record_path(cfg.state_dir, ns).unlink(missing_ok=True)
        log.info("reclaimed the node state of %s (%d index entries, upper %s)", ns, entries,
                 upper)
        return {"namespace": ns, "reclaimed": True, "entries": entries,
                "published": (pub.get("added") or 0)}
    finally:
        svc.close()


def unpublished(svc: Any) -> list[str]:
    """Regular non-scratch files of the upper that the served generation does not hold."""
    from casfs.families.rules import walk_files

    out = []
    for rel, full, scratch in walk_files(svc.cfg.upper, svc.rules):
        if scratch or rel.startswith(".casfs"):
            continue
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(full).st_mode) and svc.lower.lookup(rel) is None:
                out.append(rel)
    return out


def reclaim_idle(state_dir: Path, idle_after: float, skip: set[str] | None = None,
                 ) -> list[dict[str, Any]]:
    """Reclaim every namespace idle for ``idle_after`` seconds (except ``skip``)."""
    out = []
    for cfg, last in idle_namespaces(state_dir, idle_after):
        if skip and cfg.namespace in skip:
            continue
        try:
            out.append(reclaim_one(cfg, last))
        except (CasfsError, OSError) as e:
            log.warning("reclaiming %s failed: %s", cfg.namespace, e)
            out.append({"namespace": cfg.namespace, "reclaimed": False, "why": str(e)})
    return out
