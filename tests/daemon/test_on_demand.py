"""casfsd serves the namespaces jobs ask for: ``casfs env`` against a real daemon.

Two jobs with different stacks (different keys) get different directories, two
jobs of one stack share one, a namespace is released (published first) once
its last job is gone, and the configured mounts keep working beside them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from waiting import wait_until

from .conftest import Daemon

pytestmark = [pytest.mark.fuse, pytest.mark.slow]

FAST = {"stable_after": 0.2, "publish_interval": 0.5, "refresh_interval": 1.0}
JOB = ('eval "$(casfs env --family generic)" && echo "$CASFS_CACHE_DIR" && '
       'echo "$CASFS_LEASE" && echo "from $BUILD" > "$CASFS_CACHE_DIR/$BUILD" && exec sleep 600')


def start_job(d: Daemon, build_key: str) -> tuple[subprocess.Popen[str], Path]:
    env = dict(d.env(), CASFS_BUILD_KEY=build_key, BUILD=build_key,
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    p = subprocess.Popen(["sh", "-c", JOB], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    path = Path(p.stdout.readline().strip())
    assert p.stdout.readline().strip(), "no lease"
    return p, path


def host_status(d: Daemon) -> dict[str, dict[str, object]]:
    st = d.cli("status", "--json")
    return {r["path"]: r for r in json.loads(st.stdout) if "path" in r}


def test_jobs_get_their_own_namespaces_from_the_daemon(daemons: Callable[..., Daemon]) -> None:
    d = daemons("a", [{"name": "kern", "family": "generic", "namespace": "kern-test"}],
                defaults=FAST, node={"lease_grace": 0.5})
    jobs = []
    try:
        j1, p1 = start_job(d, "stack-1")
        j2, p2 = start_job(d, "stack-2")
        j3, p3 = start_job(d, "stack-1")
        jobs = [j1, j2, j3]
        assert p1 != p2 and p1 == p3  # different keys: different namespaces; same: shared
        base = d.state.parent / "mnt-base" / "ns" / f"u{os.geteuid()}"
        assert p1.parent == base and p2.parent == base
        assert sorted(os.listdir(p1)) == ["stack-1"] and os.listdir(p2) == ["stack-2"]
        assert os.stat(p1).st_dev == os.stat(p2).st_dev  # one mount process, one session
        # The configured mount keeps working beside them.
        kern = Path(d.mount_paths[0])
        (kern / "static").write_text("still here")
        wait_until(lambda: "static" in d.published("kern-test"), "the static mount's publication")

        ns1, ns2 = p1.name, p2.name
        j2.send_signal(signal.SIGKILL)
        j2.wait()
        wait_until(lambda: str(p2) not in host_status(d), "stack-2's release after its job")
        assert d.published(ns2) == {"stack-2"}  # published before it was released
        assert str(p1) in host_status(d)  # stack-1 still has two jobs
        j1.send_signal(signal.SIGKILL)
        j1.wait()
        wait_until(lambda: host_status(d)[str(p1)]["holders"] == [j3.pid],
                   "the lease of the job that left to go")
        j3.send_signal(signal.SIGKILL)
        j3.wait()
        wait_until(lambda: not host_status(d), "stack-1's release after its last job")
        assert d.published(ns1) == {"stack-1"}
    finally:
        for j in jobs:
            if j.poll() is None:
                j.kill()
                j.wait()
    assert d.terminate() == 0


def test_leases_of_one_namespace_at_once_all_get_it(daemons: Callable[..., Daemon]) -> None:
    """Several jobs asking for the same new namespace at the same moment: the first
    attaches it, the others wait for that attach (was: TypeError from treating the
    pending attach's trio.Event as a bool, and those jobs got private caches)."""
    d = daemons("a", [{"name": "kern", "family": "generic", "namespace": "kern-test"}],
                defaults=FAST)
    import threading

    from casfs.node import control

    sock = next(Path(m["socket"]) for m in control.registered(d.state / "run")
                if m.get("host"))
    go = threading.Barrier(6)
    replies: list[dict[str, object]] = []

    def ask() -> None:
        go.wait()
        replies.append(control.request(sock, "lease", timeout=120, pid=os.getpid(),
                                       caches=[{"family": "generic", "namespace": "same"}]))

    threads = [threading.Thread(target=ask) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [r.get("ok") for r in replies] == [True] * 6, replies
    assert len({c["path"] for r in replies for c in r["caches"]}) == 1  # type: ignore[attr-defined]
