"""The Grafana dashboard is known to work: a real Prometheus scrapes a real casfsd serving
real jobs, and every query on deploy/grafana/casfs.json returns data (issue 24).

Two daemons share one root, standing in for two nodes; B also has a configured mount.
A job on node A (``casfs env`` through A's jobs socket) compiles a tiny Triton-like
cache and A publishes it. Then, with Debian's ``prometheus`` scraping node B's metrics
endpoint every second, a job on B (through B's jobs socket, as a user's job reaches it)
loads A's kernel (hits; B prefetched it at the lease), looks up a kernel nobody compiled
(a miss), writes a generic cache file that B publishes (the publication latency
histogram), and loads a kernel A compiles meanwhile (cold opens that wait for objects
from the root: the fetch latency histogram). Every ``targets[].expr`` of every
panel, with the dashboard's variables substituted, is then evaluated through
Prometheus's HTTP API: each must succeed and return at least one series with a number
(not NaN), and each template variable must find values. The dashboard's structure is
checked too (schema, datasource, ids, grid).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon.conftest import Daemon
from daemon.conftest import daemons as casfsd_daemons
from waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "casfs.json"
PROMETHEUS = Path("/usr/bin/prometheus")
VENV_BIN = Path(sys.executable).parent

daemons = casfsd_daemons  # a real casfsd per "node", cleaned up after the test

FAST = {"stable_after": 0.2, "publish_interval": 0.5, "refresh_interval": 1.0}
KEY = "CSMFNZR3ZBRL4DWOBTZ6GPO5LNP4IZE6QMTL66MYB3HKGHSHMJYQ"  # a Triton kernel key
ABSENT = "ZZZZNZR3ZBRL4DWOBTZ6GPO5LNP4IZE6QMTL66MYB3HKGHSHMJYQ"
LATER = "LATRNZR3ZBRL4DWOBTZ6GPO5LNP4IZE6QMTL66MYB3HKGHSHMJYQ"
# What Grafana substitutes, as the test pins it: every value of a variable ("All" is
# ".*"), and windows that cover the whole test (Grafana's $__rate_interval would be
# ~4 scrape intervals; the assertion is that the queries work, not that a window is).
SUBST = {"$__rate_interval": "5m", "$__range": "1h", "$node": ".*", "$family": ".*",
         "$tenant": ".*"}

# The seed job on node A: a Triton kernel directory (children, then the group file
# that commits it, as Triton's FileCacheManager writes them).
SEED = r"""
import json, os, sys
d = os.path.join(os.environ["TRITON_CACHE_DIR"], sys.argv[1])
os.makedirs(d)
kids = {}
for name, data in (("kern.cubin", b"\x7fELF" + os.urandom(60000)),
                   ("kern.json", b'{"name": "kern", "num_warps": 4}'),
                   ("kern.ttir", b"module { tt.func @kern() }")):
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
    kids[name] = os.path.join(d, name)
with open(os.path.join(d, "__grp__kern.json"), "w") as f:
    json.dump({"child_paths": kids}, f)
"""
# The job on node B: wait for a scrape (so the rates start from 0), load A's kernel
# (prefetched: B fetched the generation's hot set when the job leased it), miss one
# nobody compiled, write a generic cache file; then load the kernel A compiles while
# this job runs (a cold open: it waits for the object), and stay a moment.
USE = r"""
import os, sys, time
key, absent, later = sys.argv[1:4]
tri, gen = os.environ["TRITON_CACHE_DIR"], os.environ["CASFS_CACHE_DIR"]
print(tri, gen, flush=True)
time.sleep(3)

def load(key):
    d = os.path.join(tri, key)
    names = sorted(os.listdir(d))
    assert "__grp__kern.json" in names, names
    for n in names:
        with open(os.path.join(d, n), "rb") as f:
            f.read()

load(key)
assert not os.path.exists(os.path.join(tri, absent))
with open(os.path.join(gen, "built.bin"), "wb") as f:
    f.write(b"built on node B")
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(tri, later, "__grp__kern.json")):
    assert time.monotonic() < deadline, "the kernel A compiled later never showed"
    time.sleep(0.2)
load(later)
print("done", flush=True)
time.sleep(4)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job(d: Daemon, tmp: Path, families: str, code: str, *args: str) -> subprocess.Popen[str]:
    """A user's job on ``d``'s node: ``casfs env`` through its jobs socket, then Python."""
    state = tmp / f"job-state-{d.state.parent.name}-{time.monotonic_ns()}"
    env = dict(d.env(), CASFS_SOCKET=str(d.state.parent / "mnt-base" / "casfsd.sock"),
               CASFS_STATE_DIR=str(state), CASFS_BUILD_KEY="prometheus-test",
               PATH=f"{VENV_BIN}:{os.environ['PATH']}")
    script = (f'eval "$(casfs env --family {families})" || exit 1; '
              f'exec {sys.executable} -c "$0" "$@"')
    return subprocess.Popen(["sh", "-c", script, code, *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


class Prometheus:
    def __init__(self, tmp: Path, target: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = tmp / "prometheus.yml"
        cfg.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: casfsd\n"
            f"    static_configs:\n      - targets: ['{target}']\n")
        self.log = tmp / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [str(PROMETHEUS), f"--config.file={cfg}",
                 f"--storage.tsdb.path={tmp / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        wait_until(self._ready, "prometheus ready", proc=self.proc)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def get(self, path: str, **params: str | list[str]) -> dict[str, Any]:
        q = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{q}", timeout=30) as r:
                return dict(json.loads(r.read()))
        except urllib.error.HTTPError as e:  # a bad query: 400 with the error in JSON
            return dict(json.loads(e.read()))

    def query(self, expr: str) -> dict[str, Any]:
        return self.get("/api/v1/query", query=expr)

    def value(self, expr: str) -> float:
        r = self.query(expr)
        res = r.get("data", {}).get("result", [])
        return float(res[0]["value"][1]) if r.get("status") == "success" and res else 0.0

    def positive(self, expr: str) -> bool:
        return self.value(expr) > 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[str], Prometheus]]:
    if not PROMETHEUS.exists():
        why = "no /usr/bin/prometheus (Debian's prometheus: scripts/bootstrap.sh)"
        if os.environ.get("CASFS_REQUIRE_CLIENTS") == "1":  # make test, CI: never a skip
            pytest.fail(why)
        pytest.skip(why)
    made: list[Prometheus] = []

    def start(target: str) -> Prometheus:
        made.append(Prometheus(tmp_path, target))
        return made[-1]

    yield start
    for p in made:
        p.stop()


def substitute(expr: str) -> str:
    for k in sorted(SUBST, key=len, reverse=True):  # $__range after $__rate_interval
        expr = expr.replace(k, SUBST[k])
    expr = re.sub(r"\$\{(\w+)\}", lambda m: SUBST.get("$" + m.group(1), m.group(0)), expr)
    assert "$" not in expr, f"a variable the test does not know: {expr}"
    return expr


def panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])  # a collapsed row holds its panels


def test_dashboard_structure() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["schemaVersion"] >= 36 and dash["title"] and dash["uid"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for name in ("node", "family", "tenant"):
        assert variables[name]["type"] == "query"
        assert variables[name]["allValue"] == ".*" and variables[name]["includeAll"]
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    exprs = 0
    for p in panels(dash):
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p[
            "gridPos"]["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["type"] in ("timeseries", "stat"), p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, p["title"]
        assert p.get("description"), f"{p['title']}: say what it shows"
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"] and t["expr"].strip(), p["title"]
            substitute(t["expr"])
            exprs += 1
    assert exprs >= 20
    saved = [p for p in panels(dash) if "Compile time saved" in p["title"]]
    # Measured since the per-entry figures (manifest extra cs): the panels say it is an
    # estimate and where it comes from.
    assert saved and all("estimate" in p["description"] for p in saved)


@pytest.mark.fuse
@pytest.mark.slow
def test_every_dashboard_query_returns_data(daemons: Callable[..., Daemon],
                                            prometheus: Callable[[str], Prometheus],
                                            tmp_path: Path) -> None:
    root = tmp_path / "shared-root"
    a = daemons("a", [], root=root, defaults=FAST, node={"lease_grace": 0.5})
    mport = free_port()
    # B has a configured mount too (as casfsd's zero-config default has: triton, inductor)
    b = daemons("b", [{"name": "kern", "family": "generic", "namespace": "kern-test"}],
                root=root, defaults=FAST, node={"lease_grace": 0.5},
                metrics=f"127.0.0.1:{mport}")
    prom = prometheus(f"127.0.0.1:{mport}")
    wait_until(lambda: prom.value('up{job="casfsd"}') == 1, "prometheus scraping casfsd",
               proc=prom.proc)

    def seed(key: str) -> None:
        """Node A compiles ``key``; it publishes once the job is gone (or sooner)."""
        p = job(a, tmp_path, "triton", SEED, key)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, (out, err, a.log())

        def on_root() -> bool:
            names = [n for n in os.listdir(root / "namespaces") if "triton" in n]
            r = a.cli("ls", "-r", names[0].split("~")[-1], "--json",
                      check=False) if names else None
            return r is not None and r.returncode == 0 and f"{key}/__grp__kern.json" in r.stdout

        wait_until(on_root, f"A's publication of {key}", proc=a.proc)

    seed(KEY)
    (b.mount_paths[0] / "static.bin").write_bytes(b"written in B's configured mount")
    # Node B's job: hits (A's kernel), a miss, its own file published, A's next kernel.
    use = job(b, tmp_path, "triton,generic", USE, KEY, ABSENT, LATER)
    assert use.stdout is not None
    assert use.stdout.readline().strip(), "no lease on B"
    seed(LATER)
    out, err = use.communicate(timeout=180)
    assert use.returncode == 0 and "done" in out, (out, err, b.log())

    # Prometheus has seen it all: the fetch, the hits, B's publication.
    for expr in ('sum(casfs_fetch_seconds_count{family="triton"})',
                 'sum(casfs_family_lookup_lower_total{family="triton"})',
                 'sum(casfs_family_lookup_miss_total{family="triton"})',
                 'sum(casfs_publish_seconds_count{family="generic"})',
                 'sum(casfs_family_generations_published_total{family="generic"})',
                 'casfs_files_published_total{mount="kern"}'):
        wait_until(functools.partial(prom.positive, expr), f"{expr} > 0 in prometheus",
                   proc=prom.proc)
    # A few more scrapes: each rate has points after what it counts.
    scrapes = 'count_over_time(up{job="casfsd"}[1h])'
    n = prom.value(scrapes)
    wait_until(lambda: prom.value(scrapes) >= n + 3, "three more scrapes", proc=prom.proc)

    dash = json.loads(DASHBOARD.read_text())
    failures = []
    for p in panels(dash):
        for t in p.get("targets", []):
            expr = substitute(t["expr"])
            r = prom.query(expr)
            if r.get("status") != "success":
                failures.append(f"{p['title']}: {expr}: {r.get('error')}")
                continue
            result = r["data"]["result"]
            values = [float(s["value"][1]) for s in result]
            if not any(math.isfinite(v) for v in values):
                failures.append(f"{p['title']} [{t['refId']}]: {expr}: no data ({result})")
    for v in dash["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.*), (\w+)\)", v["definition"])
        assert m, v["definition"]
        found = prom.get(f"/api/v1/label/{m.group(2)}/values",
                         **{"match[]": substitute(m.group(1))})
        if found.get("status") != "success" or not found["data"]:
            failures.append(f"variable {v['name']}: {v['definition']}: no values ({found})")
    assert not failures, "\n".join(failures)

    # The figures mean what the panels say, for the job's tenant (u<uid>): two kernel
    # directories looked up (their files may come with readdir, no lookup of their own),
    # eight files opened from the cache, the later kernel's objects fetched on open.
    def fig(metric: str) -> float:
        return prom.value(f'{metric}{{family="triton",tenant="u{os.geteuid()}"}}')

    # ... and stay counted once B released the namespace (its job is gone).
    wait_until(lambda: prom.query('casfs_namespaces_served{family="triton"} == 0')["data"][
        "result"], "B's release of the triton namespace, scraped", proc=prom.proc)
    assert fig("casfs_family_lookup_lower_total") >= 2
    assert fig("casfs_family_lookup_miss_total") >= 1
    assert fig("casfs_family_open_lower_total") >= 8
    assert fig("casfs_family_objects_fetched_total") >= 1
    assert fig("casfs_fetch_seconds_count") >= 1
    # Present for the family; how much depends on whether A's job looked its kernel up
    # (a miss) before writing it: the per-entry figure is an estimate (docs/format.md).
    assert prom.value('casfs_compile_seconds_saved_total{family="triton"}') >= 0
    assert a.terminate() == 0 and b.terminate() == 0


@pytest.fixture(autouse=True)
def _no_leftover_tsdb(tmp_path: Path) -> Iterator[None]:
    yield
    shutil.rmtree(tmp_path / "tsdb", ignore_errors=True)
