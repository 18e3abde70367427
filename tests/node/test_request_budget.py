"""The request budget (docs/format.md, "Request budget"; issue 23), counted at the wire.

From an empty state dir, against a root whose namespace was written by
promotion (packs), a fresh node's job costs at most one request per 50 files
it reads, counting everything the node sends from the start of ``casfs run``
(mount start) to its exit (the job's end, and the release after it: read
records, the final publication check); a refresh costs O(1) LISTs per
namespace. Every request goes through tests/netem.py's proxy (a few ms each
way) in front of the session's SeaweedFS, which counts them by kind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netem import NetProxy

from casfs.store.entry import Entry
from casfs.store.root import SharedRoot
from casfs.util.location import parse_location

from .conftest import Node, require_fuse

pytestmark = [pytest.mark.fuse, pytest.mark.slow]

KERNELS = 250  # x 8 files, as Triton writes a kernel: 2,000 files
FILES_PER_REQUEST = 50  # the budget

WRITE_JOB = r"""
import json, os, random, sys
d = os.environ["TRITON_CACHE_DIR"]
words = ["tt.load", "tt.store", "arith.addf", "%0", "%1", "=", "ld.global.f32", "mov.u32"]
for i in range(int(sys.argv[1])):
    key = f"{sys.argv[2]}{i:05d}" + "x" * 40
    rng = random.Random(i)
    kdir = os.path.join(d, key)
    os.makedirs(kdir, exist_ok=True)
    children = {}
    for ext in ("source", "ttir", "ttgir", "llir", "ptx", "cubin", "json"):
        n = rng.randint(800, 6000)
        text = " ".join(rng.choice(words) for _ in range(n // 6))[:n]
        name = f"k.{ext}"
        tmp = os.path.join(kdir, f"tmp.{name}")
        with open(tmp, "w") as f:
            f.write(json.dumps({"key": key, "text": text}) if ext == "json"
                    else f"// {key}/{name}\n{text}\n")
        os.replace(tmp, os.path.join(kdir, name))
        children[name] = os.path.join(kdir, name)
    tmp = os.path.join(kdir, "tmp.grp")  # the group file last, naming its children
    with open(tmp, "w") as f:
        json.dump({"child_paths": children}, f)
    os.replace(tmp, os.path.join(kdir, "__grp__k.json"))
"""

READ_JOB = r"""
import json, os
n = b = 0
for top, dirs, names in os.walk(os.environ["TRITON_CACHE_DIR"]):
    dirs.sort()
    for name in sorted(names):
        with open(os.path.join(top, name), "rb") as f:
            b += len(f.read())
        n += 1
print(json.dumps({"files": n, "bytes": b}))
"""

HASH_JOB = r"""
import hashlib, json, os
d = os.environ["TRITON_CACHE_DIR"]
print(json.dumps({os.path.relpath(os.path.join(t, f), d):
                  hashlib.sha256(open(os.path.join(t, f), "rb").read()).hexdigest()
                  for t, _, fs in os.walk(d) for f in fs}))
"""


@pytest.fixture
def net(seaweed_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
        ) -> Iterator[NetProxy]:
    for k, v in seaweed_server.env().items():  # this process's own reads of the root
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    with NetProxy(seaweed_server.port, delay=0.002, record=True) as proxy:  # 4 ms RTT
        yield proxy


def _env(tmp: Path, node: str, url: str, server: Any) -> dict[str, str]:
    env = dict(os.environ, **server.env())
    env.pop("TRITON_CACHE_DIR", None)
    env.update(CASFS_ROOT=url, CASFS_STATE_DIR=str(tmp / node / "state"),
               CASFS_SERVE_BASE=str(tmp / node / "serve"),
               CASFS_MOUNT_BASE=str(tmp / node / "mnt"),
               CASFS_SOCKET=str(tmp / "no-casfsd" / "casfsd.sock"),
               AWS_CONFIG_FILE=str(tmp / "no-aws-config"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-aws-credentials"))
    return env


def _run(tmp: Path, node: str, url: str, server: Any, ns: str, *job: str,
         mode: str = "fuse") -> subprocess.CompletedProcess[str]:
    require_fuse()
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "triton",
                        "--namespace", ns, "--stable-after", "0.2", "--mode", mode, "--",
                        *job],
                       env=_env(tmp, node, url, server), capture_output=True, text=True,
                       timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-4000:]
    return r


def _url(net: NetProxy, tmp: Path) -> str:
    url = f"s3://casfs-test/budget-{os.getpid()}-{tmp.name[-40:]}?endpoint={net.endpoint}"
    SharedRoot.open(url, create=True)  # `casfs init`, as docs say for an S3 root
    return url


@pytest.mark.parametrize("mode", ["fuse", "dir"])
def test_a_fresh_node_costs_one_request_per_50_files(
        net: NetProxy, seaweed_server: Any, tmp_path: Path, mode: str) -> None:
    """Every mode a job may get (dir mode: a host without FUSE): dir mode copied the
    namespace into its directory one object at a time, a round trip a file (2,000
    requests here; 32 s for 1,200 files at 20 ms RTT), before its packs were read whole."""
    url = _url(net, tmp_path)
    files = KERNELS * 8
    _run(tmp_path, "writer", url, seaweed_server, "budget", sys.executable, "-c", WRITE_JOB,
         str(KERNELS), "K")
    root = SharedRoot.open(url)
    snap = root.generations().entries("budget")
    assert len(snap.entries) == files
    packed = sum(1 for e in snap.entries.values() if e.digest in root.objects.locations)
    assert packed == files  # written by promotion, in packs

    net.reset_counts()
    r = _run(tmp_path, "fresh", url, seaweed_server, "budget", sys.executable, "-c", READ_JOB,
             mode=mode)
    reqs = net.requests()
    counts = net.reset_counts()
    # Every key a fleet's nodes all read is read once per node: the served generation's
    # record too (it was read three times: serving, the profile, the compile times).
    gets: dict[str, int] = {}
    for q in reqs:
        if q.method == "GET" and "/generations/" in q.target:
            key = q.target.split("?")[0]
            gets[key] = gets.get(key, 0) + 1
    assert gets and max(gets.values()) == 1, gets
    # The newest generation is found once (a LIST, then one HEAD: is there a newer
    # one?), not probed for again before its record is read (3 HEADs in a row were).
    heads = [q.target for q in reqs if q.method == "HEAD" and "/generations/" in q.target]
    assert len(heads) == 1, heads
    # The root's marker: the mount process reads it and hands it to its fetch worker;
    # the promotion worker reads its own (it fails a round at once, in one line, on a
    # root that is down). It was read three times.
    markers = [q for q in reqs if q.target.split("?")[0].endswith("/casfs.json")]
    assert len(markers) <= 2, [(q.method, q.target) for q in markers]
    # The mount's LIST of the namespace's generations is its only one (that it goes
    # beside the marker's read is checked at 100 ms RTT, where a loaded machine's
    # scheduling cannot pull the two apart: test_a_named_namespace_is_read_while...).
    lists = [q for q in reqs if "list-type=2" in q.target and "%2Fgenerations" in q.target]
    assert len(lists) == 1, [q.target for q in lists]
    read = json.loads(r.stdout.strip().splitlines()[-1])
    assert read["files"] == files
    kinds = {k: v for k, v in counts.items() if v and k in (
        "get", "range_get", "head", "list", "put", "delete", "post", "other")}
    print(f"fresh node: {files} files read, {counts['requests']} requests {kinds}"
          f" ({files / counts['requests']:.0f} files per request)")
    assert counts["requests"] <= files // FILES_PER_REQUEST, kinds


def test_a_refresh_costs_o1_lists(net: NetProxy, seaweed_server: Any, tmp_path: Path) -> None:
    url = _url(net, tmp_path)
    _run(tmp_path, "writer", url, seaweed_server, "budget", sys.executable, "-c", WRITE_JOB,
         "3", "K")
    node = Node("reader", parse_location(url), tmp_path / "reader", tmp_path / "mnt")
    try:
        w = node.mount(family="triton", namespace="budget")
        assert (w.cfg.mountpoint / f"K{0:05d}{'x' * 40}" / "k.json").exists()
        for new_gens in (0, 1, 3):
            for i in range(new_gens):  # other nodes publish meanwhile
                _run(tmp_path, f"writer-{new_gens}-{i}", url, seaweed_server, "budget",
                     sys.executable, "-c", WRITE_JOB, "2", f"N{new_gens}-{i}-")
            net.reset_counts()
            reply = node.ask(w, "refresh")
            # The refresh's own requests: its generations' (the mount's background work may
            # land in this window on a busy node: the promotion worker opening the root,
            # the prefetch's pack reads, a read record).
            ours = [q for q in net.requests() if "generations" in q.target]
            net.reset_counts()
            counts = {k: sum(q.kind == k for q in ours) for k in ("list", "head", "get")}
            counts["requests"] = len(ours)
            assert reply["ok"], reply
            print(f"refresh after {new_gens} new generations: {counts['requests']} requests,"
                  f" {counts['list']} LIST, {counts['head']} HEAD, {counts['get']} GET")
            assert counts["list"] <= 1  # O(1) per namespace, whatever was published
            if not new_gens:
                assert counts["requests"] <= 3  # nothing new: a probe or two
    finally:
        node.stop_all()


def _max_in_flight(reqs: list[Any]) -> int:
    edges = sorted([(q.start, 1) for q in reqs] + [(q.end, -1) for q in reqs if q.end])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_a_fresh_nodes_prefetch_gets_loose_objects_all_at_once(
        net: NetProxy, seaweed_server: Any, tmp_path: Path) -> None:
    """A namespace of loose objects (``casfs import --no-packs``; a promotion leaves
    the odd one loose too) prefetched whole from mount-ready: its GETs are in flight
    together, not one round trip after another (at 20 ms RTT, 600 of them one by one
    were 15 s before the job could read them locally)."""
    url = _url(net, tmp_path)
    src = tmp_path / "src"
    for i in range(24):
        (src / f"k{i:02d}").mkdir(parents=True)
        (src / f"k{i:02d}" / "k.cubin").write_bytes(os.urandom(3000))
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "import", str(src), "-n",
                        "loose", "--family", "triton", "--no-packs"],
                       env=_env(tmp_path, "importer", url, seaweed_server), capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    net.delay = 0.02  # 40 ms RTT: one by one, 24 GETs take ~1 s
    net.reset_counts()
    # The job reads nothing: every object GET is the prefetch's.
    job = ("import os, time; d = os.environ['TRITON_CACHE_DIR'];"
           " time.sleep(3); print(len(os.listdir(d)))")
    out = _run(tmp_path, "fresh", url, seaweed_server, "loose", sys.executable, "-c", job)
    gets = [q for q in net.requests() if q.method == "GET" and "/objects/" in q.target]
    assert out.stdout.split()[-1] == "24"
    assert len(gets) >= 24, len(gets)  # the manifest and the 24 files
    assert _max_in_flight(gets) >= 12, sorted((round(q.start, 3), q.target) for q in gets)


def test_a_jobs_namespaces_are_set_up_together(
        net: NetProxy, seaweed_server: Any, tmp_path: Path) -> None:
    """``casfs run`` with several families (vLLM's three; every family by default):
    the node's mount process attaches their namespaces at once, so the job waits one
    namespace's round trips (its marker, a LIST, a manifest), not the sum of them
    (at 20 ms RTT three in a row were ~0.7 s of vLLM's start)."""
    url = _url(net, tmp_path)
    families = ["triton", "inductor", "vllm"]
    net.delay = 0.05  # 100 ms RTT: one namespace's set-up is a few round trips
    net.reset_counts()
    require_fuse()
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family",
                        ",".join(families), "--", sys.executable, "-c", "pass"],
                       env=_env(tmp_path, "fresh", url, seaweed_server), capture_output=True,
                       text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-4000:]
    # Each namespace's first look at its generations: a LIST of its own prefix.
    lists = {fam: [q for q in net.requests() if q.method == "GET" and "list-type=2" in q.target
                   and f"%2F{fam}-" in q.target and "%2Fgenerations%2F" in q.target]
             for fam in families}
    assert all(lists.values()), lists
    firsts = [min(qs, key=lambda q: q.start) for qs in lists.values()]
    assert _max_in_flight(firsts) == len(families), sorted(
        (round(q.start, 3), round(q.end or 0, 3), q.target) for q in firsts)
    # Each namespace's marker: read by its mount and once by the promotion worker,
    # whose first requests come together for a job this short (its early opening,
    # the outcome and read records), not once by each of them; and once by casfs
    # run, which explains the misses of namespaces with nothing published yet.
    markers = [q for q in net.requests() if q.target.split("?")[0].endswith("/casfs.json")]
    assert len(markers) <= 2 * len(families) + 1, [
        round(q.start - markers[0].start, 3) for q in markers]


def test_a_releases_records_go_at_once_with_the_root_ready(
        net: NetProxy, seaweed_server: Any, tmp_path: Path) -> None:
    """After a job that only read: its outcome and read records, two PUTs in flight
    together, and nothing else. The promotion worker opened the root (its marker)
    while the job ran; it did so after the job, then the two PUTs one after the
    other: 3 round trips, 4 with a new connection, that ``casfs run`` waited."""
    url = _url(net, tmp_path)
    # Keys as Triton names them (64 hex digits): the reader's opens are entries hit,
    # which an outcome record counts.
    writer = WRITE_JOB.replace('key = f"{sys.argv[2]}{i:05d}" + "x" * 40',
                               'key = f"{i:064x}"')
    _run(tmp_path, "writer", url, seaweed_server, "budget", sys.executable, "-c", writer,
         "3", "K")
    net.delay = 0.02  # 40 ms RTT
    net.reset_counts()
    job = READ_JOB.replace('print(json.dumps({"files": n, "bytes": b}))',
                           'import time; time.sleep(2); print(time.monotonic())')
    r = _run(tmp_path, "fresh", url, seaweed_server, "budget", sys.executable, "-c", job)
    ended = float(r.stdout.split()[-1])  # CLOCK_MONOTONIC: the proxy's clock too
    after = [q for q in net.requests() if q.start > ended]
    kinds = sorted((q.method, q.target.split("?")[0].split("/budget/")[-1]) for q in after)
    assert [k for k in kinds if k[0] != "PUT"] == [], kinds
    puts = {k[1].split("/")[0]: q for k, q in zip(kinds, sorted(
        after, key=lambda q: (q.method, q.target.split("?")[0].split("/budget/")[-1])),
        strict=True)}
    assert set(puts) == {"outcomes", "reads"}, kinds
    assert _max_in_flight(list(puts.values())) == 2, [
        (round(q.start - ended, 3), round((q.end or 0) - ended, 3), q.target) for q in after]


def _logged_at(log: Path, text: str) -> float:
    """CLOCK_MONOTONIC (the proxy's clock) of the last log line holding ``text``."""
    import datetime
    import time

    line = [ln for ln in log.read_text().splitlines() if text in ln][-1]
    wall = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return wall - (time.time() - time.monotonic())


def test_a_named_namespace_is_read_while_the_mount_process_starts(
        net: NetProxy, seaweed_server: Any, tmp_path: Path) -> None:
    """``casfs run --namespace`` needs no probe of the job: the node's mount process it
    starts reads the namespace from the root (marker and LIST, the HEAD past the
    newest beside its record, its manifest beside its profile) while it imports what
    serving needs, not after the lease (casfs.node.preopen); each once. A node that
    has an index reads no record ahead: it may hold that generation already."""
    url = _url(net, tmp_path)
    _run(tmp_path, "writer", url, seaweed_server, "budget", sys.executable, "-c", WRITE_JOB,
         "3", "K")
    job = "import time; print(time.monotonic())"
    net.delay = 0.05  # 100 ms RTT: the reads take longer than the mount process's start
    rec1 = SharedRoot.open(url).generations().record("budget", 1)
    base = rec1.base.digest
    manifest = f"/objects/{base[:2]}/{base[2:]}"
    prof = str(rec1.options["profile"])
    for run in ("fresh", "warm"):
        net.reset_counts()
        r = _run(tmp_path, "node", url, seaweed_server, "budget", sys.executable, "-c", job)
        started = float(r.stdout.split()[-1])
        before = sorted((q for q in net.requests() if q.start < started), key=lambda q: q.start)
        paths = [(q.method, q.target.split("?")[0].split("/budget")[-1]) for q in before]
        lists = [q for q in before if "list-type=2" in q.target and "generations" in q.target]
        records = [p for p in paths if p[0] == "GET" and "/generations/" in p[1]]
        manifests = [p for p in paths if p[0] == "GET" and p[1].endswith(manifest)]
        assert len(lists) == 1 and len([p for p in paths if p[0] == "HEAD"]) == 1, paths
        assert len(records) == 1, paths  # (on the warm node: the prefetch's, for its profile)
        if run == "fresh":
            ready = _logged_at(tmp_path / "node" / "state" / "log" / "host.log",
                               "serving namespaces under")
            assert before[0].start < ready, (ready - before[0].start, paths)
            assert len(manifests) == 1, paths
            # Two at a time on the connections the marker and the LIST opened: the HEAD
            # past the listed newest beside that record's GET, then its manifest beside
            # its access profile (each was a round trip of its own).
            head = next(q for q in before if q.method == "HEAD")
            rec = next(q for q in before if q.method == "GET" and "/generations/" in q.target)
            man = next(q for q in before if q.target.split("?")[0].endswith(manifest))
            pro = next(q for q in before if q.target.split("?")[0].endswith(prof[2:]))
            # ... and before them the root's marker beside the LIST (one round trip).
            marker = next(q for q in before if q.target.split("?")[0].endswith("/casfs.json"))
            for a, b in ((marker, lists[0]), (head, rec), (man, pro)):
                assert a.end is not None and b.end is not None
                assert a.start < b.end and b.start < a.end, (a, b)
            # On the pool the marker and the LIST warmed: never both on new connections
            # (a second client, or none kept). One of the pair may find the pool one
            # short: the HTTP client returns a finished request's connection to its pool
            # from its own runtime thread, and on loaded cores that can lag the next
            # request by a moment (CI, 2 workers: the record's GET on a third connection).
            assert not (head.fresh and rec.fresh), (head, rec)
        else:
            assert manifests == [], paths  # the generation it served: nothing new to read


@pytest.mark.parametrize("node", ["cpu", "gpu"])
def test_an_auto_namespace_is_read_while_the_mount_process_starts_once_probed(
        net: NetProxy, seaweed_server: Any, tmp_path: Path, node: str) -> None:
    """``casfs run`` with an ``auto`` namespace (the default) probes the job's
    interpreter; from the second job on the node the probe's answer is kept, so the
    namespace is known before the mount process starts, which reads it ahead. On a GPU
    node (an nvidia-smi on PATH) its answer is kept too: asked by the first job only."""
    url = _url(net, tmp_path)
    net.delay = 0.05  # 100 ms RTT
    env = _env(tmp_path, "node", url, seaweed_server)
    calls = tmp_path / "nvidia-smi-calls"
    if node == "gpu":
        smi = tmp_path / "bin" / "nvidia-smi"
        smi.parent.mkdir()
        smi.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'NVIDIA H200, 9.0'\n")
        smi.chmod(0o755)
        env["PATH"] = f"{smi.parent}:{env['PATH']}"
    job = "import time; print(time.monotonic())"
    require_fuse()
    for run in ("probed", "kept"):
        net.reset_counts()
        r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family",
                            "triton", "--python", sys.executable, "--", sys.executable, "-c",
                            job], env=env, capture_output=True, text=True, timeout=600,
                           check=False)
        assert r.returncode == 0, r.stderr[-4000:]
        started = float(r.stdout.split()[-1])
        first = min((q for q in net.requests() if q.start < started), key=lambda q: q.start)
        ready = _logged_at(tmp_path / "node" / "state" / "log" / "host.log",
                           "serving namespaces under")
        if run == "kept":
            assert first.start < ready, (ready - first.start, first.target)
    if node == "gpu":
        assert len(calls.read_text().splitlines()) == 1


def test_a_first_attach_without_a_pre_open_reads_two_at_a_time(
        net: NetProxy, seaweed_server: Any, tmp_path: Path) -> None:
    """A namespace attached with nothing read ahead (an ``auto`` namespace's first job on
    a node, as casfsd's leases): the lower feed sends the HEAD past the listed newest
    beside that record's GET, and the record's access profile beside its manifest."""
    url = _url(net, tmp_path)
    require_fuse()
    job = [sys.executable, "-m", "casfs.cli.main", "run", "--family", "triton", "--python",
           sys.executable, "--", sys.executable, "-c"]
    w = subprocess.run([*job, WRITE_JOB, "3", "A"], env=_env(tmp_path, "writer", url,
                       seaweed_server), capture_output=True, text=True, timeout=600)
    assert w.returncode == 0, w.stderr[-4000:]
    net.delay = 0.05  # 100 ms RTT: what overlaps is plain to see
    net.reset_counts()
    r = subprocess.run([*job, "import time; print(time.monotonic())"],
                       env=_env(tmp_path, "fresh", url, seaweed_server), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    started = float(r.stdout.split()[-1])
    before = [q for q in net.requests() if q.start < started]
    gens = [q for q in before if "/generations/" in q.target.split("?")[0]]
    heads = [q for q in gens if q.method == "HEAD"]
    records = [q for q in gens if q.method == "GET"]
    assert len(heads) == 1 and len(records) == 1, [(q.method, q.target) for q in before]
    ns = records[0].target.split("/namespaces/")[1].split("/")[0]
    rec = SharedRoot.open(url).generations().record(ns, 1)
    prof, base = str(rec.options["profile"]), rec.base.digest
    man = next(q for q in before if q.target.split("?")[0].endswith(base[2:]))
    pro = next(q for q in before if q.target.split("?")[0].endswith(prof[2:]))
    for a, b in ((heads[0], records[0]), (man, pro)):
        assert a.end is not None and b.end is not None
        assert a.start < b.end and b.start < a.end, (a, b)


def test_a_short_jobs_release_cancels_the_prefetch(
        net: NetProxy, seaweed_server: Any, tmp_path: Path) -> None:
    """A job shorter than its namespace's whole prefetch: the release cancels the wave
    in the fetch worker (casfs.node.fetchproc "cancel"), so the root gets no more of
    its reads once the job has ended (it waited up to 5 s for them: hundreds of GETs
    after the job here); what it left out is no error, and the next job on the node
    reads every file right."""
    import hashlib

    url = _url(net, tmp_path)
    root = SharedRoot.open(url)
    entries, want = [], {}
    for i in range(1000):  # loose objects: a GET each, 32 in flight
        data = b"kernel %d " % i * (1 + i % 7)
        put = root.objects.put_bytes(data)
        path = f"K{i // 8:04d}/f{i % 8}.bin"
        entries.append(Entry(path, put.digest, put.size, 0o644, 1_700_000_000_000_000_000))
        want[path] = hashlib.sha256(data).hexdigest()
    root.generations().publish("budget", entries, node="elsewhere")
    net.delay = 0.05  # 100 ms RTT: the wave is ~3 s of reads, the job 0.3 s
    net.reset_counts()
    r = _run(tmp_path, "node", url, seaweed_server, "budget", sys.executable, "-c",
             "import time; time.sleep(0.3); print(time.monotonic())")
    ended = float(r.stdout.split()[-1])
    reads = [q for q in net.requests() if "/objects/" in q.target]
    after = [q for q in reads if q.start > ended]
    assert reads and len(after) <= 2 * 32, (len(reads), len(after))  # 32: PACK_GETS
    net.delay = 0.0
    r = _run(tmp_path, "node", url, seaweed_server, "budget", sys.executable, "-c", HASH_JOB)
    assert json.loads(r.stdout.strip().splitlines()[-1]) == want


def test_a_writing_jobs_release_reads_nothing_twice(
        net: NetProxy, seaweed_server: Any, tmp_path: Path) -> None:
    """A fresh node's job that compiles one new kernel: what the node sends once the job
    has ended (its release publishes the kernel) is a short list of round trips, the
    job's way out at 20 ms each: no record or manifest read twice, the newest generation
    listed once, no HEAD before a small object's PUT or of a pack this node just PUT, and
    no reads for serving the new generation (nothing is served after a release), no look
    for the newest generation the mount knows. It was 22 requests, 17 after the job here,
    with the base record read three times; then 12 with a LIST and a HEAD for the newest
    and the served record read by the worker."""
    url = _url(net, tmp_path)
    _run(tmp_path, "writer", url, seaweed_server, "budget", sys.executable, "-c", WRITE_JOB,
         "3", "A")
    net.reset_counts()
    # (The job compiles for a second first: the namespace's prefetch is done by then.)
    r = _run(tmp_path, "node", url, seaweed_server, "budget", sys.executable, "-c",
             "import time; time.sleep(1)\n" + WRITE_JOB + "\nprint(time.monotonic())",
             "1", "B")
    ended = float(r.stdout.split()[-1])
    after = [q for q in net.requests() if q.start > ended]
    assert SharedRoot.open(url).generations().latest_seq("budget") == 2  # published
    gets = [q.target for q in after if q.kind == "get"]
    assert len(gets) == len(set(gets)), gets
    # The newest generation is the one the mount found (its attach or refresh, sent to
    # the worker): no LIST and no HEAD for it (PUBLISH_FRESH; creating the record decides).
    looked = [q for q in after if q.kind in ("list", "head") and "generations" in q.target]
    assert not looked, [(q.kind, q.target) for q in after]
    # ... and the served generation's record is the mount's, sent along: not read again.
    assert not [q for q in after if q.kind == "get" and "/generations/" in q.target], \
        [(q.kind, q.target) for q in after]
    put = {q.target for q in after if q.kind == "put" and "/generations/" not in q.target}
    assert not [q for q in after if q.kind == "head" and q.target in put], \
        [(q.kind, q.target) for q in after]
    assert len(after) <= 9, [(q.kind, q.target[-50:]) for q in after]
