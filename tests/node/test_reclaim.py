"""Node state of namespaces idle for a while is reclaimed; unpublished files go out first."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from casfs.index.node_index import NodeIndex
from casfs.node import control
from casfs.node.host import spawn_host

from .test_host import UID, casfs, end, host_cfg, published, sleeper

pytestmark = [pytest.mark.fuse]


def namespaces_upper(node: dict[str, Any]) -> list[Path]:
    return sorted(p for p in (node["state"] / "upper").iterdir() if not p.name.startswith("."))


def run_job(node: dict[str, Any], ns: str, script: str) -> None:
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
                        "-n", ns, "--stable-after", "0.2", "--", sys.executable, "-c", script],
                       env=node["env"], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr


def reclaim(node: dict[str, Any]) -> list[dict[str, Any]]:
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "reclaim", "--idle", "0",
                        "--json"], env=node["env"], capture_output=True, text=True, timeout=120,
                       check=False)
    return list(json.loads(r.stdout))


def test_idle_namespace_is_published_then_reclaimed(node: dict[str, Any]) -> None:
    write = "import os; open(os.environ['CASFS_CACHE_DIR'] + '/a', 'w').write('A')"
    run_job(node, "old", write)
    uppers = namespaces_upper(node)
    assert len(uppers) == 1 and (uppers[0] / "a").exists()
    store_ns = uppers[0].name
    # A file the mount never published (its process died first, say).
    (uppers[0] / "b").write_text("B")
    # A namespace in use right now is not touched.
    busy = casfs(node, "run", "--family", "generic", "-n", "busy", "--", sys.executable, "-c",
                 "import os, time\n"
                 "open(os.environ['CASFS_CACHE_DIR'] + '/x', 'w').write('x')\n"
                 "time.sleep(600)")
    # Its job's file, not just its upper: the job writes once its lease is granted, so
    # the namespace is recorded as served by then (reclaim lists it, in use).
    wait_until(lambda: any((p / "x").exists() for p in namespaces_upper(node)),
               "the busy namespace's job writing")

    out = {r["namespace"]: r for r in reclaim(node)}
    assert out[store_ns]["reclaimed"] and out[store_ns]["published"] == 1
    busy_ns = next(k for k in out if k != store_ns)
    assert not out[busy_ns]["reclaimed"] and "in use" in out[busy_ns]["why"]
    assert published(node["root"], store_ns) == {"a": b"A", "b": b"B"}  # nothing lost
    assert not uppers[0].exists()
    with NodeIndex.open(node["state"]) as idx:
        assert idx.ns_state(store_ns) is None
        assert idx.count_pending(store_ns) == 0
    busy.kill()
    busy.wait()

    # Served again later: restored from the root, lazily, as on a fresh node.
    run_job(node, "old", "import os; d = os.environ['CASFS_CACHE_DIR'];"
            " assert open(d + '/a').read() == 'A' and open(d + '/b').read() == 'B'")


# the test makes the shared root a regular file
@pytest.mark.expect_log(r"shared root unavailable, serving local state only: .*Not a directory")
def test_unpublishable_content_keeps_the_state(node: dict[str, Any], tmp_path: Path) -> None:
    run_job(node, "kept", "import os; open(os.environ['CASFS_CACHE_DIR'] + '/a', 'w').write('A')")
    upper = namespaces_upper(node)[0]
    (upper / "b").write_text("B")
    node["root"].rename(tmp_path / "root-away")  # the shared root is unusable
    node["root"].write_text("not a root")
    try:
        out = reclaim(node)
    finally:
        node["root"].unlink()
        (tmp_path / "root-away").rename(node["root"])
    assert len(out) == 1 and not out[0]["reclaimed"]
    assert (upper / "b").read_text() == "B"  # kept for the next round


def held(path: Path) -> bool:
    """Someone holds a flock on ``path`` (a mount waiting for the namespace: ``.wanted``)."""
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@pytest.mark.parametrize("step", ["reclaim-locked", "reclaim-published", "reclaim-dropped"])
def test_casfs_run_attaching_during_reclaim(node: dict[str, Any], step: str) -> None:
    """A job's `casfs run` attaches the namespace while `casfs reclaim` of it is at ``step``
    (CASFS_PAUSEPOINT): the attach waits for the reclaim instead of being refused (it
    was: the job got a private, empty cache and its files were never published). I1/I2:
    the job sees every file, the one the reclaim had still to publish included. Nothing
    is lost: that file and the job's are published. I4: neither side hangs."""
    write = "import os; open(os.environ['CASFS_CACHE_DIR'] + '/a', 'w').write('A')"
    run_job(node, "racy", write)
    upper = namespaces_upper(node)[0]
    store_ns = upper.name
    (upper / "b").write_text("B")  # not published yet: the reclaim publishes it first
    go = node["tmp"] / "go"
    env = dict(node["env"], CASFS_PAUSEPOINT=step, CASFS_PAUSEPOINT_FILE=str(go),
               CASFS_PAUSEPOINT_MAX="60")
    rec = subprocess.Popen([sys.executable, "-m", "casfs.cli.main", "reclaim", "--idle", "0",
                            "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    node["procs"].append(rec)
    wait_until(lambda: Path(str(go) + ".reached").exists(), f"the reclaim at {step}", proc=rec)

    job = casfs(node, "run", "--family", "generic", "-n", "racy", "--stable-after", "0.2",
                "--", sys.executable, "-c",
                "import os; d = os.environ['CASFS_CACHE_DIR']\n"
                "assert open(d + '/a').read() == 'A', 'a'\n"
                "assert open(d + '/b').read() == 'B', 'b'\n"
                "open(d + '/c', 'w').write('C')")
    wait_until(lambda: any(held(p) for p in (node["state"] / "run").glob("ns-*.wanted")),
               "the attach waiting for the reclaim", proc=job)
    go.touch()
    out, err = rec.communicate(timeout=120)
    (r,) = json.loads(out)
    # Paused before the drop, the reclaim leaves the namespace to the waiting job;
    # once it has dropped the index, it finishes and the job starts as on a fresh node.
    assert r["reclaimed"] == (step == "reclaim-dropped"), (r, err)
    _, jerr = job.communicate(timeout=120)
    assert job.returncode == 0, jerr
    assert b"private and temporary" not in jerr, jerr
    assert published(node["root"], store_ns) == {"a": b"A", "b": b"B", "c": b"C"}


def test_served_again_after_the_listing_is_kept(node: dict[str, Any]) -> None:
    """A job's mount comes and goes between reclaim finding the namespace idle and taking
    its lock (CASFS_PAUSEPOINT=reclaim-listed): it is no longer idle, its state stays
    (was: dropped right after the job, the next one starting cold)."""
    run_job(node, "again", "import os; open(os.environ['CASFS_CACHE_DIR'] + '/a', 'w')"
            ".write('A')")
    upper = namespaces_upper(node)[0]
    go = node["tmp"] / "go"
    env = dict(node["env"], CASFS_PAUSEPOINT="reclaim-listed", CASFS_PAUSEPOINT_FILE=str(go),
               CASFS_PAUSEPOINT_MAX="60")
    rec = subprocess.Popen([sys.executable, "-m", "casfs.cli.main", "reclaim", "--idle", "0",
                            "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    node["procs"].append(rec)
    wait_until(lambda: Path(str(go) + ".reached").exists(), "the reclaim listing", proc=rec)
    run_job(node, "again", "import os; d = os.environ['CASFS_CACHE_DIR'];"
            " assert open(d + '/a').read() == 'A'; open(d + '/b', 'w').write('B')")
    go.touch()
    out, err = rec.communicate(timeout=120)
    (r,) = json.loads(out)
    assert not r["reclaimed"] and "served again" in r["why"], (r, err)
    assert (upper / "a").exists() and (upper / "b").exists()
    with NodeIndex.open(node["state"]) as idx:
        assert idx.ns_state(upper.name) is not None
    assert published(node["root"], upper.name) == {"a": b"A", "b": b"B"}


def test_lease_during_the_hosts_own_reclaim(node: dict[str, Any],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The node's mount process reclaims idle namespaces itself (``reclaim_after``, in a
    thread); a lease for one arriving while that reclaim holds its lock
    (CASFS_PAUSEPOINT=reclaim-locked) waits for it and is served every file (I1, I2),
    the upper file not published yet included; nothing is lost, nothing hangs (I4)."""
    go = node["tmp"] / "go"
    monkeypatch.setenv("CASFS_PAUSEPOINT", "reclaim-locked")
    monkeypatch.setenv("CASFS_PAUSEPOINT_FILE", str(go))
    monkeypatch.setenv("CASFS_PAUSEPOINT_MAX", "60")
    w = spawn_host(host_cfg(node, exit_when_idle=False, reclaim_after=1.0),
                   log_to_stderr=True)
    sock = w.cfg.socket_path
    jobs = []
    try:
        jobs.append(sleeper())
        r = control.request(sock, "lease", pid=jobs[-1].pid,
                            caches=[{"family": "generic", "namespace": "gamma"}])
        path = Path(r["caches"][0]["path"])
        (path / "a").write_bytes(b"A")
        end(jobs[-1])
        wait_until(lambda: "gamma" not in os.listdir(node["base"] / UID), "gamma's release")
        upper = namespaces_upper(node)[0]
        (upper / "b").write_bytes(b"B")  # left unpublished (a mount that died, say)
        wait_until(lambda: Path(str(go) + ".reached").exists(), "the host's reclaim of gamma",
                   proc=w.proc)

        jobs.append(sleeper())
        reply: dict[str, Any] = {}

        def lease() -> None:
            reply.update(control.request(sock, "lease", pid=jobs[-1].pid,
                                         caches=[{"family": "generic", "namespace": "gamma"}]))

        t = threading.Thread(target=lease, daemon=True)
        t.start()
        wait_until(lambda: any(held(p) for p in (node["state"] / "run").glob("ns-*.wanted")),
                   "the lease waiting for the reclaim", proc=w.proc)
        assert t.is_alive()  # not refused
        go.touch()
        t.join(timeout=90)
        assert not t.is_alive() and reply.get("ok"), reply
        assert (path / "a").read_bytes() == b"A" and (path / "b").read_bytes() == b"B"
        end(jobs[-1])
        # The release publishes b (the mount promoted it at start: the reclaim let it in
        # before publishing anything).
        wait_until(lambda: published(node["root"], upper.name) == {"a": b"A", "b": b"B"},
                   "gamma's release publishing b", proc=w.proc)
        assert w.proc.poll() is None
    finally:
        for j in jobs:
            j.kill()
        w.stop()
