"""A cluster-wide cold start on paper (issue 23): N fresh nodes against one S3 root.

Usage::

    python -m bench.fleet_model [--fleet fleet.json --row 4] [--nodes 1000,10000]
        [--spread 1,10,60] [--gbit 10,100] [--rtt-ms 20]

Scales one fresh node's requests, by key, to N nodes starting the same job on
the same published namespace within a spread of ``--spread`` seconds, and
checks them against S3's documented request rates per partitioned prefix
(5,500 GET/HEAD and 3,500 PUT/COPY/POST/DELETE per second) at three
granularities: the whole root as one prefix (before S3 has partitioned
anything), one prefix per directory of the root (``packs/``,
``namespaces/<ns>/generations/``, ...), and one per key (the finest S3 can
split: one key's requests all go to one partition). Prints JSON; docs/fleet.md,
"A thousand and ten thousand nodes, on paper", explains each figure.

``PLAN`` is one fresh node's requests by key, as measured at the proxy
(tests/netem.py, ``record=True``) for a node reading the 600-kernel tree of
bench/network.py (4,800 files, 77 MB) at fe8563a; the per-kind counts are the
same as bench/fleet.py's N = 4 nodes at e382406 (8 GET, 11 range GET, 3 HEAD,
1 LIST, 2 PUT). ``--fleet`` takes the bytes per node and the pack reads per
node from a bench/fleet.py ``--json`` row instead.

Arrival model: a node's set-up requests all leave within about a second of
its start (0.5 s on loopback, ~0.3 s of serial round trips at 20 ms RTT), so
N nodes starting uniformly over ``spread`` seconds send N x (per-node count)
/ max(spread, 1 s) requests a second to each key. S3's limits are per second:
a burst shorter than a second is counted over that second.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

GET_LIMIT = 5500  # GET/HEAD per second per partitioned prefix (LIST counted with them)
PUT_LIMIT = 3500  # PUT/COPY/POST/DELETE per second per partitioned prefix
READ_KINDS = ("get", "range_get", "head", "list")
KINDS = (*READ_KINDS, "put")
MIN_WINDOW_S = 1.0
# Serial round trips before the job reads (docs/performance.md, "Across a network":
# ~10 requests one after another, 13 RTTs with TCP handshakes, measured at 20 ms).
SERIAL_RTTS = 13
TLS_RTTS = 3  # one more per connection of that chain on HTTPS with TLS 1.3 (not measured)

# One fresh node, in the order sent. ``keys``: how many distinct keys the row's
# requests spread over, every node the same ones (0: a new key per node).
PLAN: list[dict[str, Any]] = [
    {"key": "casfs.json", "dir": "casfs.json", "get": 3, "keys": 1,
     "why": "root marker: the mount's open, the fetch worker's open, the release's open"},
    {"key": "namespaces/<ns>/generations/ (LIST)", "dir": "namespaces/<ns>/generations/",
     "list": 1, "keys": 1, "why": "newest seq: no hint on a fresh node"},
    {"key": "namespaces/<ns>/generations/<seq+1>", "dir": "namespaces/<ns>/generations/",
     "head": 2, "keys": 1, "why": "probe past the newest (404), twice"},
    {"key": "namespaces/<ns>/generations/<seq>", "dir": "namespaces/<ns>/generations/",
     "head": 1, "get": 3, "keys": 1,
     "why": "the record: ingest, the profile's lookup, the compile-seconds loader"},
    {"key": "objects/<2 hex>/<62 hex> (manifest)", "dir": "objects/", "get": 1, "keys": 1,
     "why": "the one manifest part (322 KB)"},
    {"key": "objects/<2 hex>/<62 hex> (profile)", "dir": "objects/", "get": 1, "keys": 1,
     "why": "the access profile (29 KB)"},
    {"key": "packs/<2 hex>/<62 hex>", "dir": "packs/", "range_get": 11, "keys": 11,
     "why": "whole-namespace prefetch: each pack once, all in flight at once"},
    {"key": "namespaces/<ns>/outcomes/<day>-<node>-<8 hex>", "dir": "namespaces/<ns>/outcomes/",
     "put": 1, "keys": 0, "why": "outcome record at release"},
    {"key": "namespaces/<ns>/reads/<time>-<node>-<8 hex>", "dir": "namespaces/<ns>/reads/",
     "put": 1, "keys": 0, "why": "read record at release (~310 KB: 4,800 paths)"},
]
BYTES_DOWN = 9_961_634  # per node, the same trace (bench/fleet.py at e382406: 9,964,993)
BYTES_UP = 316_771  # per node: mostly the read record


def per_node(plan: list[dict[str, Any]]) -> dict[str, int]:
    out = {k: sum(int(r.get(k, 0)) for r in plan) for k in KINDS}
    out["total"] = sum(out[k] for k in KINDS)
    return out


def from_fleet(plan: list[dict[str, Any]], doc: dict[str, Any], row: str
               ) -> tuple[list[dict[str, Any]], int, dict[str, float]]:
    """The plan with the row's pack reads per node; its bytes down per node; its kinds."""
    r = doc["rows"][row]
    n = int(r["nodes"])
    measured = {k: round(v / n, 2) for k, v in r["requests_total"].items()}
    packs = max(1, round(measured.get("range_get", 0)))
    out = [dict(x, range_get=packs, keys=packs) if x["dir"] == "packs/" else dict(x)
           for x in plan]
    return out, int(r["bytes_down_per_node"]), measured


def _rate(count: float, nodes: int, spread: float) -> float:
    return count * nodes / max(spread, MIN_WINDOW_S)


def _hottest(groups: dict[str, dict[str, float]], cls: tuple[str, ...]
             ) -> tuple[str, float]:
    best = ("", 0.0)
    for name, kinds in groups.items():
        n = sum(kinds.get(k, 0.0) for k in cls)
        if n > best[1]:
            best = (name, n)
    return best


def levels(plan: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per-node requests to the hottest prefix at each granularity, by kind.

    ``root``: everything one prefix; ``dir``: one prefix per directory; ``key``: one
    per key (a row over ``keys`` keys gives each 1/keys of its requests; a row with a
    new key per node gives each key one node's requests)."""
    root: dict[str, float] = {}
    dirs: dict[str, dict[str, float]] = {}
    keys: dict[str, dict[str, float]] = {}
    for r in plan:
        for k in KINDS:
            c = float(r.get(k, 0))
            if not c:
                continue
            root[k] = root.get(k, 0.0) + c
            d = dirs.setdefault(r["dir"], {})
            d[k] = d.get(k, 0.0) + c
            per_key = c / r["keys"] if r["keys"] else 0.0  # a new key per node: ~0 per key
            kk = keys.setdefault(r["key"], {})
            kk[k] = kk.get(k, 0.0) + per_key
    return {"root": {"root": root}, "dir": dirs, "key": keys}


def model(plan: list[dict[str, Any]], nodes: list[int], spreads: list[float],
          gbits: list[float], bytes_down: int, bytes_up: int, rtt_ms: float
          ) -> dict[str, Any]:
    pn = per_node(plan)
    lv = levels(plan)
    hot: dict[str, dict[str, Any]] = {}
    for name, groups in lv.items():
        g_name, g = _hottest(groups, READ_KINDS)
        p_name, p = _hottest(groups, ("put",))
        hot[name] = {"get_prefix": g_name, "get_per_node": g,
                     "put_prefix": p_name, "put_per_node": p}
    rows = []
    for n in nodes:
        row: dict[str, Any] = {
            "nodes": n,
            "requests": {k: pn[k] * n for k in (*KINDS, "total")},
            "bytes_down": bytes_down * n, "bytes_up": bytes_up * n,
            "bytes_s": {f"{g:g} Gbit/s": round(bytes_down * n * 8 / (g * 1e9), 2)
                        for g in gbits},
            "spreads": {},
        }
        for s in spreads:
            out: dict[str, Any] = {}
            worst = {}
            for name, h in hot.items():
                g = _rate(float(h["get_per_node"]), n, s)
                p = _rate(float(h["put_per_node"]), n, s)
                x = max(g / GET_LIMIT, p / PUT_LIMIT)
                worst[name] = x
                out[name] = {"get_prefix": h["get_prefix"], "get_per_s": round(g),
                             "put_prefix": h["put_prefix"], "put_per_s": round(p),
                             "over_limit": round(x, 2)}
            out["verdict"] = verdict(worst)
            row["spreads"][f"{s:g} s"] = out
        rows.append(row)
    floor = SERIAL_RTTS * rtt_ms / 1000
    return {"what": "bench.fleet_model: a cluster-wide cold start on paper",
            "limits": {"get_head_per_s_per_prefix": GET_LIMIT,
                       "put_per_s_per_prefix": PUT_LIMIT},
            "per_node": {"requests": pn, "bytes_down": bytes_down, "bytes_up": bytes_up},
            "hottest_per_node": hot, "per_directory_per_node": lv["dir"],
            "latency_floor_s": {"http": round(floor, 3),
                                "https_tls13": round(floor + TLS_RTTS * rtt_ms / 1000, 3),
                                "rtt_ms": rtt_ms, "serial_rtts": SERIAL_RTTS},
            "plan": plan, "rows": rows}


def verdict(worst: dict[str, float]) -> str:
    """Within limits, throttled only until S3 partitions, or throttled even per key."""
    if worst["root"] <= 1:
        return "within limits"
    if worst["dir"] <= 1:
        return f"throttled until S3 partitions the root ({worst['root']:.1f}x); then within"
    if worst["key"] <= 1:
        return (f"throttled until S3 partitions below the directories "
                f"({worst['root']:.1f}x root, {worst['dir']:.1f}x directory); then within")
    return (f"throttled however S3 partitions: {worst['key']:.1f}x on one key "
            f"({worst['root']:.1f}x root, {worst['dir']:.1f}x directory)")


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.fleet_model", description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleet", type=Path, help="a bench/fleet.py --json file")
    ap.add_argument("--row", default="4", help="its row (N) to take per-node figures from")
    ap.add_argument("--nodes", default="1000,10000")
    ap.add_argument("--spread", default="1,10,60", help="seconds over which the nodes start")
    ap.add_argument("--gbit", default="10,100", help="site bandwidth to the object store")
    ap.add_argument("--rtt-ms", type=float, default=20.0)
    args = ap.parse_args(argv)
    plan, down, measured = PLAN, BYTES_DOWN, None
    if args.fleet:
        plan, down, measured = from_fleet(PLAN, json.loads(args.fleet.read_text()), args.row)
    doc = model(plan, [int(x) for x in _floats(args.nodes)], _floats(args.spread),
                _floats(args.gbit), down, BYTES_UP, args.rtt_ms)
    if measured is not None:
        doc["fleet_measured_per_node"] = measured
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
