"""``casfs report``: the cluster's figures from the shared root alone, for a window."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from casfs.cli import report
from casfs.cli.report import parse_since
from casfs.store import outcomes
from casfs.store.root import SharedRoot

from .reportroot import ELSEWHERE, NOWHERE, build, cli, report_json


def test_report_json_figures(tmp_path: Path) -> None:
    build(tmp_path / "root")
    doc = report_json(tmp_path / "root", "--since", "7d")
    days = [d["day"] for d in doc["days"]]
    assert len(days) == 8 and days == sorted(days)  # 7 days back to today, both included
    # Triton: node-a 3+d hits, node-b 6+d, for d = 0..7 (the days in the window).
    fam = {f["family"]: f for f in doc["families"]}
    want_hits = sum(3 + d + 6 + d for d in range(8))
    assert fam["triton"]["hits"] == want_hits and fam["triton"]["misses"] == 3 * 8
    assert fam["triton"]["saved_s"] == round(sum(12_345 * 3 + 2 * d for d in range(8)) / 1000, 3)
    assert fam["triton"]["hit_ratio"] == round(want_hits / (want_hits + 24), 4)
    assert fam["inductor"]["untimed_hits"] == 8
    assert doc["totals"]["hits"] == sum(f["hits"] for f in doc["families"])
    today = doc["days"][-1]
    assert today["day"] == outcomes.day_of(doc["generated"])
    assert today["families"]["triton"]["hits"] == 9 and today["hits"] == 9
    assert {n["node"]: n["hits"] for n in doc["nodes"]} == {
        "node-a": sum(3 + d for d in range(8)) + sum(range(8)),
        "node-b": sum(6 + d for d in range(8))}
    ns = {n["namespace"]: n for n in doc["namespaces"]}
    assert ns["triton-aa11"]["entries"] == 7 and ns["vllm-cc33"]["hits"] == 0
    assert doc["unread_namespaces"] == ["vllm-cc33"]  # no read record, no hit
    # Store: the shared file is stored once; growth: every namespace began in the window.
    st = doc["store"]
    assert st["files"] == 16 and st["unique_bytes"] < st["logical_bytes"]
    assert doc["growth"]["bytes"] == sum(n["bytes"] for n in doc["namespaces"])
    assert doc["growth"]["exact"] is True
    top = doc["most_missed"][0]
    assert top["namespace"] == "triton-aa11" and top["entry"] == ELSEWHERE


def test_report_most_missed_causes(tmp_path: Path) -> None:
    """Each most-missed entry says where it exists (another namespace of the family, with
    the ingredients that differ) or that no namespace holds it."""
    build(tmp_path / "root")
    doc = report_json(tmp_path / "root", "--since", "7d")
    missed = {(m["namespace"], m["entry"]): m for m in doc["most_missed"]}
    there = missed["triton-aa11", ELSEWHERE]
    assert there["exists_in"] == "triton-dd44"
    assert there["differs"] == [{"ingredient": "torch", "here": "2.13.0", "there": "2.12.1"}]
    assert there["cause"] == "exists in triton-dd44 (torch 2.13.0 here vs 2.12.1)"
    assert there["namespaces_read"] == there["namespaces_of_family"] == 1
    nowhere = missed["triton-aa11", NOWHERE]
    assert nowhere["exists_in"] is None and nowhere["differs"] is None
    assert nowhere["cause"] == "compiled in no other namespace of this root"
    # Its own namespace is not "another": K0 (which triton-aa11 holds) is nowhere else.
    assert missed["triton-aa11", "K0"]["exists_in"] is None
    assert doc["miss_causes"]["complete"] is True
    assert doc["miss_causes"]["namespaces_read"] == 1  # one missed namespace, one other
    r = cli(tmp_path / "root", "report")
    assert "CAUSE" in r.stdout
    assert "exists in triton-dd44 (torch 2.13.0 here vs 2.12.1)" in r.stdout


def test_report_causes_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the causes' time budget nothing more is read, and the document says so."""
    build(tmp_path / "root")
    monkeypatch.setattr(report, "CAUSES_BUDGET_S", 0.0)
    now = time.time()
    doc = report.build(SharedRoot.open(tmp_path / "root"), now - 7 * 86400, now)
    assert doc["miss_causes"]["complete"] is False and doc["miss_causes"]["namespaces_read"] == 0
    assert all(m["exists_in"] is None and m["cause"].startswith("not looked up")
               for m in doc["most_missed"])


def test_report_window_and_text(tmp_path: Path) -> None:
    build(tmp_path / "root")
    one = report_json(tmp_path / "root", "--since", "1d")
    assert len(one["days"]) == 2
    r = cli(tmp_path / "root", "report")
    assert r.returncode == 0, r.stderr
    assert "compile time saved" in r.stdout and "triton-aa11" in r.stdout
    assert "nobody read: vllm-cc33" in r.stdout
    assert cli(tmp_path / "root", "report", "--since", "soon").returncode != 0


def test_gc_keeps_outcomes_for_the_window(tmp_path: Path) -> None:
    build(tmp_path / "root")
    before = report_json(tmp_path / "root", "--since", "10d")
    r = cli(tmp_path / "root", "gc", "--grace", "0", "--keep-outcomes", "5", "--json")
    assert r.returncode == 0, r.stderr
    after = report_json(tmp_path / "root", "--since", "10d")
    # Days within the kept 5 are unchanged; older ones are gone.
    recent = {d["day"]: d for d in before["days"][-5:]}
    assert {d["day"]: d for d in after["days"][-5:]} == recent
    assert after["totals"]["hits"] < before["totals"]["hits"]
    assert cli(tmp_path / "root", "gc", "--keep-outcomes", "0").returncode != 0


def test_parse_since() -> None:
    assert parse_since("7d") == 7 * 86400 and parse_since("12h") == 12 * 3600
    assert parse_since("3") == 3 * 86400 and parse_since("30m") == 1800


def test_a_tenants_control_characters_never_reach_the_terminal(tmp_path: Path) -> None:
    """An outcome record is a tenant's file: a node name holding a terminal's escape
    sequences and a most-missed entry holding a newline and a forged line were printed
    as they are by `casfs report` (found by a review on 2026-12-06). Such a record is
    dropped now, and every table cell is printed with its control characters escaped."""
    import json

    from casfs.cli.output import table

    root = build(tmp_path / "root")
    now = time.time()
    key = outcomes.record(root.backend, "triton-aa11", family="triton", node="evil", now=now,
                          hits=1000, misses=1, saved_ms=1, missed=[("Kx", 999)])
    assert key is not None
    path = tmp_path / "root" / key
    doc = json.loads(path.read_bytes())
    doc["rows"][0][1] = "\x1b]0;PWNED\x07\x1b[2K\rnode-a"
    doc["missed"] = [["K1\ncasfs: all caches verified OK", 999]]
    path.chmod(0o644)
    path.write_text(json.dumps(doc))
    r = cli(tmp_path / "root", "report", "--since", "7d")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout and "\r" not in r.stdout
    assert not any(line.startswith("casfs: all caches") for line in r.stdout.splitlines())
    assert "PWNED" not in r.stdout  # the record is dropped whole
    rep = report_json(tmp_path / "root", "--since", "7d")
    assert all(n["node"] in ("node-a", "node-b") for n in rep["nodes"])
    # and whatever else a cell holds is shown escaped, on its line
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        table([["a\x1b[2Jb", "c\nd"]], ["X", "Y"])
    assert "\x1b" not in out.getvalue() and len(out.getvalue().splitlines()) == 2
