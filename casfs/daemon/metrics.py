"""Optional Prometheus endpoint (``[metrics] listen``), localhost only by default.

Nothing is sampled in the background: each scrape asks every running mount's
control socket for its status (a few milliseconds each) and turns its
counters into ``casfs_<counter>_total{mount,namespace}``, next to gauges for
the mount's health. A mount that does not answer shows ``casfs_mount_up 0``.
Worker counters restart at 0 when a worker restarts; Prometheus' ``rate()``
handles that as a counter reset.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Iterator
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from casfs.daemon.supervisor import Supervisor
from casfs.errors import ConfigError

log = logging.getLogger(__name__)

_BAD = re.compile(r"[^a-zA-Z0-9_]")


class MountCollector:
    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

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
        for slot in self.sup.slots:
            lv = [slot.cfg.name, slot.cfg.namespace]
            st: dict[str, Any] | None = self.sup.query(slot, "stats")
            up.add_metric(lv, 1 if st else 0)
            restarts.add_metric(lv, slot.restarts)
            if not st:
                continue
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
