"""``casfs report --html`` in a real headless Chromium (Debian's ``chromium``): the page
renders from its embedded JSON with no console error and no request off the page, and
every figure it shows equals ``casfs report --json``'s. Fails (never skips) without
Chromium: scripts/bootstrap.sh installs it."""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from tests.cli.reportroot import build, cli, report_json


class _Figures(HTMLParser):
    """Every element with data-k: (path, format, raw value, shown text)."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: list[tuple[str, str, Any, str]] = []
        self._open: list[tuple[str, str, Any, list[str]] | None] = []
        self.body: dict[str, str | None] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if tag in ("meta", "link", "br", "img", "input"):
            return
        k = a.get("data-k")
        self._open.append((k, a.get("data-f") or "", json.loads(a.get("data-v") or "null"), [])
                          if k is not None else None)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("meta", "link", "br", "img", "input") or not self._open:
            return
        top = self._open.pop()
        if top is not None:
            self.figures.append((top[0], top[1], top[2], "".join(top[3])))

    def handle_data(self, data: str) -> None:
        for o in self._open:
            if o is not None:
                o[3].append(data)


def _at(doc: Any, path: str) -> Any:
    for part in path.split("."):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def _shown_ok(value: Any, f: str, text: str) -> bool:
    """The text is the value in its format (JS rounding may differ at the last digit)."""
    if value is None:
        return text == "-"
    if f == "s":
        return abs(float(text) - value) <= 0.05 + 1e-9
    if f == "pct":
        return text.endswith("%") and abs(float(text[:-1]) - value * 100) <= 0.05 + 1e-9
    if f == "bytes":
        num, unit = text.split()
        scale = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}[unit]
        return abs(float(num) * scale - value) <= 0.05 * scale + 0.5
    return text == str(value) if not isinstance(value, float) or value != int(value) \
        else text in (str(value), str(int(value)))


def test_report_page_in_chromium(tmp_path: Path) -> None:
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is needed (scripts/bootstrap.sh installs it)"
    root = tmp_path / "root"
    build(root)
    page = tmp_path / "report.html"
    r = cli(root, "report", "--since", "7d", "--html", str(page))
    assert r.returncode == 0, r.stderr
    want = report_json(root, "--since", "7d")
    html = page.read_text()
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html and "<link" not in html  # nothing fetched at view time

    profile = tmp_path / "chromium-profile"
    res = subprocess.run(
        [chromium, "--headless=new", "--disable-gpu", "--no-sandbox", "--no-first-run",
         f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    console = [line for line in res.stderr.splitlines()
               if "CONSOLE" in line or "Uncaught" in line or ":ERROR:CONSOLE" in line]
    assert not console, console

    parsed = _Figures()
    parsed.feed(res.stdout)
    assert parsed.body.get("data-rendered") == "1", res.stdout[:2000]
    figures = parsed.figures
    # The ones the issue names are all there: totals, per family, per day, per namespace,
    # per node, the store, growth, most missed, nobody read.
    keys = {k for k, _, _, _ in figures}
    for k in ("totals.saved_s", "totals.hit_ratio", "store.unique_bytes", "store.dedup_ratio",
              "growth.bytes", "unread_namespaces.0"):
        assert k in keys, k
    for section, n in (("families", len(want["families"])), ("days", len(want["days"])),
                       ("namespaces", len(want["namespaces"])), ("nodes", len(want["nodes"])),
                       ("most_missed", len(want["most_missed"]))):
        rows = {k.split(".")[1] for k in keys if k.startswith(section + ".")}
        assert rows == {str(i) for i in range(n)}, section
    # Each most-missed entry's cause is on the page (and equal to --json's, below).
    assert {f"most_missed.{i}.cause" for i in range(len(want["most_missed"]))} <= keys
    assert any(m["exists_in"] for m in want["most_missed"])
    for k, f, raw, text in figures:
        value = _at(want, k)
        if k == "window_days":
            continue  # the window's length to the second differs between the two runs
        assert raw == value, (k, raw, value)
        assert _shown_ok(value, f, text.strip()), (k, f, value, text)
    # The charts: one SVG per chart, bars for each day of the window.
    assert res.stdout.count("<svg") == 4
    assert res.stdout.count('class="bar"') == len(want["days"])
