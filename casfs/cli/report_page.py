# ruff: noqa: E501  (an HTML page: its lines are the page's)
"""The page ``casfs report --html`` writes: inline CSS, JS and SVG, no network.

Every figure is rendered from the report's JSON, embedded in the page as
``<script type="application/json" id="casfs-report">``. Each shown figure is
an element with ``data-k`` (its path in the JSON, dot-separated), ``data-f``
(its format: int, s, pct, bytes, text) and ``data-v`` (the raw value), so a
test can check the page against ``casfs report --json``.
"""

PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>casfs report</title>
<style>
:root { --fg:#1d2330; --muted:#667085; --bg:#f7f8fa; --card:#fff; --line:#e4e7ec;
        --accent:#3b6fd8; --good:#2e9d5b; --warn:#d9822b; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
       color:var(--fg); background:var(--bg); }
header { padding:20px 28px 8px; }
h1 { font-size:20px; margin:0 0 4px; }
h2 { font-size:15px; margin:0 0 10px; }
.muted { color:var(--muted); }
main { padding:8px 28px 40px; display:grid; gap:16px;
       grid-template-columns:repeat(auto-fit, minmax(420px, 1fr)); }
section { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:16px; }
section.wide { grid-column:1 / -1; }
.cards { display:flex; flex-wrap:wrap; gap:12px; }
.card { flex:1 1 150px; background:var(--bg); border-radius:6px; padding:10px 12px; }
.card .big { font-size:22px; font-weight:600; }
table { border-collapse:collapse; width:100%; }
th, td { text-align:left; padding:4px 8px; border-bottom:1px solid var(--line);
         font-variant-numeric:tabular-nums; }
th { font-weight:600; color:var(--muted); font-size:12px; }
td.n, th.n { text-align:right; }
svg { width:100%; height:auto; display:block; }
svg text { font-size:10px; fill:var(--muted); }
.bar { fill:var(--accent); } .bar2 { fill:var(--good); } .bar3 { fill:var(--warn); }
.lineplot { fill:none; stroke:var(--good); stroke-width:2; }
.dot { fill:var(--good); }
.empty { color:var(--muted); font-style:italic; }
code { font-size:12px; word-break:break-all; }
</style>
</head>
<body>
<script type="application/json" id="casfs-report">/*CASFS_REPORT_JSON*/{}</script>
<header>
  <h1>casfs report</h1>
  <div class="muted" id="window"></div>
</header>
<main>
  <section class="wide"><h2>Summary</h2><div class="cards" id="cards"></div>
    <p class="muted">Compile time saved is an estimate: per entry, the time its first
    maker took from its first miss to its last write (docs/format.md, "cs").</p></section>
  <section><h2>Compile time saved per day (s)</h2><div id="chart-saved"></div></section>
  <section><h2>Hit ratio per day</h2><div id="chart-ratio"></div></section>
  <section><h2>Per family</h2><div id="chart-families"></div><div id="families"></div></section>
  <section><h2>Store growth per day</h2><div id="chart-growth"></div><div id="store"></div></section>
  <section class="wide"><h2>Per day</h2><div id="days"></div></section>
  <section class="wide"><h2>Per namespace</h2><div id="namespaces"></div></section>
  <section><h2>Per node</h2><div id="nodes"></div></section>
  <section><h2>Most-missed entries</h2><div id="missed"></div></section>
  <section class="wide"><h2>Namespaces nobody read in the window</h2><div id="unread"></div></section>
</main>
<script>
"use strict";
const R = JSON.parse(document.getElementById("casfs-report").textContent);
const SVGNS = "http://www.w3.org/2000/svg";

function human(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? n.toFixed(0) + " B" : n.toFixed(1) + " " + units[i];
}
function fmt(v, f) {
  if (v === null || v === undefined) return "-";
  if (f === "s") return v.toFixed(1);
  if (f === "pct") return (v * 100).toFixed(1) + "%";
  if (f === "bytes") return human(v);
  return String(v);
}
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function fig(tag, path, f, v, cls) {
  const e = el(tag, {"data-k": path, "data-f": f, "data-v": JSON.stringify(v)}, fmt(v, f));
  if (cls) e.className = cls;
  return e;
}
function table(target, rows, base, cols) {
  const box = document.getElementById(target);
  if (!rows.length) { box.appendChild(el("p", {class: "empty"}, "nothing in the window")); return; }
  const t = el("table"), head = el("tr");
  for (const [key, title, f] of cols) head.appendChild(el("th", {class: f === "text" ? "" : "n"}, title));
  t.appendChild(head);
  rows.forEach((r, i) => {
    const tr = el("tr");
    for (const [key, , f] of cols)
      tr.appendChild(fig("td", base + "." + i + "." + key, f, r[key], f === "text" ? "" : "n"));
    t.appendChild(tr);
  });
  box.appendChild(t);
}
function svg(w, h) {
  const s = document.createElementNS(SVGNS, "svg");
  s.setAttribute("viewBox", "0 0 " + w + " " + h);
  s.setAttribute("role", "img");
  return s;
}
function add(parent, tag, attrs, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  parent.appendChild(e);
  return e;
}
function bars(target, labels, values, cls, f, full) {
  const W = 600, H = 200, L = 48, B = 34, T = 10;
  const s = svg(W, H), max = Math.max(1e-9, ...values.map(v => Math.abs(v || 0)));
  const bw = (W - L - 8) / Math.max(1, values.length);
  add(s, "line", {x1: L, y1: H - B, x2: W - 4, y2: H - B, stroke: "#ccd"});
  add(s, "text", {x: L - 4, y: T + 8, "text-anchor": "end"}, fmt(max, f));
  add(s, "text", {x: L - 4, y: H - B, "text-anchor": "end"}, "0");
  values.forEach((v, i) => {
    const h = (Math.max(0, v || 0) / max) * (H - B - T);
    const r = add(s, "rect", {x: L + i * bw + 1, y: H - B - h, width: Math.max(1, bw - 2),
                              height: h, class: cls});
    add(r, "title", {}, labels[i] + ": " + fmt(v, f));
    const every = Math.ceil(values.length / 8);
    if (i % every === 0)
      add(s, "text", {x: L + i * bw + bw / 2, y: H - B + 14, "text-anchor": "middle"},
          full ? String(labels[i]) : String(labels[i]).slice(-5));
  });
  document.getElementById(target).appendChild(s);
}
function line(target, labels, values) {
  const W = 600, H = 200, L = 48, B = 34, T = 10;
  const s = svg(W, H), n = values.length, step = (W - L - 8) / Math.max(1, n - 1);
  add(s, "line", {x1: L, y1: H - B, x2: W - 4, y2: H - B, stroke: "#ccd"});
  add(s, "text", {x: L - 4, y: T + 8, "text-anchor": "end"}, "100%");
  add(s, "text", {x: L - 4, y: H - B, "text-anchor": "end"}, "0%");
  const y = v => H - B - v * (H - B - T);
  let d = "";
  values.forEach((v, i) => {
    if (v === null) return;
    const x = L + (n === 1 ? (W - L) / 2 : i * step);
    d += (d ? " L" : "M") + x.toFixed(1) + " " + y(v).toFixed(1);
    const c = add(s, "circle", {cx: x, cy: y(v), r: 3, class: "dot"});
    add(c, "title", {}, labels[i] + ": " + fmt(v, "pct"));
  });
  if (d) add(s, "path", {d: d, class: "lineplot"});
  labels.forEach((lab, i) => {
    const every = Math.ceil(n / 8);
    if (i % every === 0)
      add(s, "text", {x: L + (n === 1 ? (W - L) / 2 : i * step), y: H - B + 14,
                      "text-anchor": "middle"}, String(lab).slice(-5));
  });
  document.getElementById(target).appendChild(s);
}

function render() {
  const gen = new Date(R.generated * 1000).toISOString().replace("T", " ").slice(0, 16);
  const w = document.getElementById("window");
  w.append("Root ", el("code", {}, R.root), " · ");
  w.append(fig("span", "window_days", "text", R.window_days), " days to " + gen + " UTC");
  const cards = document.getElementById("cards");
  const card = (title, path, f, v) => {
    const c = el("div", {class: "card"});
    c.appendChild(el("div", {class: "muted"}, title));
    c.appendChild(fig("div", path, f, v, "big"));
    cards.appendChild(c);
  };
  card("Compile time saved (s)", "totals.saved_s", "s", R.totals.saved_s);
  card("Entries hit", "totals.hits", "int", R.totals.hits);
  card("Entries missed", "totals.misses", "int", R.totals.misses);
  card("Hit ratio", "totals.hit_ratio", "pct", R.totals.hit_ratio);
  card("Stored", "store.stored_bytes", "bytes", R.store.stored_bytes);
  card("Unique", "store.unique_bytes", "bytes", R.store.unique_bytes);
  card("Dedup ratio", "store.dedup_ratio", "text", R.store.dedup_ratio);
  card("Growth in the window", "growth.bytes", "bytes", R.growth.bytes);

  const days = R.days.map(d => d.day);
  bars("chart-saved", days, R.days.map(d => d.saved_s), "bar", "s");
  line("chart-ratio", days, R.days.map(d => d.hit_ratio));
  bars("chart-families", R.families.map(f => f.family), R.families.map(f => f.saved_s), "bar2", "s", true);
  bars("chart-growth", days, R.growth.days.map(d => d.bytes), "bar3", "bytes");
  const fig3 = [["hits", "Hits", "int"], ["misses", "Misses", "int"],
                ["hit_ratio", "Hit ratio", "pct"], ["saved_s", "Saved (s)", "s"]];
  table("families", R.families, "families", [["family", "Family", "text"], ...fig3]);
  table("days", R.days, "days", [["day", "Day", "text"], ...fig3]);
  table("namespaces", R.namespaces, "namespaces",
        [["namespace", "Namespace", "text"], ["family", "Family", "text"], ...fig3,
         ["entries", "Files", "int"], ["bytes", "Size", "bytes"], ["bytes_added", "Added", "bytes"]]);
  table("nodes", R.nodes, "nodes", [["node", "Node", "text"], ...fig3]);
  table("missed", R.most_missed, "most_missed",
        [["entry", "Entry", "text"], ["namespace", "Namespace", "text"], ["lookups", "Lookups", "int"],
         ["cause", "Cause", "text"]]);
  if (!R.miss_causes.complete)
    document.getElementById("missed").appendChild(el("p", {class: "muted"},
      "Causes: not every namespace was read within " + R.miss_causes.budget_s + " s."));
  const st = document.getElementById("store"), t = el("table");
  for (const [k, title, f] of [["files", "Files", "int"], ["logical_bytes", "Logical", "bytes"],
      ["unique_bytes", "Unique", "bytes"], ["stored_bytes", "Stored", "bytes"],
      ["dedup_ratio", "Dedup ratio", "text"], ["compression_ratio", "Compression ratio", "text"],
      ["namespaces", "Namespaces", "int"]]) {
    const tr = el("tr");
    tr.appendChild(el("th", {}, title));
    tr.appendChild(fig("td", "store." + k, f, R.store[k], "n"));
    t.appendChild(tr);
  }
  st.appendChild(t);
  const un = document.getElementById("unread");
  if (!R.unread_namespaces.length) un.appendChild(el("p", {class: "empty"}, "every namespace was read"));
  const ul = el("ul");
  R.unread_namespaces.forEach((ns, i) => { const li = el("li"); li.appendChild(fig("code", "unread_namespaces." + i, "text", ns)); ul.appendChild(li); });
  un.appendChild(ul);
  document.body.setAttribute("data-rendered", "1");
}
render();
</script>
</body>
</html>
"""
