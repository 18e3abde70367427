"""``casfs report``: the cluster in one page, from the shared root alone.

For a window (``--since 7d``): compile time saved and hit ratio per family and
per day, per namespace and per node (outcome records, casfs.store.outcomes:
hits and misses are per *entry*, a family's unit); the store's size, unique
bytes, dedup ratio and growth (casfs du's machinery and the generation
records); the most-missed entries; the namespaces nobody read (read records,
casfs.store.reads). A terminal table by default, ``--json`` for scripts,
``--html FILE`` for one self-contained page whose figures are rendered from
the same JSON, embedded in it (``<script type="application/json"
id="casfs-report">``): no network at view time.

Each most-missed entry names its cause (casfs.cli.misscause, as ``casfs run``'s
summary does for a job): the nearest other namespace of its family (and tenant)
whose newest generation holds it, with the ingredients that differ, or that
none of those read holds it. Bounded: at most ``misscause.MAX_NAMESPACES``
namespaces per missed namespace, each other namespace's manifests read once (the
node's cache of them, casfs.index.entrynames) and none read past
``CAUSES_BUDGET_S``; ``miss_causes.complete`` says whether all were read.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from casfs import families
from casfs.errors import CasfsError, UsageError
from casfs.store import maintenance, outcomes, reads
from casfs.store.root import SharedRoot
from casfs.tenants import split_store_namespace

FORMAT = 1
MOST_MISSED = 20
CAUSES_BUDGET_S = 1.5  # the most-missed entries' causes: no namespace read past this
GROWTH_RECORDS = 64  # generation records read per namespace for its growth, newest first


def parse_since(text: str) -> float:
    """``7d``, ``12h``, ``90m``, ``30s`` or a bare number of days: seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([dhms]?)\s*", text)
    if not m:
        raise UsageError(f"--since: expected e.g. 7d, 12h or 30m, not {text!r}")
    n = float(m.group(1))
    return n * {"d": 86400, "h": 3600, "m": 60, "s": 1, "": 86400}[m.group(2)]


def _ratio(hits: int, misses: int) -> float | None:
    return round(hits / (hits + misses), 4) if hits + misses else None


def _figures(hits: int, misses: int, saved_ms: int, untimed: int = 0) -> dict[str, Any]:
    return {"hits": hits, "misses": misses, "hit_ratio": _ratio(hits, misses),
            "saved_s": round(saved_ms / 1000, 3), "untimed_hits": untimed}


class _Sum:
    __slots__ = ("hits", "misses", "saved_ms", "untimed")

    def __init__(self) -> None:
        self.hits = self.misses = self.saved_ms = self.untimed = 0

    def add(self, r: outcomes.Row) -> None:
        self.hits += r.hits
        self.misses += r.misses
        self.saved_ms += r.saved_ms
        self.untimed += r.untimed

    def json(self) -> dict[str, Any]:
        return _figures(self.hits, self.misses, self.saved_ms, self.untimed)


def _family_of(ns: str, said: str | None) -> str:
    if said in families.names():
        return said
    head = split_store_namespace(ns)[1].split("-", 1)[0]
    return head if head in families.names() else "unknown"


def _days(since: float, now: float) -> list[str]:
    """Every UTC day from ``since``'s to ``now``'s."""
    import datetime

    day = datetime.date.fromisoformat(outcomes.day_of(since))
    last = datetime.date.fromisoformat(outcomes.day_of(now))
    out = []
    while day <= last:
        out.append(day.isoformat())
        day += datetime.timedelta(days=1)
    return out


def _read_in_window(root: SharedRoot, ns: str, since: float) -> bool:
    """Whether a read record may name a path opened at or after ``since`` (names only)."""
    for name in root.backend.list(f"namespaces/{ns}/reads"):
        head = name.split("-", 1)[0]
        if len(head) == 12 and head.isdigit() and int(head) + reads.MAX_EPOCH >= since:
            return True
    return False


def _growth(gens: Any, ns: str, since: float) -> tuple[int, int, dict[str, int], bool]:
    """(bytes added, entries added, bytes added per day, exact) in the window, from the
    namespace's generation records (newest first, at most GROWTH_RECORDS)."""
    seqs = sorted(gens.seqs(ns), reverse=True)[:GROWTH_RECORDS]
    recs = []
    for seq in seqs:
        try:
            recs.append(gens.record(ns, seq))
        except (CasfsError, OSError):
            continue
        if recs[-1].created < since:
            break
    if not recs:
        return 0, 0, {}, True
    per_day: dict[str, int] = defaultdict(int)
    for newer, older in itertools.pairwise(recs):
        if newer.created >= since:
            per_day[outcomes.day_of(newer.created)] += newer.logical_bytes - older.logical_bytes
    oldest = recs[-1]
    if oldest.created < since:
        base_b, base_e, exact = oldest.logical_bytes, oldest.entries, True
    else:  # every record read is in the window: from nothing if it is the first one
        exact = oldest.seq == 1
        base_b, base_e = 0, 0
        per_day[outcomes.day_of(oldest.created)] += oldest.logical_bytes
        if not exact:  # gc removed the older ones: count from the oldest kept
            per_day[outcomes.day_of(oldest.created)] -= oldest.logical_bytes
            base_b, base_e = oldest.logical_bytes, oldest.entries
    return (recs[0].logical_bytes - base_b, recs[0].entries - base_e, dict(per_day), exact)


def _causes(gens: Any, top: list[tuple[int, str, str, str]], latest: dict[str, Any],
            state_dir: Path | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The cause of each of ``top`` (lookups, namespace, family, entry), in its order, and
    what finding them cost."""
    from casfs.cli import misscause
    from casfs.fingerprint import Fingerprint

    t0 = time.monotonic()
    by_ns: dict[str, list[str]] = defaultdict(list)
    for _, ns, fam, entry in top:
        if fam != "unknown":
            by_ns[ns].append(entry)
    found: dict[tuple[str, str], dict[str, Any]] = {}
    indexes: dict[str, Any] = {}
    read = parts = 0
    complete = True
    for ns, entries in by_ns.items():
        fam = next(f for _, n, f, _ in top if n == ns)
        left = CAUSES_BUDGET_S - (time.monotonic() - t0)
        if left <= 0:
            complete = False
            continue
        rec = latest.get(ns)
        mine = {k: v for k, v in ((rec.fingerprint if rec else None) or {}).items()
                if k in families.get(fam).ingredients}
        if fam not in indexes:
            indexes[fam] = misscause.entry_index(gens, fam, state_dir)
        try:
            mc = misscause.causes(gens, Fingerprint(fam, mine), entries,
                                  tenant=split_store_namespace(ns)[0], state_dir=state_dir,
                                  budget_s=left, index=indexes[fam], latest=latest, exclude=ns)
        except (CasfsError, OSError) as e:
            print(f"casfs: warning: {ns}: miss causes: {e}", file=sys.stderr)
            complete = False
            continue
        read += mc.checked
        parts += mc.parts_read
        complete = complete and mc.checked == mc.namespaces and not mc.unreadable
        for h in mc.held:
            for entry in h.entries:
                found[ns, entry] = {
                    "cause": f"exists in {h.describe()}" if mine
                    else f"exists in {h.where.namespace} (no ingredients recorded here)",
                    "exists_in": h.where.namespace,
                    "differs": h.where.as_dict()["differs"] if mine else None,
                    "namespaces_read": mc.checked, "namespaces_of_family": mc.namespaces}
        for entry in mc.nowhere:
            found[ns, entry] = {"cause": f"compiled {mc.nowhere_where()}", "exists_in": None,
                                "differs": None, "namespaces_read": mc.checked,
                                "namespaces_of_family": mc.namespaces}
    unknown = {"cause": "not looked up (the report's time budget, or no known family)",
               "exists_in": None, "differs": None, "namespaces_read": 0,
               "namespaces_of_family": None}
    out = [found.get((ns, entry), unknown) for _, ns, _, entry in top]
    return out, {"namespaces_read": read, "manifest_parts_read": parts,
                 "seconds": round(time.monotonic() - t0, 3), "complete": complete,
                 "budget_s": CAUSES_BUDGET_S}


def build(root: SharedRoot, since: float, now: float,
          state_dir: Path | None = None) -> dict[str, Any]:
    """The report's document; ``state_dir``: where the node caches entry names (None: not
    cached; casfs.index.entrynames)."""
    gens = root.generations()
    latest: dict[str, Any] = {}
    days = _days(since, now)
    by_day: dict[str, _Sum] = {d: _Sum() for d in days}
    by_day_fam: dict[str, dict[str, _Sum]] = {d: defaultdict(_Sum) for d in days}
    by_fam: dict[str, _Sum] = defaultdict(_Sum)
    by_node: dict[str, _Sum] = defaultdict(_Sum)
    total = _Sum()
    ns_rows: list[dict[str, Any]] = []
    missed: list[tuple[int, str, str, str]] = []
    growth_days: dict[str, int] = defaultdict(int)
    grown_b = grown_e = 0
    exact = True
    for ns in gens.namespaces():
        try:
            got = outcomes.read(root.backend, ns, since)
            rec = gens.latest(ns)
            g_b, g_e, g_days, g_exact = _growth(gens, ns, since)
        except PermissionError:
            continue  # another tenant's namespace (0700)
        except (CasfsError, OSError) as e:
            print(f"casfs: warning: {ns}: {e}", file=sys.stderr)
            continue
        fam = _family_of(ns, got.family)
        latest[ns] = rec
        s = _Sum()
        for r in got.rows:
            s.add(r)
            total.add(r)
            by_fam[fam].add(r)
            by_node[r.node].add(r)
            if r.day in by_day:
                by_day[r.day].add(r)
                by_day_fam[r.day][fam].add(r)
        for entry, n in got.missed.most_common(MOST_MISSED):
            missed.append((n, ns, fam, entry))
        grown_b += g_b
        grown_e += g_e
        exact = exact and g_exact
        for d, b in g_days.items():
            growth_days[d] += b
        ns_rows.append({"namespace": ns, "family": fam, **s.json(),
                        "entries": rec.entries if rec else 0,
                        "bytes": rec.logical_bytes if rec else 0,
                        "latest": rec.seq if rec else None,
                        "read": s.hits > 0 or _read_in_window(root, ns, since),
                        "bytes_added": g_b})
    usage = maintenance.usage(root).to_json()
    missed.sort(key=lambda m: (-m[0], m[1], m[3]))
    top = missed[:MOST_MISSED]
    why, cost = _causes(gens, top, latest, state_dir)
    return {
        "casfs_report": FORMAT, "root": str(root.location), "generated": round(now, 3),
        "since": round(since, 3),
        "window_days": round((now - since) / 86400, 3),
        "totals": total.json(),
        "families": [{"family": f, **s.json()} for f, s in sorted(by_fam.items())],
        "days": [{"day": d, **by_day[d].json(),
                  "families": {f: s.json() for f, s in sorted(by_day_fam[d].items())}}
                 for d in days],
        "namespaces": sorted(ns_rows, key=lambda r: (-r["saved_s"], r["namespace"])),
        "nodes": sorted(({"node": n, **s.json()} for n, s in by_node.items()),
                        key=lambda r: (-r["saved_s"], r["node"])),
        "store": usage,
        "growth": {"bytes": grown_b, "entries": grown_e, "exact": exact,
                   "days": [{"day": d, "bytes": growth_days.get(d, 0)} for d in days]},
        "most_missed": [{"namespace": ns, "family": fam, "entry": e, "lookups": n, **c}
                        for (n, ns, fam, e), c in zip(top, why, strict=True)],
        "miss_causes": cost,
        "unread_namespaces": sorted(r["namespace"] for r in ns_rows if not r["read"]),
    }


# --- output ---------------------------------------------------------------------------
def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def print_text(doc: dict[str, Any]) -> None:
    from casfs.cli.output import human_bytes, table

    t = doc["totals"]
    print(f"casfs report: {doc['window_days']:g} days to "
          f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(doc['generated']))} UTC")
    print(f"compile time saved {t['saved_s']:.1f} s (an estimate), {t['hits']} entries hit,"
          f" {t['misses']} missed, hit ratio {_pct(t['hit_ratio'])}")
    st = doc["store"]
    print(f"store: {st['files']} files, logical {human_bytes(st['logical_bytes'])}, unique"
          f" {human_bytes(st['unique_bytes'])}, stored {human_bytes(st['stored_bytes'])};"
          f" dedup x{st['dedup_ratio']}; grew {human_bytes(doc['growth']['bytes'])}"
          f" ({doc['growth']['entries']} entries) in the window")
    print()
    table([[f["family"], f["hits"], f["misses"], _pct(f["hit_ratio"]), f"{f['saved_s']:.1f}"]
           for f in doc["families"]], ["FAMILY", "HITS", "MISSES", "HIT RATIO", "SAVED S"])
    print()
    table([[d["day"], d["hits"], d["misses"], _pct(d["hit_ratio"]), f"{d['saved_s']:.1f}"]
           for d in doc["days"]], ["DAY", "HITS", "MISSES", "HIT RATIO", "SAVED S"])
    print()
    table([[n["namespace"], n["family"], n["hits"], n["misses"], _pct(n["hit_ratio"]),
            f"{n['saved_s']:.1f}", n["entries"], human_bytes(n["bytes"])]
           for n in doc["namespaces"]],
          ["NAMESPACE", "FAMILY", "HITS", "MISSES", "HIT RATIO", "SAVED S", "FILES", "SIZE"])
    print()
    table([[n["node"], n["hits"], n["misses"], _pct(n["hit_ratio"]), f"{n['saved_s']:.1f}"]
           for n in doc["nodes"]], ["NODE", "HITS", "MISSES", "HIT RATIO", "SAVED S"])
    if doc["most_missed"]:
        print()
        table([[m["lookups"], m["namespace"], m["entry"], m["cause"]]
               for m in doc["most_missed"]],
              ["LOOKUPS", "NAMESPACE", "MOST-MISSED ENTRY", "CAUSE"])
        if not doc["miss_causes"]["complete"]:
            print(f"(causes: not every namespace was read within"
                  f" {doc['miss_causes']['budget_s']:g} s)")
    if doc["unread_namespaces"]:
        print()
        print("nobody read: " + ", ".join(doc["unread_namespaces"]))


def html_page(doc: dict[str, Any]) -> str:
    data = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    # Nothing in the data may end the script element (or open a comment in it).
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    from casfs.cli.report_page import PAGE

    return PAGE.replace("/*CASFS_REPORT_JSON*/{}", data, 1)


def cmd_report(args: argparse.Namespace) -> int:
    from casfs.cli.output import emit_json
    from casfs.cli.store_cmds import open_root

    now = time.time()
    since = now - parse_since(args.since)
    from casfs.util.defaults import default_state_dir

    doc = build(open_root(), since, now, state_dir=default_state_dir().absolute())
    if args.html:
        from casfs.util.atomic import write_atomic

        write_atomic(Path(args.html), html_page(doc).encode())
    if args.json:
        emit_json(doc)
    elif not args.html:
        print_text(doc)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    h = "the cluster in one page: compile time saved, hit ratios, store size, misses"
    p = sub.add_parser("report", help=h, description=h)
    p.set_defaults(func=cmd_report)
    p.add_argument("--since", default="7d", help="the window: 7d (default), 12h, 30m")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--html", metavar="FILE", help="write one self-contained HTML page")

