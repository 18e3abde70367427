"""A fleet start against a real SeaweedFS cluster (issue 23): N fresh nodes at once.

Usage::

    python -m bench.fleet [--nodes 1,4,16] [--kernels 600] [--rtt-ms 0] [--json FILE]
        [--write-kernels 1 [--same-kernels]] [--reader-args '--mode overlay --wait-warm 60']
        [--journaled-scratch] [--plot fleet.png]
    python -m bench.fleet --plot-from fuse=a.json overlay=b.json --plot fleet.png
    python -m bench.fleet --faults [--nodes 4] [--stall-s 30] [--kernels 150]
    python -m bench.fleet --site-cache [--nodes 1,4] [--no-copy-restore]

The cluster is tests/seaweed_cluster.py: one ``weed master``
(``-defaultReplication=001``: every volume on two servers), three ``weed
volume`` servers, a ``weed filer`` and the ``weed s3`` gateway, each its own
process. The shared root is ``s3://casfs-net/root`` on that gateway. Each node
reaches it through its own tests/netem.py proxy (``--rtt-ms``: one-way delay
rtt/2 both ways; 0 by default: loopback), which counts the node's requests by
kind and can inject connection resets and 503 SlowDown.

One publishing node writes bench/network.py's Triton-like tree (``--kernels``
x 8 files: 600 kernels = 4,800 files, ~77 MB) under a real ``casfs run
--family triton``, which promotes it into packs and publishes a fresh
namespace. Then, for each N, N fresh nodes (each its own state dir, serve
base and mount base, each a real ``casfs run`` with its own FUSE mount process
and fetch workers) start at once and run one job each that opens and reads
every file of the tree through the mount and checks every byte against what
was written (group files: their child names; they hold absolute paths), then
adds ``--write-kernels`` kernels of its own (8 files each, numbered apart per
node; ``--same-kernels``: the same ones on every node, as a data-parallel job's
ranks compile alike), which its ``casfs run`` promotes and publishes as it
ends: N publishers into the one namespace at the same moment. A fresh node then reads the tree
and every node's kernels (``publishing`` in each row: none may be lost).
Timed from launching ``casfs run`` to its exit. Beside it, copy-restore with
the same N (bench/network.py's job: one GET of a tar.zst through the node's
proxy, ``zstd -dc | tar -x``, the same read), N at once.

CPU per node: ``casfs run`` and its job (``wait4``'s rusage of that process
tree) plus the node's mount process and workers (sampled from /proc, with
their reaped children), which ``casfs run`` does not reap. On 2 cores a large
N measures CPU contention first: the JSON says how many cores there were.

``--site-cache``: after each N, N more fresh nodes read a newly published
namespace with ``?read_cache=`` naming a real nginx ``proxy_cache``
(tests/sitecache.py) in front of the gateway, behind its own counting proxy;
the bucket lets unsigned callers read the root's ``objects/`` and ``packs/``.
The row's ``site_cache`` says what reached the root (the nodes' signed
requests plus the cache's fills) and what that saved against the N nodes
without it (docs/fleet.md, "A site cache in front of the root").

``--faults``: the same fleet under faults at fleet scale, one phase each, each
phase with N fresh nodes started into it: ``volume-kill`` (one of the three
volume servers SIGKILLed as the first node's job begins to read; it stays dead
for the remaining phases: replication must keep every read correct),
``s3-stall`` (the gateway SIGSTOPped for ``--stall-s`` seconds from the moment
the first job begins to read: reads in flight wait on it), ``s3-stall-at-start``
(the same from the nodes' launch: mounts start against a hung root),
``resets`` (``--share`` of responses, 5 %, cut 64 bytes into the body and the
connection reset: records and small objects too) and ``slowdown`` (``--share``
of requests answered 503 SlowDown). Each
job reads the whole tree in passes until one pass reads every file correctly
(the fault has cleared and the node serves again) or a deadline. The
invariant, checked per read: correct bytes or ENOENT (a miss), never another
error, never a wrong byte, never an open + read longer than
``--fetch-timeout`` + 3 s; and every node ends with a clean pass. Exits 1 if any of that fails.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SCRIPT = str(Path(__file__).resolve())
NETWORK = str(REPO / "bench" / "network.py")
SLACK_S = 3.0  # an open may wait fetch_timeout, plus this, before it counts as a hang


# --- the node's job (stdlib only: run as a script under casfs run) ------------

def _one_pass(root: Path, expected: dict[str, list[Any]]) -> dict[str, Any]:
    ok = miss = wrong = 0
    errors: dict[str, int] = {}
    lat: list[float] = []
    slowest = ("", 0.0)
    t0 = time.monotonic()
    for rel in sorted(expected):
        want = expected[rel]
        s = time.monotonic()
        try:
            with open(root / rel, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            miss += 1
            continue
        except OSError as e:
            name = errno.errorcode.get(e.errno or 0, str(e.errno))
            errors[name] = errors.get(name, 0) + 1
            continue
        finally:
            d = time.monotonic() - s
            lat.append(d)
            if d > slowest[1]:
                slowest = (rel, d)
        if want[0] == "grp":
            try:
                good = sorted(json.loads(data)["child_paths"]) == want[1]
            except (ValueError, KeyError, TypeError):
                good = False
        else:
            good = len(data) == want[1] and hashlib.sha256(data).hexdigest() == want[0]
        if good:
            ok += 1
        else:
            wrong += 1
    lat.sort()
    return {"ok": ok, "miss": miss, "wrong": wrong, "errors": errors,
            "read_s": round(time.monotonic() - t0, 3), "mono": [t0, time.monotonic()],
            "p50_open_s": round(lat[len(lat) // 2], 4) if lat else None,
            "p99_open_s": round(lat[int(len(lat) * 0.99)], 4) if lat else None,
            "max_open_s": round(slowest[1], 3), "slowest": slowest[0]}


def check_job(expected_file: str, until_s: float, started: str = "", write: int = 0,
              first: int = 0) -> dict[str, Any]:
    """Read every expected file; with ``until_s`` > 0, pass again until a pass reads
    every file correctly or ``until_s`` seconds went by. ``started``: a directory in
    which the job leaves a file as its first read begins (faults start on it).
    ``write`` > 0: then write that many new kernels of its own (numbered from
    ``first``), as a job that compiled a few does; casfs publishes them at release."""
    root = Path(os.environ["TRITON_CACHE_DIR"])
    expected = json.loads(Path(expected_file).read_text())
    if started:
        Path(started, str(os.getpid())).touch()
    start = time.monotonic()
    passes = []
    while True:
        p = _one_pass(root, expected)
        passes.append(p)
        if p["ok"] == len(expected) or until_s <= 0 or time.monotonic() - start > until_s:
            break
        time.sleep(1.0)
    clean = passes[-1]["ok"] == len(expected)
    wrote = None
    if write > 0:
        from network import write_tree  # bench/network.py, beside this script

        t = time.monotonic()
        files, nbytes = write_tree(root, write, first)
        wrote = {"files": files, "bytes": nbytes, "s": round(time.monotonic() - t, 3)}
    return {"files": len(expected), "passes": len(passes), "clean_at_end": clean,
            "wrote": wrote,
            "clean_after_s": round(passes[-1]["mono"][1] - start, 2) if clean else None,
            "first": passes[0], "ok": sum(p["ok"] for p in passes),
            "miss": sum(p["miss"] for p in passes), "wrong": sum(p["wrong"] for p in passes),
            "errors": _sum_errors(passes), "max_open_s": max(p["max_open_s"] for p in passes),
            "slowest": max(passes, key=lambda p: p["max_open_s"])["slowest"]}


def _sum_errors(passes: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in passes:
        for k, v in p["errors"].items():
            out[k] = out.get(k, 0) + v
    return out


# --- the bed ------------------------------------------------------------------

def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, round(q * (len(xs) - 1)))], 3)


class _MountCpu:
    """CPU (with reaped children) of processes whose command line names a node dir,
    by node: the mount processes and fetch workers ``casfs run`` does not reap."""

    def __init__(self, markers: dict[str, int]) -> None:
        self.markers = {k.encode(): v for k, v in markers.items()}
        self.seen: dict[int, tuple[int, float]] = {}
        self.pids: set[int] = set()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _sample(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{d}/cmdline").read_bytes()
                node = next((v for k, v in self.markers.items() if k in cmd), None)
                if node is None:
                    continue
                f = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            self.pids.add(int(d))
            self.seen[int(d)] = (node, sum(int(x) for x in f[11:15]) / tick)

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            self._sample()

    def stop(self) -> dict[int, float]:
        self._stop.set()
        self._t.join()
        out: dict[int, float] = {}
        for node, cpu in self.seen.values():
            out[node] = out.get(node, 0.0) + cpu
        return out


class Fleet:
    def __init__(self, work: Path, kernels: int, rtt_ms: float, volumes: int = 3,
                 casfs_src: Path = REPO, site_cache: bool = False,
                 run_args: tuple[str, ...] = ()) -> None:
        sys.path.insert(0, str(REPO / "tests"))
        sys.path.insert(0, str(REPO))
        from seaweed_cluster import SeaweedCluster

        from bench import network

        self.work = work
        self.src = casfs_src  # the casfs the nodes run (PYTHONPATH and cwd)
        self.run_args = run_args  # the nodes' casfs run options (--mode overlay ...)
        self.kernels = kernels
        self.delay = rtt_ms / 2000
        # --site-cache: the bucket lets unsigned callers read the root's objects and packs
        anon = tuple(f"{network.BUCKET}/root/{p}" for p in ("objects", "packs")) \
            if site_cache else ()
        self.cluster = SeaweedCluster(work / "weed", volumes=volumes, anonymous_read=anon)
        self.cluster.start()
        self.proxies: list[Any] = []
        self.cache: Any = None  # tests/sitecache.py's NginxCache, with --site-cache
        self.cache_net: Any = None  # the proxy between it and the gateway (its fills)
        try:
            self.cluster.create_bucket(network.BUCKET)
            self.writer_net = self._proxy(0.0)
            if site_cache:
                from netem import NetProxy
                from sitecache import NginxCache

                self.cache_net = NetProxy(self.cluster.s3_port, delay=self.delay).start()
                self.cache = NginxCache(work / "nginx", f"127.0.0.1:{self.cache_net.port}")
                self.cache.start()
            src = work / "plain" / "triton"
            self.files, self.nbytes = network.write_tree(src, kernels)
            self.expected_file = work / "expected.json"
            self.expected_file.write_text(json.dumps(_expected(src)))
            archive = work / "tree.tar.zst"
            subprocess.run(f"tar -C '{src}' -cf - . | zstd -q -3 -T0 -o '{archive}'",
                           shell=True, check=True)
            self.archive_bytes = archive.stat().st_size
            self.cluster._client().upload_file(str(archive), network.BUCKET,
                                               "copy/tree.tar.zst")
            archive.unlink()
            subprocess.run([sys.executable, "-m", "casfs.cli.main", "init", self.root(0)],
                           env=self.env(None, self.writer_net), cwd=self.src, check=True,
                           capture_output=True, timeout=300)
        except BaseException:
            self.close()
            raise
        self.seq = 0

    def _proxy(self, delay: float) -> Any:
        from netem import NetProxy

        p = NetProxy(self.cluster.s3_port, delay=delay, seed=len(self.proxies)).start()
        self.proxies.append(p)
        return p

    def root(self, _i: int) -> str:
        from bench import network

        return f"s3://{network.BUCKET}/root"

    def env(self, node: Path | None, net: Any, cached: bool = False) -> dict[str, str]:
        env = dict(os.environ, **self.cluster.env())
        env["AWS_ENDPOINT_URL"] = net.endpoint
        env["AWS_CONFIG_FILE"] = str(self.work / "no-aws-config")
        env["AWS_SHARED_CREDENTIALS_FILE"] = str(self.work / "no-aws-credentials")
        env["CASFS_ROOT"] = f"{self.root(0)}?endpoint={net.endpoint}"
        if cached:
            env["CASFS_ROOT"] += f"&read_cache={self.cache.url}"
        env["CASFS_SOCKET"] = str(self.work / "no-casfsd" / "casfsd.sock")
        env["PYTHONPATH"] = str(self.src)
        if node is not None:
            env.update(CASFS_STATE_DIR=str(node / "state"), CASFS_SERVE_BASE=str(node / "serve"),
                       CASFS_MOUNT_BASE=str(node / "mnt"))
        return env

    def close(self) -> None:
        if self.cache is not None:
            self.cache.stop()
        if self.cache_net is not None:
            self.cache_net.stop()
        for p in self.proxies:
            p.stop()
        self.proxies.clear()
        self.cluster.close()

    def publish(self) -> dict[str, Any]:
        """The publishing node writes the tree; casfs promotes and publishes it."""
        from bench.network import _unmount_under

        self.seq += 1
        ns = f"triton-fleet-{self.seq}"
        node = self.work / f"writer-{self.seq}"
        report = node / "report.json"
        t0 = time.monotonic()
        try:
            p = subprocess.run(
                [sys.executable, "-m", "casfs.cli.main", "run", "--family", "triton",
                 "--namespace", ns, "--report", str(report), "--", sys.executable, NETWORK,
                 "--write-tree-job", str(self.kernels)],
                env=self.env(node, self.writer_net), cwd=self.src, capture_output=True, text=True,
                timeout=1800, check=False)
        finally:
            _unmount_under(node)
        if p.returncode != 0:
            raise RuntimeError(f"the writer's casfs run exited {p.returncode}: "
                               f"{p.stderr[-3000:]}")
        rep = json.loads(report.read_text())
        published = sum(f.get("published", 0) for f in rep.get("families", []))
        if published != self.files:
            raise RuntimeError(f"the writer published {published} files, not {self.files}")
        return {"namespace": ns, "wall_s": round(time.monotonic() - t0, 2)}

    def _nets(self, n: int) -> list[Any]:
        while len(self.proxies) < n + 1:
            self._proxy(self.delay)
        nets = self.proxies[1:n + 1]
        for net in nets:
            net.delay = self.delay
            net.reset_counts()
        return nets

    def casfs_round(self, ns: str, n: int, tag: str, until_s: float = 0.0,
                    fetch_timeout: float = 10.0, refresh_s: float | None = None,
                    during: Any = None, cached: bool = False, write: int = 0,
                    expected: Path | None = None, same: bool = False
                    ) -> list[dict[str, Any]]:
        """N fresh nodes at once, each ``casfs run`` + the check job; ``during(t0)`` is
        called in a thread right after they were launched (the fault schedule).
        ``cached``: their roots read objects and packs through the site cache.
        ``write``: each job then adds that many kernels of its own (node i numbered
        from ``kernels + i * write``), published as its ``casfs run`` ends; ``same``:
        every node adds the same ones (a data-parallel job's ranks compile alike).
        ``expected``: what the jobs read (default: the published tree)."""
        from bench.network import _unmount_under

        nets = self._nets(n)
        nodes = [self.work / f"{tag}-node{i}" for i in range(n)]
        self.started = self.work / f"{tag}-started"
        self.started.mkdir()
        sampler = _MountCpu({str(nd) + "/": i for i, nd in enumerate(nodes)})
        procs: list[subprocess.Popen[bytes]] = []
        results: list[dict[str, Any]] = [{} for _ in range(n)]

        def reap(i: int, pid: int, t0: float) -> None:
            _, status, ru = os.wait4(pid, 0)
            results[i].update(wall_s=round(time.monotonic() - t0, 3),
                              exit=os.waitstatus_to_exitcode(status),
                              cpu_run_and_job_s=round(ru.ru_utime + ru.ru_stime, 2))

        extra = ["--fetch-timeout", str(fetch_timeout)]
        if refresh_s is not None:
            extra += ["--refresh-interval", str(refresh_s)]
        threads = []
        fault: threading.Thread | None = None
        try:
            t0 = time.monotonic()
            for i, nd in enumerate(nodes):
                nd.mkdir(parents=True)
                cmd = [sys.executable, "-m", "casfs.cli.main", "run", "--family", "triton",
                       "--namespace", ns, *self.run_args, *extra,
                       "--report", str(nd / "report.json"), "--", sys.executable, SCRIPT,
                       "--check-job", str(expected or self.expected_file), str(until_s),
                       str(self.started), str(write),
                       str(self.kernels + (0 if same else i * write))]
                with open(nd / "out", "wb") as out, open(nd / "err", "wb") as err:
                    p = subprocess.Popen(cmd, env=self.env(nd, nets[i], cached), cwd=self.src,
                                         stdout=out,
                                         stderr=err, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
                procs.append(p)
                th = threading.Thread(target=reap, args=(i, p.pid, time.monotonic()))
                th.start()
                threads.append(th)
            if during is not None:
                fault = threading.Thread(target=during, args=(t0,))
                fault.start()
            for th in threads:
                th.join()
        finally:
            for p in procs:  # only on a failure above: every one is reaped otherwise
                if p.returncode is None and _alive(p.pid):
                    with contextlib.suppress(ProcessLookupError):  # casfs run and its job
                        os.killpg(p.pid, signal.SIGKILL)
            for th in threads:
                th.join(60)
            if fault is not None:
                fault.join()
            mount_cpu = sampler.stop()
            for nd in nodes:
                _unmount_under(nd)
            for pid in sampler.pids:  # a node's mount process still finishing: ours
                if _alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        from bench.network import _kinds

        for i, nd in enumerate(nodes):
            r = results[i]
            lines = (nd / "out").read_text().strip().splitlines()
            try:
                r["job"] = json.loads(lines[-1])
            except (IndexError, ValueError):
                r["job"] = None
                r["stderr"] = (nd / "err").read_text()[-2000:]
            try:
                report = json.loads((nd / "report.json").read_text())
                r["published"] = sum(f.get("published", 0) for f in report["families"])
                r["races_lost"] = sum(f.get("publish_races_lost", 0)
                                      for f in report["families"])
                r["publish_s"] = report.get("timings", {}).get("publish_s")
            except (OSError, ValueError, KeyError, TypeError):
                r["published"] = r["races_lost"] = r["publish_s"] = None
            r["cpu_mount_s"] = round(mount_cpu.get(i, 0.0), 2)
            r["cpu_s"] = round(r["cpu_run_and_job_s"] + r["cpu_mount_s"], 2)
            c = nets[i].counts()
            r["requests"] = _kinds(c)
            r["bytes_down"] = c["bytes_down"]
            r["bytes_up"] = c["bytes_up"]
            r["connections"] = c["connections"]
        return results

    def check_published(self, ns: str, write: int, rs: list[dict[str, Any]], tag: str,
                        same: bool = False) -> dict[str, Any]:
        """After a round whose N jobs each added ``write`` kernels: each node published
        its own, and none was lost to another's publication at the same moment (one
        namespace, N publishers at once): a fresh node reads the tree and all of them.
        ``same`` (every node added the same kernels): each file was published once in
        all, by whichever node got there first; the others found it there."""
        from bench.network import FILES_PER_KERNEL, kernel_files

        expected = json.loads(self.expected_file.read_text())
        for i in range(1 if same else len(rs)):
            for k in range(self.kernels + i * write, self.kernels + (i + 1) * write):
                for rel, data in kernel_files(k, "/unused"):
                    expected[rel] = _expect(rel, data)
        path = self.work / f"{tag}-expected.json"
        path.write_text(json.dumps(expected))
        vr = self.casfs_round(ns, 1, f"{tag}-verify", expected=path)
        want = write * FILES_PER_KERNEL
        published = [r.get("published") for r in rs]
        if same:
            problems = ([] if sum(p or 0 for p in published) == want else
                        [f"the nodes published {published} files, not {want} in all"])
        else:
            problems = [f"node {i}: published {p} files, not {want}"
                        for i, p in enumerate(published) if p != want]
        problems += [f"a fresh node after them: {b}"
                     for b in _check_invariants(vr, len(expected), 10.0)]
        job = vr[0].get("job") or {}
        return {"files_per_node": want, "published_per_node": published,
                "races_lost_per_node": [r.get("races_lost") for r in rs],
                "release_s_per_node": [r.get("publish_s") for r in rs],
                "write_s_p50": _pct([((r.get("job") or {}).get("wrote") or {}).get("s", 0.0)
                                     for r in rs], 0.5),
                "fresh_node_read": {"files": len(expected),
                                    "ok": job.get("first", {}).get("ok")},
                "problems": problems}

    def copy_restore_round(self, n: int) -> list[dict[str, Any]]:
        nets = self._nets(n)
        dests = [self.work / f"restore-{n}-{i}" for i in range(n)]
        out: list[dict[str, Any]] = [{} for _ in range(n)]

        def one(i: int) -> None:
            t0 = time.monotonic()
            p = subprocess.run([sys.executable, NETWORK, "--copy-restore-job",
                                nets[i].endpoint, str(dests[i])],
                               env=self.env(None, nets[i]), cwd=self.src, capture_output=True,
                               text=True, timeout=1800, check=False)
            out[i]["wall_s"] = round(time.monotonic() - t0, 3)
            out[i]["exit"] = p.returncode
            if p.returncode == 0:
                job = json.loads(p.stdout.strip().splitlines()[-1])
                out[i]["job_files"] = job["files"]

        ru0 = _children_cpu()
        ths = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        cpu = _children_cpu() - ru0
        for i, d in enumerate(dests):
            subprocess.run(["rm", "-rf", str(d)], check=False)
            out[i]["requests"] = nets[i].counts()["requests"]
            out[i]["bytes_down"] = nets[i].counts()["bytes_down"]
            out[i]["cpu_s_mean"] = round(cpu / n, 2)
        return out


def _rev(src: Path) -> str:
    from bench.network import _rev as rev

    return rev(src)


def _children_cpu() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _expected(src: Path) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for dirpath, _dirs, names in os.walk(src):
        for name in names:
            p = Path(dirpath) / name
            out[str(p.relative_to(src))] = _expect(name, p.read_bytes())
    return out


def _expect(name: str, data: bytes) -> list[Any]:
    """What the check job compares a file with: its hash and size, or for a group
    file (absolute paths, relocated per node) its children's names."""
    if os.path.basename(name).startswith("__grp__"):
        return ["grp", sorted(json.loads(data)["child_paths"])]
    return [hashlib.sha256(data).hexdigest(), len(data)]


def _sum_kinds(rs: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rs:
        for k, v in r["requests"].items():
            out[k] = out.get(k, 0) + v
    return out


def _check_invariants(rs: list[dict[str, Any]], files: int, fetch_timeout: float
                      ) -> list[str]:
    bad = []
    for i, r in enumerate(rs):
        j = r.get("job")
        if r.get("exit") != 0 or j is None:
            bad.append(f"node {i}: casfs run exited {r.get('exit')} {r.get('stderr', '')}")
            continue
        if j["wrong"]:
            bad.append(f"node {i}: {j['wrong']} reads returned wrong bytes")
        if j["errors"]:
            bad.append(f"node {i}: errors other than ENOENT: {j['errors']}")
        if j["max_open_s"] > fetch_timeout + SLACK_S:
            bad.append(f"node {i}: an open waited {j['max_open_s']} s ({j['slowest']})")
        if not j["clean_at_end"]:
            bad.append(f"node {i}: no pass read all {files} files after the fault")
    return bad


# --- the measurements -------------------------------------------------------

def site_cache_round(fleet: Fleet, n: int) -> dict[str, Any]:
    """N fresh nodes reading a freshly published namespace through the site cache (cold:
    nothing of it is cached yet): what reached the root, the nodes' signed requests
    plus the cache's fills, against what N nodes without it sent."""
    from bench.network import _kinds

    print(f"bench.fleet: N={n}: publish (site cache)", file=sys.stderr, flush=True)
    pub = fleet.publish()
    fleet.cache.stop()  # a cold cache: packs the same bytes made in an earlier round go too
    fleet.cache.purge()
    fleet.cache.start()
    fleet.cache_net.reset_counts()
    print(f"bench.fleet: N={n}: {n} fresh nodes through the site cache", file=sys.stderr,
          flush=True)
    rs = fleet.casfs_round(pub["namespace"], n, f"n{n}-cached", cached=True)
    bad = _check_invariants(rs, fleet.files, 10.0)
    if bad:
        raise RuntimeError("; ".join(bad))
    signed = _sum_kinds(rs)
    fills = _kinds(fleet.cache_net.counts())
    walls = [r["wall_s"] for r in rs]
    served: dict[str, int] = {}
    filled: dict[str, int] = {}
    for _, uri, _, status in fleet.cache.statuses():
        served[status] = served.get(status, 0) + 1
        if status == "MISS":
            filled[uri] = filled.get(uri, 0) + 1
    return {"casfs_p50_s": _pct(walls, 0.5), "casfs_p99_s": _pct(walls, 0.99),
            "signed_to_root": signed, "cache_fills_at_root": fills,
            "cache_answers": served, "keys_filled": len(filled),
            "keys_filled_twice_or_more": sum(1 for v in filled.values() if v > 1),
            "root_total": signed["total"] + fills["total"],
            "root_bytes_down": sum(r["bytes_down"] for r in rs)
            + fleet.cache_net.counts()["bytes_down"]}


def measure(work: Path, ns_list: list[int], kernels: int, rtt_ms: float,
            copy_restore: bool = True, casfs_src: Path = REPO,
            site_cache: bool = False, write: int = 1,
            run_args: tuple[str, ...] = (), same: bool = False) -> dict[str, Any]:
    """``write``: kernels each node's job adds after its read (published at its end,
    all N into the one namespace at once); checked by a fresh node afterwards.
    ``same``: the nodes add the same kernels (see Fleet.check_published)."""
    from bench.network import FILES_PER_KERNEL

    t_start = time.perf_counter()
    fleet = Fleet(work, kernels, rtt_ms, casfs_src=casfs_src, site_cache=site_cache,
                  run_args=run_args)
    rows: dict[str, Any] = {}
    try:
        for n in ns_list:
            print(f"bench.fleet: N={n}: publish", file=sys.stderr, flush=True)
            pub = fleet.publish()
            print(f"bench.fleet: N={n}: {n} fresh nodes", file=sys.stderr, flush=True)
            srv0 = fleet.cluster.cpu_seconds()
            rs = fleet.casfs_round(pub["namespace"], n, f"n{n}", write=write, same=same)
            srv_cpu = fleet.cluster.cpu_seconds() - srv0
            bad = _check_invariants(rs, fleet.files, 10.0)
            if bad:
                raise RuntimeError("; ".join(bad))
            publishing = None
            if write:
                print(f"bench.fleet: N={n}: a fresh node reads what they published",
                      file=sys.stderr, flush=True)
                publishing = fleet.check_published(pub["namespace"], write, rs, f"n{n}",
                                                   same)
                if publishing["problems"]:
                    raise RuntimeError("; ".join(publishing["problems"]))
            walls = [r["wall_s"] for r in rs]
            total = _sum_kinds(rs)
            row: dict[str, Any] = {
                "nodes": n,
                "casfs_p50_s": _pct(walls, 0.5), "casfs_p99_s": _pct(walls, 0.99),
                "casfs_max_s": max(walls),
                "read_all_p50_s": _pct([r["job"]["first"]["read_s"] for r in rs], 0.5),
                "cpu_per_node_s": round(statistics.mean(r["cpu_s"] for r in rs), 2),
                "cpu_per_node_mount_s": round(statistics.mean(r["cpu_mount_s"] for r in rs), 2),
                "cpu_seaweedfs_s": round(srv_cpu, 2),
                # the time N nodes' CPU alone takes on this machine's cores
                "cpu_bound_s": round(max(1.0, n / (os.cpu_count() or 1))
                                     * statistics.mean(r["cpu_s"] for r in rs), 2),
                "requests_total": total,
                "requests_per_node": round(total["total"] / n, 1),
                "files_per_request": round(fleet.files * n / max(1, total["total"]), 2),
                "bytes_down_per_node": round(statistics.mean(r["bytes_down"] for r in rs)),
                "publish_s": pub["wall_s"],
                "publishing": publishing,
            }
            if copy_restore:
                print(f"bench.fleet: N={n}: {n} copy-restores", file=sys.stderr, flush=True)
                cr = fleet.copy_restore_round(n)
                if any(c["exit"] != 0 or c.get("job_files") != fleet.files for c in cr):
                    raise RuntimeError(f"copy-restore failed: {cr}")
                cw = [c["wall_s"] for c in cr]
                row.update(copy_restore_p50_s=_pct(cw, 0.5), copy_restore_p99_s=_pct(cw, 0.99),
                           copy_restore_cpu_per_node_s=cr[0]["cpu_s_mean"],
                           copy_restore_requests_total=sum(c["requests"] for c in cr),
                           copy_restore_bytes_down_per_node=round(
                               statistics.mean(c["bytes_down"] for c in cr)))
                row["casfs_over_copy_restore_p50"] = round(row["casfs_p50_s"]
                                                           / row["copy_restore_p50_s"], 2)
                row["casfs_over_copy_restore_p99"] = round(row["casfs_p99_s"]
                                                           / row["copy_restore_p99_s"], 2)
            row["p99_over_cpu_bound"] = round(row["casfs_p99_s"] / row["cpu_bound_s"], 2)
            if site_cache:
                sc = site_cache_round(fleet, n)
                sc["root_saved"] = total["total"] - sc["root_total"]
                sc["root_bytes_down_saved"] = sum(r["bytes_down"] for r in rs) \
                    - sc["root_bytes_down"]
                row["site_cache"] = sc
            row["per_node"] = [{k: r[k] for k in ("wall_s", "cpu_s", "cpu_mount_s",
                                                  "requests", "bytes_down")} for r in rs]
            rows[str(n)] = row
    finally:
        fleet.close()
    base = rows.get(str(ns_list[0]))
    for row in rows.values():
        if base:
            row["p99_over_first_n"] = round(row["casfs_p99_s"] / base["casfs_p99_s"], 2)
    return {"what": "bench.fleet: N fresh nodes reading a whole published cache at once",
            "tree": {"kernels": kernels, "files": fleet.files, "bytes": fleet.nbytes,
                     "tar_zst_bytes": fleet.archive_bytes},
            "cluster": "1 weed master (-defaultReplication=001), 3 weed volume, 1 weed filer,"
                       " 1 weed s3; one tests/netem.py proxy per node",
            "read_path": "a real casfs run per node (its mount process, fetch workers;"
                         f" options {list(run_args) or 'none: fuse mode'}): the job opens"
                         " and reads every file through the mount and checks its bytes,"
                         f" then adds {write} kernel(s)"
                         f" {'the same on every node' if same else 'of its own'}"
                         f" ({write * FILES_PER_KERNEL} files),"
                         " published as its casfs run ends: N publishers at once",
            "write_files_per_node": write * FILES_PER_KERNEL, "same_kernels": same,
            "rtt_ms": rtt_ms, "cpus": os.cpu_count(), "casfs_src": str(casfs_src),
            "casfs_rev": _rev(casfs_src),
            "n_64": "not run: needs a machine with more cores (each node's mount process"
                    " and fetch workers cost ~1 CPU-s per 1,000 files here; 64 nodes on 2"
                    " cores measure CPU contention, not the fleet); --nodes 64 runs it",
            "seconds": round(time.perf_counter() - t_start), "rows": rows}


def faults(work: Path, n: int, kernels: int, rtt_ms: float, stall_s: float,
           fetch_timeout: float, refresh_s: float, phases: list[str], share: float = 0.05,
           casfs_src: Path = REPO, run_args: tuple[str, ...] = ()) -> dict[str, Any]:
    t_start = time.perf_counter()
    fleet = Fleet(work, kernels, rtt_ms, casfs_src=casfs_src, run_args=run_args)
    out: dict[str, Any] = {}
    problems: list[str] = []
    try:
        pub = fleet.publish()
        for phase in phases:
            print(f"bench.fleet: fault {phase}: {n} fresh nodes", file=sys.stderr, flush=True)
            nets = fleet._nets(n)
            events: list[tuple[str, float]] = []

            def during(t0: float, phase: str = phase, events: list[Any] = events) -> None:
                if not phase.endswith("-at-start"):  # as the first job's reads begin
                    while not any(fleet.started.iterdir()) and time.monotonic() - t0 < 120:
                        time.sleep(0.02)
                if phase == "volume-kill":
                    fleet.cluster.kill_volume(0)
                    events.append(("volume0 SIGKILL", time.monotonic() - t0))
                elif phase.startswith("s3-stall"):
                    fleet.cluster.stop_s3()
                    events.append(("s3 SIGSTOP", time.monotonic() - t0))
                    try:
                        time.sleep(stall_s)
                    finally:
                        fleet.cluster.cont_s3()
                    events.append(("s3 SIGCONT", time.monotonic() - t0))

            for net in nets:
                net.reset_share = share if phase == "resets" else 0.0
                # Cut after 64 bytes: records and small objects (a few hundred bytes)
                # are cut too, not only bodies over the default 1 KiB (packs, parts).
                net.reset_after = 64
                net.slowdown_share = share if phase == "slowdown" else 0.0
            try:
                rs = fleet.casfs_round(pub["namespace"], n, f"fault-{phase}",
                                       until_s=stall_s + 90, fetch_timeout=fetch_timeout,
                                       refresh_s=refresh_s, during=during)
            finally:
                for net in nets:
                    net.reset_share = net.slowdown_share = 0.0
            bad = _check_invariants(rs, fleet.files, fetch_timeout)
            problems += [f"{phase}: {b}" for b in bad]
            jobs = [r["job"] or {} for r in rs]
            out[phase] = {
                "nodes": n, "events": [(e, round(t, 2)) for e, t in events],
                "reads": sum(j.get("ok", 0) + j.get("miss", 0) + j.get("wrong", 0)
                             + sum(j.get("errors", {}).values()) for j in jobs),
                "correct": sum(j.get("ok", 0) for j in jobs),
                "miss_enoent": sum(j.get("miss", 0) for j in jobs),
                "wrong_bytes": sum(j.get("wrong", 0) for j in jobs),
                "errors": _sum_errors([{"errors": j.get("errors", {})} for j in jobs]),
                "max_open_s": max(j.get("max_open_s", 0.0) for j in jobs),
                "first_pass_miss": [j["first"]["miss"] for j in jobs if j],
                "clean_after_s": [j.get("clean_after_s") for j in jobs],
                "wall_s": [r["wall_s"] for r in rs],
                "requests_total": _sum_kinds(rs),
                "invariant_ok": not bad,
            }
    finally:
        fleet.close()
    return {"what": "bench.fleet --faults", "tree": {"kernels": kernels, "files": fleet.files},
            "run_args": list(run_args),
            "nodes": n, "rtt_ms": rtt_ms, "stall_s": stall_s, "fetch_timeout": fetch_timeout,
            "refresh_interval": refresh_s, "share": share, "cpus": os.cpu_count(),
            "seconds": round(time.perf_counter() - t_start), "phases": out,
            "problems": problems}


PHASES = ("volume-kill", "s3-stall", "s3-stall-at-start", "resets", "slowdown")


def plot(docs: list[tuple[str, dict[str, Any]]], path: Path) -> None:
    """Job time and requests against N, one line per document (``label``, a measure()
    JSON), copy-restore from the first that has it (matplotlib: the bench extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, (t_ax, r_ax) = plt.subplots(1, 2, figsize=(12, 4.2))
    cr_drawn = False
    for label, doc in docs:
        rows = sorted(doc["rows"].values(), key=lambda r: r["nodes"])
        ns = [r["nodes"] for r in rows]
        line = t_ax.plot(ns, [r["casfs_p50_s"] for r in rows], marker="o",
                         label=f"casfs p50, {label}")[0]
        t_ax.plot(ns, [r["casfs_p99_s"] for r in rows], marker="^", linestyle="--",
                  color=line.get_color(), label=f"casfs p99, {label}")
        t_ax.plot(ns, [r["cpu_bound_s"] for r in rows], linestyle=":",
                  color=line.get_color(), label=f"its CPU alone on {doc['cpus']} cores, {label}")
        r_ax.plot(ns, [r["requests_per_node"] for r in rows], marker="o",
                  color=line.get_color(), label=f"casfs per node, {label}")
        r_ax.plot(ns, [r["requests_total"]["total"] for r in rows], marker="^",
                  linestyle="--", color=line.get_color(), label=f"casfs all nodes, {label}")
        if not cr_drawn and all("copy_restore_p50_s" in r for r in rows):
            cr_drawn = True
            t_ax.plot(ns, [r["copy_restore_p50_s"] for r in rows], marker="s", color="grey",
                      label="copy-restore p50 (one tar.zst GET)")
            r_ax.plot(ns, [r["copy_restore_requests_total"] for r in rows], marker="s",
                      color="grey", label="copy-restore, all nodes")
    doc = docs[0][1]
    t_ax.set(xlabel="nodes starting at once (N)", ylabel="seconds, launch to exit",
             title=f"a fresh node's job: reads {doc['tree']['files']:,} files, publishes"
                   f" {doc.get('write_files_per_node', 0)}; {doc['rtt_ms']:g} ms RTT")
    r_ax.set(xlabel="nodes starting at once (N)", ylabel="requests to the root",
             title="requests (every kind)")
    for ax in (t_ax, r_ax):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.fleet", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default=None,
                    help="comma-separated N values (default 1,4,16; --faults: 4)")
    ap.add_argument("--kernels", type=int, default=None,
                    help="x 8 files (default 600: 4,800 files; --faults: 150)")
    ap.add_argument("--rtt-ms", type=float, default=0.0)
    ap.add_argument("--no-copy-restore", action="store_true")
    ap.add_argument("--site-cache", action="store_true",
                    help="after each N, N more fresh nodes read a new namespace through a"
                         " real nginx proxy_cache (?read_cache=): the requests it saves the root")
    ap.add_argument("--faults", action="store_true")
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--stall-s", type=float, default=30.0)
    ap.add_argument("--share", type=float, default=0.05,
                    help="--faults: share of responses reset / answered 503 (default 0.05)")
    ap.add_argument("--fetch-timeout", type=float, default=10.0)
    ap.add_argument("--refresh-interval", type=float, default=5.0)
    ap.add_argument("--write-kernels", type=int, default=1,
                    help="kernels (x 8 files) each node's job adds and publishes after"
                         " its read, all nodes at once (default 1; 0: read only)")
    ap.add_argument("--same-kernels", action="store_true",
                    help="every node adds the same kernels (a data-parallel job's ranks),"
                         " not kernels of its own")
    ap.add_argument("--reader-args", default="",
                    help="the nodes' casfs run options, e.g. '--mode overlay --wait-warm 60'")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path, help="draw time and requests against N (PNG)")
    ap.add_argument("--plot-from", nargs="+", metavar="LABEL=JSON",
                    help="only draw --plot from earlier --json documents")
    ap.add_argument("--casfs-src", type=Path, default=REPO,
                    help="run casfs from this source tree (default: this checkout)")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--journaled-scratch", action="store_true",
                    help="the nodes and the cluster on a fresh journaled ext4, loop-mounted for"
                         " the run (root), as a node's disk (bench.common.journaled_scratch)")
    ap.add_argument("--check-job", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.check_job:
        a = args.check_job
        print(json.dumps(check_job(a[0], float(a[1]), *a[2:3],
                                   *(int(x) for x in a[3:5]))))
        return 0
    if args.plot_from:
        if not args.plot:
            ap.error("--plot-from needs --plot")
        plot([(x.split("=", 1)[0], json.loads(Path(x.split("=", 1)[1]).read_text()))
              for x in args.plot_from], args.plot)
        return 0
    from bench.common import bench_dir

    with bench_dir(args.workdir, "casfs-bench-fleet-", args.journaled_scratch) as tmp:
        if args.faults:
            doc = faults(Path(tmp), int((args.nodes or "4").split(",")[0]),
                         args.kernels or 150, args.rtt_ms, args.stall_s, args.fetch_timeout,
                         args.refresh_interval, args.phases.split(","), args.share,
                         args.casfs_src.resolve(), tuple(shlex.split(args.reader_args)))
        else:
            doc = measure(Path(tmp), [int(x) for x in (args.nodes or "1,4,16").split(",")],
                          args.kernels or 600, args.rtt_ms, not args.no_copy_restore,
                          args.casfs_src.resolve(), args.site_cache, args.write_kernels,
                          tuple(shlex.split(args.reader_args)), args.same_kernels)
    text = json.dumps(doc, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    if args.plot and not args.faults:
        plot([(" ".join(shlex.split(args.reader_args)) or "fuse", doc)], args.plot)
    print(text)
    return 1 if doc.get("problems") else 0


if __name__ == "__main__":
    sys.exit(main())
