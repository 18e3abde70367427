"""bench/fleet_model.py's arithmetic on a known plan (docs/fleet.md, "on paper")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import fleet_model as fm

PLAN = [
    {"key": "marker", "dir": "marker", "get": 2, "keys": 1},
    {"key": "ns/gen/1", "dir": "ns/gen/", "get": 2, "head": 1, "keys": 1},
    {"key": "packs/x", "dir": "packs/", "range_get": 10, "keys": 10},
    {"key": "ns/reads/<node>", "dir": "ns/reads/", "put": 1, "keys": 0},
]


def test_rates_bytes_and_verdicts_on_a_known_plan() -> None:
    doc = fm.model(PLAN, [1000], [0.5, 10], [10], bytes_down=10_000_000, bytes_up=0,
                   rtt_ms=20)
    assert doc["per_node"]["requests"] == {"get": 4, "range_get": 10, "head": 1, "list": 0,
                                           "put": 1, "total": 16}
    hot = doc["hottest_per_node"]
    assert hot["root"]["get_per_node"] == 15  # every read request, one prefix
    assert (hot["dir"]["get_prefix"], hot["dir"]["get_per_node"]) == ("packs/", 10)
    assert (hot["key"]["get_prefix"], hot["key"]["get_per_node"]) == ("ns/gen/1", 3)
    row = doc["rows"][0]
    assert row["requests"]["total"] == 16_000
    assert row["bytes_s"] == {"10 Gbit/s": 8.0}  # 10 GB x 8 / 10 Gbit/s
    burst = row["spreads"]["0.5 s"]  # counted over a whole second
    assert burst["root"]["get_per_s"] == 15_000 and burst["root"]["put_per_s"] == 1000
    assert burst["dir"]["get_per_s"] == 10_000 and burst["key"]["get_per_s"] == 3000
    assert burst["root"]["over_limit"] == round(15_000 / 5500, 2)
    assert burst["verdict"].startswith("throttled until S3 partitions below the directories")
    assert row["spreads"]["10 s"]["verdict"] == "within limits"
    assert doc["latency_floor_s"]["http"] == 0.26  # 13 serial round trips of 20 ms


def test_a_fleet_row_sets_pack_reads_and_bytes(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    fleet = {"rows": {"4": {"nodes": 4, "bytes_down_per_node": 123,
                            "requests_total": {"get": 32, "range_get": 56, "head": 12,
                                               "list": 4, "put": 8, "total": 112}}}}
    f = tmp_path / "fleet.json"
    f.write_text(json.dumps(fleet))
    assert fm.main(["--fleet", str(f), "--nodes", "10", "--spread", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["per_node"]["bytes_down"] == 123
    assert doc["per_node"]["requests"]["range_get"] == 14  # 56 / 4 nodes: 14 packs
    assert doc["fleet_measured_per_node"]["total"] == 28
    assert doc["rows"][0]["spreads"]["1 s"]["key"]["get_per_s"] == 40  # the record, 4 a node
