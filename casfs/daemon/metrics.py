"""Optional Prometheus endpoint (``[metrics] listen``), localhost only by default.

Nothing is sampled in the background: each scrape asks every running mount's
control socket for its ``stats`` (a few milliseconds each), the node's mount
process included, which answers for every namespace it serves to jobs
(``casfs env``, ``casfs run``). Two kinds of series come out:

- per configured mount (labels ``mount``, ``namespace``): its health gauges
  and its counters as ``casfs_<counter>_total``, the worker's since it
  started (a worker restart is a counter reset). The node's mount process is
  one more "mount" here (``namespace="*"``), with health gauges only.
- per family (labels ``family``, ``tenant``; ``namespace`` only when an
  operator sets ``[metrics] namespace_label``): every namespace of this node
  summed, configured mounts and jobs' namespaces alike:
  ``casfs_family_<counter>_total``, the latency histograms
  ``casfs_fetch_seconds`` and ``casfs_publish_seconds``,
  ``casfs_compile_seconds_saved_total`` and a few gauges. These never go down
  while casfsd runs: what a namespace counted stays counted after it is
  released, its worker restarts or it is served again (``FamilyTotals``).

Label values are bounded: at most ``max_label_values`` tenants (and
namespaces) get a value of their own, first come first served for the life
of casfsd; later ones are counted under ``_other``. A mount without tenants
is ``tenant="_none"`` (no tenant name starts with ``_``).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import CollectorRegistry

from casfs.daemon.config import MetricsOptions
from casfs.daemon.supervisor import Supervisor
from casfs.errors import ConfigError
from casfs.util import histogram

log = logging.getLogger(__name__)

_BAD = re.compile(r"[^a-zA-Z0-9_]")

OTHER = "_other"  # label value of what is past max_label_values
NO_TENANT = "_none"  # a configured mount without tenants
HISTOGRAMS = {
    "fetch_seconds": "how long a job's open waited for a lower object from the shared root"
                     " (cold opens only; warm ones are local)",
    "publish_seconds": "how long a publication that wrote a generation (or failed) took",
}
# Written by the per-entry compile-time step (issue 24) as integer milliseconds;
# until then no mount counts it and the counter stays 0.
COMPILE_MS_SAVED = "compile_ms_saved"
# Exported for every group even before any namespace counts one: the dashboard's
# queries (deploy/grafana/casfs.json) return 0, not "no data", on a quiet node.
ALWAYS = ("lookup_lower", "lookup_miss", "lookup_upper", "open_lower", "objects_fetched",
          "bytes_fetched", "fetch_timeouts", "fetch_errors", "rejections", "promoted_files",
          "generations_published", "files_published", "promote_errors", "publish_errors",
          "refresh_errors")
SAME_START_S = 2.0  # two replies whose start times differ by more: two mount instances

Group = tuple[str, ...]  # label values, in FamilyTotals.label_names order


@dataclass
class Source:
    """One namespace's reply at one scrape."""

    key: tuple[str, ...]  # stable across scrapes: (slot, namespace name)
    family: str
    tenant: str
    namespace: str
    pid: int
    started: float  # wall-clock start of the mount instance (now - uptime)
    counters: dict[str, int]
    hists: dict[str, Any]
    pending_publication: int = 0
    pending_promotion: int = 0
    root_available: bool = True
    last_publish: float | None = None


@dataclass
class _Seen:
    pid: int
    started: float
    group: Group
    counters: dict[str, int]
    hists: dict[str, Any]


@dataclass
class Totals:
    """What one label group counted, plus its live gauges at this scrape."""

    counters: dict[str, int] = field(default_factory=dict)
    hists: dict[str, dict[str, Any]] = field(default_factory=dict)
    namespaces: int = 0
    pending_publication: int = 0
    pending_promotion: int = 0
    root_unavailable: int = 0
    last_publish: float | None = None


def _add(into: dict[str, int], more: dict[str, int]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v


def _add_hists(into: dict[str, dict[str, Any]], more: dict[str, Any]) -> None:
    for k, h in more.items():
        merged = histogram.merge(into.get(k), h)
        if merged is not None:
            into[k] = merged


def _went_down(old: _Seen, new: Source) -> bool:
    if any(new.counters.get(k, 0) < v for k, v in old.counters.items()):
        return True
    for k, h in old.hists.items():
        a, b = histogram.parse(h), histogram.parse(new.hists.get(k))
        if a is not None and (b is None or sum(b[1]) < sum(a[1])):
            return True
    return False


class FamilyTotals:
    """Counters per label group that only grow while casfsd runs.

    A namespace's counters live in its mount process and start at 0 with each
    mount instance: a namespace released and served again, a worker restarted.
    The last figures seen of each instance are kept; when an instance is
    replaced (another pid, another start time, or a counter that went down) its
    last figures move to the group's retired totals. A namespace that vanishes
    between two scrapes keeps its last figures (what it counted after the last
    scrape, such as a final publication at its release, is not seen).
    """

    def __init__(self, opts: MetricsOptions) -> None:
        self.opts = opts
        self.label_names = ["family", *(["tenant"] if opts.tenant_label else []),
                            *(["namespace"] if opts.namespace_label else [])]
        self._values: dict[str, set[str]] = {"tenant": set(), "namespace": set()}
        self._seen: dict[tuple[str, ...], _Seen] = {}
        self._retired: dict[Group, Totals] = {}
        self._last_publish: dict[Group, float] = {}
        self._lock = threading.Lock()

    def _capped(self, kind: str, value: str) -> str:
        values = self._values[kind]
        if value in values:
            return value
        if len(values) < self.opts.max_label_values:
            values.add(value)
            return value
        return OTHER

    def group(self, src: Source) -> Group:
        g = [src.family]
        if self.opts.tenant_label:
            g.append(self._capped("tenant", src.tenant or NO_TENANT))
        if self.opts.namespace_label:
            g.append(self._capped("namespace", src.namespace))
        return tuple(g)

    def update(self, sources: Iterable[Source]) -> dict[Group, Totals]:
        """Take one scrape's replies; the totals of every group ever seen."""
        with self._lock:
            live: dict[Group, Totals] = {}
            for src in sources:
                old = self._seen.get(src.key)
                group = old.group if old is not None else self.group(src)
                if old is not None and (old.pid != src.pid
                                        or abs(old.started - src.started) > SAME_START_S
                                        or _went_down(old, src)):
                    gone = self._retired.setdefault(old.group, Totals())
                    _add(gone.counters, old.counters)
                    _add_hists(gone.hists, old.hists)
                self._seen[src.key] = _Seen(src.pid, src.started, group, dict(src.counters),
                                            dict(src.hists))
                t = live.setdefault(group, Totals())
                t.namespaces += 1
                t.pending_publication += src.pending_publication
                t.pending_promotion += src.pending_promotion
                t.root_unavailable += 0 if src.root_available else 1
                if src.last_publish is not None:
                    self._last_publish[group] = max(self._last_publish.get(group, 0.0),
                                                    src.last_publish)
            out: dict[Group, Totals] = {}
            for g, r in self._retired.items():
                t = out.setdefault(g, Totals())
                _add(t.counters, r.counters)
                _add_hists(t.hists, r.hists)
            for seen in self._seen.values():
                t = out.setdefault(seen.group, Totals())
                _add(t.counters, seen.counters)
                _add_hists(t.hists, seen.hists)
            for g, t in out.items():
                lt = live.get(g)
                if lt is not None:
                    t.namespaces, t.root_unavailable = lt.namespaces, lt.root_unavailable
                    t.pending_publication = lt.pending_publication
                    t.pending_promotion = lt.pending_promotion
                t.last_publish = self._last_publish.get(g)
            return out


def _int_counters(raw: object) -> dict[str, int]:
    if not isinstance(raw, dict):
        return {}
    return {str(k): int(v) for k, v in raw.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


def _source(key: tuple[str, ...], st: dict[str, Any], family: str, tenant: str,
            namespace: str, now: float) -> Source:
    last = st.get("last_publish") or {}
    hists = st.get("histograms")
    return Source(
        key=key, family=family, tenant=tenant, namespace=namespace,
        pid=int(st.get("pid") or 0), started=now - float(st.get("uptime") or 0.0),
        counters=_int_counters(st.get("counters")),
        hists=hists if isinstance(hists, dict) else {},
        pending_publication=int(st.get("pending_publication") or 0),
        pending_promotion=int(st.get("pending_promotion") or 0),
        root_available=bool(st.get("root_available")),
        last_publish=float(last["time"]) if last.get("time") else None,
    )


def host_sources(slot_name: str, st: dict[str, Any], now: float) -> list[Source]:
    """The namespaces the node's mount process serves (its ``stats`` reply)."""
    out = []
    for ns in st.get("namespaces") or []:
        name = str(ns.get("name") or "")
        tenant = name.split("/", 1)[0] if "/" in name else ""  # "<tenant>/<namespace>"
        out.append(_source(("host", slot_name, name), ns, str(ns.get("family") or "unknown"),
                           tenant, str(ns.get("namespace") or ""), now))
    return out


class MountCollector:
    def __init__(self, sup: Supervisor, opts: MetricsOptions | None = None) -> None:
        self.sup = sup
        self.totals = FamilyTotals(opts or getattr(sup.cfg, "metrics", None)
                                   or MetricsOptions())
        # The node's mount process: its newest publication, kept once the namespace
        # that made it is released (a quiet node still says how its last one went).
        self._host_last: dict[str, dict[str, Any]] = {}

    def collect(self) -> Iterator[Metric]:
        labels = ["mount", "namespace"]
        up = GaugeMetricFamily("casfs_mount_up", "1 while the mount's worker serves", labels=labels)
        restarts = CounterMetricFamily("casfs_mount_worker_restarts",
                                       "worker processes restarted after dying", labels=labels)
        served = GaugeMetricFamily("casfs_mount_served_generation",
                                   "generation the mount serves", labels=labels)
        pend_prom = GaugeMetricFamily("casfs_mount_pending_promotion",
                                      "upper files not yet promoted", labels=labels)
        pend_pub = GaugeMetricFamily("casfs_mount_pending_publication",
                                     "promoted files not yet published", labels=labels)
        last_ts = GaugeMetricFamily("casfs_mount_last_publication_timestamp_seconds",
                                    "time of the last publication attempt", labels=labels)
        last_ok = GaugeMetricFamily("casfs_mount_last_publication_ok",
                                    "1 if the last publication attempt succeeded", labels=labels)
        root_ok = GaugeMetricFamily("casfs_mount_root_available",
                                    "1 if the shared root is reachable", labels=labels)
        counters: dict[str, CounterMetricFamily] = {}
        sources: list[Source] = []
        now = time.time()
        for slot in self.sup.slots:
            lv = [slot.cfg.name, slot.cfg.namespace]
            st: dict[str, Any] | None = self.sup.query(slot, "stats")
            up.add_metric(lv, 1 if st else 0)
            restarts.add_metric(lv, slot.restarts)
            if not st:
                continue
            if st.get("host"):  # the node's mount process: one reply per namespace
                mine = host_sources(slot.cfg.name, st, now)
                sources += mine
                pend_prom.add_metric(lv, sum(s.pending_promotion for s in mine))
                pend_pub.add_metric(lv, sum(s.pending_publication for s in mine))
                if mine:
                    root_ok.add_metric(lv, 1 if all(s.root_available for s in mine) else 0)
                lasts = [n.get("last_publish") for n in st.get("namespaces") or []]
                lasts.append(self._host_last.get(slot.cfg.name))
                newest = max((p for p in lasts if isinstance(p, dict) and p.get("time")),
                             key=lambda p: float(p["time"]), default=None)
                if newest:
                    self._host_last[slot.cfg.name] = newest
                    last_ts.add_metric(lv, float(newest["time"]))
                    last_ok.add_metric(lv, 1 if newest.get("ok") else 0)
                continue
            sources.append(_source(("mount", slot.cfg.name), st, slot.cfg.family,
                                   getattr(slot.cfg, "tenant", "") or "",
                                   slot.cfg.namespace, now))
            served.add_metric(lv, st.get("served_seq") or 0)
            pend_prom.add_metric(lv, st.get("pending_promotion") or 0)
            pend_pub.add_metric(lv, st.get("pending_publication") or 0)
            root_ok.add_metric(lv, 1 if st.get("root_available") else 0)
            last = st.get("last_publish") or {}
            if last:
                last_ts.add_metric(lv, float(last.get("time") or 0))
                last_ok.add_metric(lv, 1 if last.get("ok") else 0)
            for name, value in sorted((st.get("counters") or {}).items()):
                metric = "casfs_" + _BAD.sub("_", name)
                if metric not in counters:
                    counters[metric] = CounterMetricFamily(
                        metric, f"mount counter {name}", labels=labels)
                counters[metric].add_metric(lv, value)
        yield from (up, restarts, served, pend_prom, pend_pub, last_ts, last_ok, root_ok)
        yield from counters.values()
        yield from family_metrics(self.totals.label_names, self.totals.update(sources))


def family_metrics(label_names: list[str], groups: dict[Group, Totals]) -> Iterator[Metric]:
    """The per-family series of ``FamilyTotals.update``'s groups."""
    names = sorted({k for t in groups.values() for k in t.counters}
                   | (set(ALWAYS) if groups else set()))
    for name in names:
        fam = CounterMetricFamily(
            "casfs_family_" + _BAD.sub("_", name),
            f"mount counter {name}, summed over the namespaces of a family", labels=label_names)
        for g, t in sorted(groups.items()):
            fam.add_metric(list(g), t.counters.get(name, 0))
        yield fam
    saved = CounterMetricFamily(
        "casfs_compile_seconds_saved", "seconds of compilation jobs were spared by cache"
        " hits (an estimate; 0 until per-entry compile times are recorded)", labels=label_names)
    for g, t in sorted(groups.items()):
        saved.add_metric(list(g), t.counters.get(COMPILE_MS_SAVED, 0) / 1000.0)
    yield saved
    empty = histogram.Histogram().to_dict()
    for name, doc in HISTOGRAMS.items():
        hfam = HistogramMetricFamily("casfs_" + name, doc, labels=label_names)
        for g, t in sorted(groups.items()):
            h = t.hists.get(name) or empty
            hfam.add_metric(list(g), histogram.cumulative(h), sum_value=float(h.get("sum", 0)))
        yield hfam
    gauges = (
        ("casfs_namespaces_served", "namespaces served on this node now",
         lambda t: t.namespaces),
        ("casfs_pending_publication", "promoted files not yet published",
         lambda t: t.pending_publication),
        ("casfs_pending_promotion", "upper files not yet promoted",
         lambda t: t.pending_promotion),
        ("casfs_namespaces_root_unavailable", "namespaces served that cannot reach the"
         " shared root", lambda t: t.root_unavailable),
    )
    for metric, doc, value in gauges:
        gfam = GaugeMetricFamily(metric, doc, labels=label_names)
        for g, t in sorted(groups.items()):
            gfam.add_metric(list(g), value(t))
        yield gfam
    last = GaugeMetricFamily("casfs_last_publication_timestamp_seconds",
                             "time of the newest publication attempt of the family's"
                             " namespaces", labels=label_names)
    for g, t in sorted(groups.items()):
        if t.last_publish is not None:
            last.add_metric(list(g), t.last_publish)
    yield last


def serve_metrics(sup: Supervisor, listen: tuple[str, int]) -> Any:
    """Start the HTTP endpoint in a thread; returns the server (``shutdown()`` to stop)."""
    host, port = listen
    try:
        if not ipaddress.ip_address(host).is_loopback:
            log.warning("metrics endpoint listens on %s, beyond this node", host)
    except ValueError:
        pass
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MountCollector(sup))
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise ConfigError(f"metrics.listen: cannot listen on {host}:{port}: {e.strerror or e}"
                          ) from None
    log.info("metrics at http://%s:%d/metrics", host, port)
    return server
