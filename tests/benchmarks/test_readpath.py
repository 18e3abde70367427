"""bench/readpath.py's summary: every target it holds the row to is computed from the
rounds (a ratio missing shows as "n/a", neither met nor missed)."""

from __future__ import annotations

from typing import Any

from bench import readpath

KEYS = ("first", "warm", "plain_warm", "plain_cold", "floor_warm", "overlay_warm",
        "bare_overlay_warm", "remount", "remount_noverify")
SECONDS = {"first": 3.0, "warm": 1.0, "plain_warm": 0.05, "plain_cold": 0.8,
           "floor_warm": 0.9, "overlay_warm": 0.06, "bare_overlay_warm": 0.058,
           "remount": 2.0, "remount_noverify": 1.9}
SERVER_CPU = {"warm": 90.0, "floor_warm": 60.0, "remount": 200.0, "remount_noverify": 180.0}


def _runs(rounds: int) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in KEYS}
    runs["overlay_ready_s"] = []
    for i in range(rounds):
        for k in KEYS:
            r: dict[str, Any] = {"files": 4200, "seconds": SECONDS[k] * (1 + i / 10),
                                 "files_per_s": 4200 / SECONDS[k], "cpu_seconds": SECONDS[k]}
            if k in SERVER_CPU:
                r["server_cpu_us_per_file"] = SERVER_CPU[k]
            runs[k].append(r)
        runs["overlay_ready_s"].append({"seconds": 0.5})
    return runs


def test_every_target_is_computed() -> None:
    res = readpath.summarize(_runs(2), 600, 4200, 80_000_000, can_drop=True, floor=True,
                             counters={})
    verdicts = {t.metric: v for t, v in zip(res.targets, res.verdicts(), strict=True)}
    assert set(verdicts) == {"warm_server_cpu_over_floor", "first_over_plain_cold",
                             "overlay_warm_over_bare_overlay_warm"}
    assert all(v["met"] is not None for v in verdicts.values()), verdicts
    assert res.ratios["warm_server_cpu_over_floor"] == 1.5  # 90 / 60: met at the limit
    assert verdicts["warm_server_cpu_over_floor"]["met"] is True
    assert verdicts["first_over_plain_cold"]["met"] is False  # 3.0 / 0.8
    assert res.figures["warm_server_cpu_us_per_file"] == 90.0
