"""What ``casfs run`` says when its job ends: one line per family, hints, the --report."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from casfs.errors import CasfsError
from casfs.util.defaults import default_root, default_state_dir

# The miss causes' reads after a job (its exit waits for them): none starts past this
# (casfs explain and report, asked for them, allow casfs.cli.misscause.BUDGET_S).
RUN_CAUSES_BUDGET_S = 2.0


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
            + _saved(c)
            + _not_published(last)
            + _readiness(st)
            + (f"; served {st['kept_s']:.0f} s more for a next job on this node, then"
               " released" if st.get("kept_s") else ""))


def saved_text(ms: int) -> str:
    """Compile seconds as the summary says them: ``~212 s``, ``~3.4 s``, ``~1.2 h``."""
    s = ms / 1000
    return f"~{s / 3600:.1f} h" if s >= 36000 else f"~{s:.0f} s" if s >= 10 else f"~{s:.1f} s"


def _saved(c: dict[str, Any]) -> str:
    """Entries the job hit and the compile time they saved (casfs.node.compiletime):
    an estimate, from the figures their makers published (docs/format.md, "cs")."""
    hits, ms = c.get("entries_hit", 0), c.get("compile_ms_saved", 0)
    if not hits:
        return ""
    out = f"; {hits} {'entry' if hits == 1 else 'entries'} hit"
    if ms:
        out += f", saved {saved_text(ms)} of compilation"
    untimed = c.get("entries_hit_untimed", 0)
    if untimed:
        out += f" ({untimed} with no recorded compile time)"
    return out


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


def unused(st: dict[str, Any] | None) -> bool:
    """Nothing restored, looked up, written or published: the job never used this cache."""
    if st is None or st.get("shared"):
        return False
    c = st.get("counters", {})
    return not st.get("restored_entries") and not any(
        c.get(k) for k in ("lookup_lower", "lookup_upper", "promoted_files", "files_published",
                           "open_lower", "copy_up"))


class RootLook:
    """What the summary reads from the shared root after the job: the root opened once,
    the newest record of each namespace of the families it asks about read once, at
    once (casfs.cli.nearest.newest_records). The hints and the miss causes of several
    families each listed the root and read every related namespace one after the other:
    a second or more after the job at 20 ms RTT, before casfs run returned its status.

    Hints go to the families the job used and restored nothing for (one the job never
    looked in is said "not used by this job", not hinted); causes to those whose mount
    named missed entries. Both are a courtesy: a root that cannot be read gives none."""

    def __init__(self, caches: list[dict[str, Any]],
                 stats: list[tuple[str, dict[str, Any] | None]]) -> None:
        pairs = [(c, st) for c, (_, st) in zip(caches, stats, strict=False)
                 if st is not None and c.get("ingredients")]
        self.hinted = [c for c, st in pairs
                       if not st.get("restored_entries") and not unused(st)]
        self.missed = [(c, st) for c, st in pairs if st.get("missed_entries")]
        self._read: tuple[Any, str, dict[str, Any]] | None = None

    def read(self) -> tuple[Any, str, dict[str, Any]]:
        """(the root's generations, this user's tenant, the newest records); raises
        CasfsError or OSError when the root cannot be read."""
        if self._read is None:
            from casfs.cli.nearest import newest_records
            from casfs.node.tenant import load_tenants, own_tenant
            from casfs.store.root import SharedRoot

            gens = SharedRoot.open(default_root()).generations()
            tenant = own_tenant(load_tenants()).id
            fams = {str(c["family"]) for c in self.hinted} | {
                str(c["family"]) for c, _ in self.missed}
            self._read = (gens, tenant, newest_records(gens, fams, tenant))
        return self._read


def bounded_look(look: RootLook, limit: float = 5.0) -> tuple[list[str], dict[str, Any]]:
    """miss_hints and miss_causes in a daemon thread, given up after ``limit`` seconds:
    a courtesy must never hold the job's status on a root that stopped answering."""
    import threading

    out: list[Any] = []

    def work() -> None:
        h = miss_hints(look)
        out.append((h, miss_causes(look)))

    t = threading.Thread(target=work, daemon=True, name="root-look")
    t.start()
    t.join(limit)
    return out[0] if out else ([], {})


def miss_hints(look: RootLook) -> list[str]:
    """One line per family that restored nothing while related namespaces exist."""
    if not look.hinted:
        return []
    from casfs.cli.explain import hint
    from casfs.fingerprint import Fingerprint

    try:
        gens, tenant, latest = look.read()
        out = [hint(gens, Fingerprint(c["family"], c["ingredients"]), tenant, latest)
               for c in look.hinted]
    except (CasfsError, OSError):
        return []  # a hint is a courtesy: never a failure of the run
    return [line for line in out if line]


def miss_causes(look: RootLook) -> dict[str, Any]:
    """Per family whose mount named missed entries: where they exist among the family's
    other namespaces, or that none holds them (casfs.cli.misscause.MissCauses)."""
    if not look.missed:
        return {}  # (and their modules not imported: ~20 ms after every job)
    from casfs.cli.misscause import causes
    from casfs.fingerprint import Fingerprint
    from casfs.node.compiletime import NAMED_CAP

    out: dict[str, Any] = {}
    try:
        gens, tenant, latest = look.read()
    except (CasfsError, OSError):
        return out  # a courtesy, like the hints: never a failure of the run
    for c, st in look.missed:
        named = [str(n) for n in st["missed_entries"]]
        try:
            out[c["family"]] = causes(
                gens, Fingerprint(c["family"], c["ingredients"]), named, tenant=tenant,
                state_dir=default_state_dir().absolute(), latest=latest,
                budget_s=RUN_CAUSES_BUDGET_S,
                # past the cap, the count says how many went unnamed
                total=(st.get("counters", {}).get("entries_missed")
                       if len(named) >= NAMED_CAP else None))
        except (CasfsError, OSError):
            continue
    return out


def write_report(path: Path, cmd: list[str], rc: int, caches: list[dict[str, Any]],
                  stats: list[tuple[str, dict[str, Any] | None]], timings: dict[str, float],
                  private: bool, causes: dict[str, Any] | None = None) -> None:
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
            # publication attempts that found their seq taken by another node (retried)
            "publish_races_lost": cnt.get("publish_races_lost", 0),
            "conflict_paths": (st or {}).get("conflict_paths", [])[:10],
            # seconds from the mount's start: the job could start / the hot set was local
            "mount_ready_s": (st or {}).get("mount_ready_s"),
            "warm_ready_s": (st or {}).get("warm_ready_s"),
            "prefetched_files": cnt.get("prefetched_files", 0),
            # per entry (a family's unit: a Triton kernel, an FX graph), an estimate
            "entries_hit": cnt.get("entries_hit", 0),
            "entries_missed": cnt.get("entries_missed", 0),
            "entries_hit_untimed": cnt.get("entries_hit_untimed", 0),
            "compile_s_saved": round(cnt.get("compile_ms_saved", 0) / 1000, 3),
            # where the missed entries exist: other namespaces of the family, or none
            "miss_causes": (causes[fam].as_dict()
                            if causes is not None and fam in causes else None),
        })
    doc = {"casfs_run_report": 1, "host": socket.gethostname(), "command": cmd,
           "exit_status": rc, "time": time.time(),
           "timings": {k: round(v, 3) for k, v in timings.items()}, "families": fams}
    try:
        write_atomic(path, (json.dumps(doc, indent=1) + "\n").encode())
    except OSError as e:
        print(f"casfs: warning: cannot write the report {path}: {e}", file=sys.stderr)
