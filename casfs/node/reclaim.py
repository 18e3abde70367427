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
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from casfs.errors import CasfsError
from casfs.node.config import MountConfig
from casfs.util import atomic

log = logging.getLogger(__name__)

SERVED_DIR = "served"


def record_path(state_dir: Path, namespace: str) -> Path:
    return state_dir / SERVED_DIR / f"{namespace}.json"


def record_served(cfg: MountConfig) -> None:
    """Note that ``cfg``'s namespace is served now (at start and at the end of a mount)."""
    from casfs.node.worker import config_to_json

    path = record_path(cfg.state_dir, cfg.namespace)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = {"config": json.loads(config_to_json(cfg)), "last_served": time.time()}
        atomic.write_atomic(path, json.dumps(data).encode())
    except OSError as e:
        log.warning("%s: cannot record that it is served: %s", cfg.name, e)


def idle_namespaces(state_dir: Path, idle_after: float, now: float | None = None,
                    ) -> list[tuple[MountConfig, float]]:
    """(config, last served) of namespaces not served for ``idle_after`` seconds."""
    from casfs.node.worker import config_from_json

    now = time.time() if now is None else now
    out = []
    for p in sorted((state_dir / SERVED_DIR).glob("*.json")):
        try:
            data = json.loads(p.read_bytes())
            cfg = config_from_json(json.dumps(data["config"]))
            last = float(data["last_served"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("ignoring unreadable %s: %s", p, e)
            continue
        if now - last >= idle_after and cfg.mode != "dir":
            out.append((cfg, last))
    return out


def reclaim_one(cfg: MountConfig) -> dict[str, Any]:
    """Publish what is left, then drop the namespace's node state. Never loses a file."""
    from casfs.node.mount import MountService

    ns = cfg.namespace
    try:
        # hosted: the mount point is not ours to touch (it may be served by another).
        svc = MountService(replace(cfg, guard=False), hosted=True)
    except (CasfsError, OSError) as e:  # its lock is held: in use right now
        return {"namespace": ns, "reclaimed": False, "why": f"in use or unavailable: {e}"}
    try:
        if svc.root is None:
            return {"namespace": ns, "reclaimed": False,
                    "why": f"shared root unavailable: {svc.root_error}"}
        svc.promote_once(final=True)
        pub = svc.publish_once() if svc.pending_publication() else {"ok": True}
        left = unpublished(svc)
        if not pub.get("ok") or left:
            return {"namespace": ns, "reclaimed": False,
                    "why": f"{len(left)} files not published yet (e.g. {left[:1]})"
                           f" {pub.get('message', '')}".strip()}
        upper = cfg.upper
        entries = svc.index.drop_namespace(ns)
        svc.index.forget_all_promoted(ns)
        svc.index.sync()
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
    for cfg, _last in idle_namespaces(state_dir, idle_after):
        if skip and cfg.namespace in skip:
            continue
        try:
            out.append(reclaim_one(cfg))
        except (CasfsError, OSError) as e:
            log.warning("reclaiming %s failed: %s", cfg.namespace, e)
            out.append({"namespace": cfg.namespace, "reclaimed": False, "why": str(e)})
    return out
