"""The markdown table and the JSON file of a run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.common import Result


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def table(results: list[Result]) -> str:
    lines = ["| benchmark | case | figures | ratios | target: measured |",
             "|---|---|---|---|---|"]
    for r in results:
        figs = ", ".join(f"{k} {_fmt(v)}" for k, v in r.figures.items())
        rats = ", ".join(f"{k} {_fmt(v)}" for k, v in r.ratios.items())
        verdicts = []
        for v in r.verdicts():
            mark = {True: "met", False: "**missed**", None: "n/a"}[v["met"]]
            verdicts.append(f"{v['target']}: {_fmt(v['value'])} ({mark})")
        lines.append(f"| {r.bench} | {r.case} | {figs} | {rats} | {'; '.join(verdicts)} |")
    return "\n".join(lines)


def write_json(path: Path, env: dict[str, Any], results: list[Result]) -> None:
    doc = [{"environment": env, **r.to_json()} for r in results]
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
