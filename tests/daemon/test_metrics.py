"""casfsd's metrics exporter (casfs.daemon.metrics) on replies made up here: what the
node's mount process serves to jobs is exported per family and tenant, the totals
never go down when a namespace is released or its worker restarts, label values
are capped, and the latency histograms are well-formed Prometheus histograms."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from casfs.daemon.config import MetricsOptions
from casfs.daemon.metrics import FamilyTotals, MountCollector, Source
from casfs.util.counters import Counters
from casfs.util.histogram import LATENCY_BUCKETS, Histogram, cumulative, merge


def test_histogram_buckets_are_prometheus_le() -> None:
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 1.0, 3.0):
        h.observe(v)
    assert h.counts == [2, 2, 1] and h.count == 5  # a value equal to a bound is <= it
    assert cumulative(h.to_dict()) == [("0.1", 2), ("1.0", 4), ("+Inf", 5)]
    assert h.to_dict()["sum"] == pytest.approx(4.65)
    both = merge(h.to_dict(), h.to_dict())
    assert both is not None and both["counts"] == [4, 4, 2]
    other = Histogram((0.5,)).to_dict()
    assert merge(both, other) == both  # other bounds: not added
    assert merge(both, {"le": [0.1], "counts": [1]}) == both  # malformed: not added
    with pytest.raises(ValueError):
        Histogram((1.0, 0.1))


def test_counters_carry_histograms() -> None:
    c = Counters()
    c.observe("fetch_seconds", 0.003)
    c.observe("fetch_seconds", 20.0)
    h = c.histograms()["fetch_seconds"]
    assert h["le"] == list(LATENCY_BUCKETS) and sum(h["counts"]) == 2
    assert c.snapshot() == {}  # histograms are not counters (casfs stats stays short)


def src(name: str, pid: int, started: float, lookups: int, *, tenant: str = "u1000",
        family: str = "triton", fetch: int = 0) -> Source:
    h = Histogram()
    for _ in range(fetch):
        h.observe(0.02)
    return Source(key=("host", "host", f"{tenant}/{name}"), family=family, tenant=tenant,
                  namespace=name, pid=pid, started=started,
                  counters={"lookup_lower": lookups}, hists={"fetch_seconds": h.to_dict()})


def test_totals_survive_release_restart_and_reattach() -> None:
    t = FamilyTotals(MetricsOptions())
    g = ("triton", "u1000")
    assert t.update([src("ns1", 10, 100.0, 5, fetch=1)])[g].counters == {"lookup_lower": 5}
    # the same instance, later (its start time computed again: jitter is no new instance)
    assert t.update([src("ns1", 10, 100.4, 7, fetch=2)])[g].counters["lookup_lower"] == 7
    # released: gone from the reply, its figures stay
    out = t.update([])
    assert out[g].counters["lookup_lower"] == 7 and out[g].namespaces == 0
    # served again: a new instance counting from 0
    out = t.update([src("ns1", 10, 500.0, 2, fetch=1)])
    assert out[g].counters["lookup_lower"] == 9 and out[g].namespaces == 1
    assert sum(out[g].hists["fetch_seconds"]["counts"]) == 3
    # the host restarted (another pid) and restored it: counted from 0 again
    out = t.update([src("ns1", 11, 500.0, 1)])
    assert out[g].counters["lookup_lower"] == 10
    # a counter that went down with the same pid and start: a new instance too
    out = t.update([src("ns1", 11, 500.0, 0)])
    assert out[g].counters["lookup_lower"] == 10
    assert t.update([src("ns1", 11, 500.0, 3)])[g].counters["lookup_lower"] == 13


def test_tenant_label_cap_and_options() -> None:
    t = FamilyTotals(MetricsOptions(max_label_values=2))
    out = t.update([src(f"ns{i}", 1, 0.0, 1, tenant=f"t{i}") for i in range(4)])
    assert sorted(out) == [("triton", "_other"), ("triton", "t0"), ("triton", "t1")]
    assert out[("triton", "_other")].counters["lookup_lower"] == 2
    assert out[("triton", "_other")].namespaces == 2
    # sticky: a capped tenant stays _other, a kept one stays itself
    out = t.update([src("ns3", 1, 0.0, 5, tenant="t3"), src("ns0", 1, 0.0, 1, tenant="t0")])
    assert out[("triton", "_other")].counters["lookup_lower"] == 6

    flat = FamilyTotals(MetricsOptions(tenant_label=False))
    assert flat.label_names == ["family"]
    out = flat.update([src("a", 1, 0.0, 1, tenant="t0"), src("b", 1, 0.0, 2, tenant="t1")])
    assert out == {("triton",): out[("triton",)]}
    assert out[("triton",)].counters["lookup_lower"] == 3

    ns = FamilyTotals(MetricsOptions(namespace_label=True, max_label_values=1))
    out = ns.update([src("a", 1, 0.0, 1), src("b", 1, 0.0, 1)])
    assert sorted(out) == [("triton", "u1000", "_other"), ("triton", "u1000", "a")]


def _status(counters: dict[str, int], *, pid: int, family: str = "triton",
            name: str = "kern", namespace: str = "kern-test", fetch: float | None = None,
            ) -> dict[str, Any]:
    c = Counters()
    if fetch is not None:
        c.observe("fetch_seconds", fetch)
    return {"ok": True, "name": name, "family": family, "namespace": namespace, "pid": pid,
            "uptime": 5.0, "counters": counters, "histograms": c.histograms(),
            "served_seq": 3, "pending_promotion": 1, "pending_publication": 2,
            "root_available": True, "last_publish": {"ok": True, "time": 1000.0}}


class FakeSupervisor:
    def __init__(self, opts: MetricsOptions | None = None) -> None:
        self.cfg = SimpleNamespace(metrics=opts or MetricsOptions())
        self.static = SimpleNamespace(cfg=SimpleNamespace(
            name="kern", namespace="kern-test", family="generic", tenant=""), restarts=1)
        self.host = SimpleNamespace(cfg=SimpleNamespace(
            name="host", namespace="*", family="*", tenant=""), restarts=0)
        self.slots = [self.static, self.host]
        self.replies: dict[str, dict[str, Any] | None] = {}

    def query(self, slot: Any, cmd: str = "status") -> dict[str, Any] | None:
        assert cmd == "stats"
        return self.replies.get(slot.cfg.name)


def scrape(sup: FakeSupervisor, collector: MountCollector | None = None,
           ) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector or MountCollector(sup))  # type: ignore[arg-type]
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_jobs_namespaces_exported_per_family_and_tenant() -> None:
    sup = FakeSupervisor()
    sup.replies["kern"] = _status({"lookup_lower": 4, "lookup_miss": 1}, pid=7,
                                  family="generic")
    sup.replies["host"] = {"ok": True, "host": True, "namespaces": [
        _status({"lookup_lower": 3, "lookup_miss": 1}, pid=9, name="u1000/triton-ab",
                namespace="u1000~triton-ab", fetch=0.004),
        _status({"lookup_lower": 2}, pid=9, name="u1001/triton-cd",
                namespace="u1001~triton-cd", fetch=0.2),
        _status({"lookup_miss": 5}, pid=9, family="inductor", name="u1000/inductor-ef",
                namespace="u1000~inductor-ef"),
    ]}
    collector = MountCollector(sup)  # type: ignore[arg-type]
    m = scrape(sup, collector)

    def fam(name: str, family: str, tenant: str) -> float:
        return m[(name, (("family", family), ("tenant", tenant)))]

    assert fam("casfs_family_lookup_lower_total", "triton", "u1000") == 3
    assert fam("casfs_family_lookup_lower_total", "triton", "u1001") == 2
    assert fam("casfs_family_lookup_lower_total", "inductor", "u1000") == 0  # zero, present
    assert fam("casfs_family_lookup_miss_total", "inductor", "u1000") == 5
    assert fam("casfs_family_lookup_lower_total", "generic", "_none") == 4
    assert fam("casfs_compile_seconds_saved_total", "triton", "u1000") == 0
    assert fam("casfs_namespaces_served", "triton", "u1000") == 1
    assert fam("casfs_pending_publication", "triton", "u1000") == 2
    assert fam("casfs_last_publication_timestamp_seconds", "triton", "u1001") == 1000.0
    assert fam("casfs_fetch_seconds_count", "triton", "u1000") == 1
    assert fam("casfs_fetch_seconds_count", "inductor", "u1000") == 0  # empty, present
    assert m[("casfs_fetch_seconds_bucket",
              (("family", "triton"), ("le", "0.005"), ("tenant", "u1000")))] == 1
    assert m[("casfs_fetch_seconds_bucket",
              (("family", "triton"), ("le", "0.1"), ("tenant", "u1001")))] == 0
    assert m[("casfs_fetch_seconds_bucket",
              (("family", "triton"), ("le", "+Inf"), ("tenant", "u1001")))] == 1
    assert fam("casfs_publish_seconds_count", "triton", "u1000") == 0
    # no namespace hash in a label unless asked
    assert not any("namespace" in dict(labels) and name.startswith(("casfs_family_",
                                                                    "casfs_fetch"))
                   for name, labels in m)
    # the per-mount series of before, and the host as one more mount, health only
    assert m[("casfs_lookup_lower_total", (("mount", "kern"), ("namespace", "kern-test")))] == 4
    assert m[("casfs_mount_up", (("mount", "host"), ("namespace", "*")))] == 1
    assert m[("casfs_mount_root_available", (("mount", "host"), ("namespace", "*")))] == 1
    assert m[("casfs_mount_pending_publication", (("mount", "host"), ("namespace", "*")))] == 6
    assert m[("casfs_mount_worker_restarts_total",
              (("mount", "kern"), ("namespace", "kern-test")))] == 1
    assert ("casfs_mount_served_generation", (("mount", "host"), ("namespace", "*"))) not in m

    # the triton namespace of u1001 is released, the host restarts: totals stay
    sup.replies["host"] = None
    m = scrape(sup, collector)
    assert m[("casfs_mount_up", (("mount", "host"), ("namespace", "*")))] == 0
    assert fam("casfs_family_lookup_lower_total", "triton", "u1001") == 2
    sup.replies["host"] = {"ok": True, "host": True, "namespaces": [
        _status({"lookup_lower": 1}, pid=10, name="u1000/triton-ab",
                namespace="u1000~triton-ab")]}
    m = scrape(sup, collector)
    assert fam("casfs_family_lookup_lower_total", "triton", "u1000") == 4
    assert fam("casfs_family_lookup_lower_total", "triton", "u1001") == 2
    assert fam("casfs_namespaces_served", "triton", "u1001") == 0
    assert fam("casfs_fetch_seconds_count", "triton", "u1000") == 1
    # nothing served any more: the host's last publication is still told, its root is not
    sup.replies["host"] = {"ok": True, "host": True, "namespaces": []}
    m = scrape(sup, collector)
    assert m[("casfs_mount_last_publication_ok", (("mount", "host"), ("namespace", "*")))] == 1
    assert ("casfs_mount_root_available", (("mount", "host"), ("namespace", "*"))) not in m
    assert fam("casfs_family_lookup_lower_total", "triton", "u1000") == 4


def test_metrics_options_from_the_config_file(tmp_path: Path) -> None:
    from casfs.daemon import config as dconfig
    from casfs.errors import ConfigError

    base = f'[store]\nroot = "{tmp_path}/root"\n[node]\nstate_dir = "{tmp_path}/state"\n'
    p = tmp_path / "casfs.toml"
    p.write_text(base)
    assert dconfig.load(p).metrics == MetricsOptions(True, False, 100)
    p.write_text(base + '[metrics]\nlisten = ":9464"\ntenant_label = false\n'
                 "namespace_label = true\nmax_label_values = 5\n")
    cfg = dconfig.load(p)
    assert cfg.metrics == MetricsOptions(tenant_label=False, namespace_label=True,
                                         max_label_values=5)
    assert MountCollector(SimpleNamespace(cfg=cfg)).totals.label_names == [  # type: ignore[arg-type]
        "family", "namespace"]
    for bad, key in (("max_label_values = 0", "metrics.max_label_values"),
                     ('tenant_label = "yes"', "metrics.tenant_label"),
                     ("labels = 3", "metrics.labels")):
        p.write_text(base + f"[metrics]\n{bad}\n")
        with pytest.raises(ConfigError, match=key):
            dconfig.load(p)
