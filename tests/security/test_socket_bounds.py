"""Denial of service at casfsd's jobs socket (issue 21), with a real casfsd and real users.

The jobs socket is every local user's. Before:

- one lease could name any number of namespaces (300 took the shared mount
  process from 1% to 20% of a core, idle, and came back after a crash) and any
  pid as its holder (pid 1: served forever; another user's: that user's exit
  decides);
- every connection took a thread until it sent its request: 1,500 idle
  connections grew casfsd to 1,503 threads, and another tenant's ``casfs env``
  failed once.

Now (casfs.daemon.jobs, casfs.daemon.controlsock, casfs.node.bounds, ``[jobs]``):
per-tenant bounds on namespaces, leases and connections, refused with one line
to the client and a WARNING in casfsd's log that starts ``jobs socket: refused
tenant <tenant>``; a lease's holder is the caller or one of its own ancestors
or descendants in its tenant; an idle connection costs no thread and is closed
after ``request_timeout``. Each test below fails on the code before the change:
the refusals it expects were grants, and the thread count grew by one per
connection. The tests that expect casfsd's refusal warnings say so
(``expect_log``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from tests.daemon import conftest as daemon_conftest
from tests.daemon.conftest import Daemon
from tests.users import RealUser, open_tmp, real_users, user_python

pytestmark = [pytest.mark.fuse, pytest.mark.slow]

daemons = daemon_conftest.daemons  # the fixture: a real casfsd per test

FAST = {"stable_after": 0.2, "publish_interval": 0.5, "refresh_interval": 1.0}


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """Overrides pytest's (root-only 0700) so the users can reach the jobs socket."""
    with open_tmp() as d:
        yield d


def jobs_table(**bounds: Any) -> str:
    return "[jobs]\n" + "".join(f"{k} = {v!r}\n" for k, v in bounds.items())


def sock_of(d: Daemon) -> str:
    return str(d.state.parent / "mnt-base" / "casfsd.sock")


# A user's client: asks the jobs socket, prints each reply as one JSON line.
ASK = """
import json, os, sys
from casfs.node import control
S = os.environ["SOCK"]
def lease(names, pid=None, **kw):
    caches = [{"family": "generic", "namespace": n} for n in names]
    try:
        return control.request(S, "lease", timeout=120, caches=caches,
                               pid=pid or os.getpid(), **kw)
    except Exception as e:
        return {"ok": False, "error": "client: " + str(e)}
"""


def ask(user: RealUser, d: Daemon, body: str) -> dict[str, Any]:
    """Run ``body`` (which sets ``out``) as ``user``; its ``out``."""
    code = ASK + body + "\nprint(json.dumps(out))\n"
    r = user.python(code, env=user.env(SOCK=sock_of(d)), timeout=300)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def served(d: Daemon, tenant: str) -> set[str]:
    """Namespaces the node's mount process serves for ``tenant`` (root's status)."""
    rows = json.loads(d.cli("status", "--json").stdout)
    return {Path(r["path"]).name for r in rows
            if "path" in r and Path(r["path"]).parent.name == tenant}


def refused(reply: dict[str, Any], bound: str, tenant: str | None = None) -> None:
    assert not reply.get("ok"), reply
    err = str(reply.get("error"))
    assert bound in err and "\n" not in err, reply
    if tenant is not None:
        assert tenant in err, reply


def warned(d: Daemon, tenant: str, what: str) -> bool:
    """casfsd logged a WARNING refusing ``tenant`` for ``what``."""
    return any("WARNING" in ln and f"jobs socket: refused tenant {tenant}:" in ln and what in ln
               for ln in d.log().splitlines())


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def sockets(pid: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return n


# Holds N connections to the jobs socket, sending nothing. Prints, once connected and
# after a moment for casfsd to answer, how many were refused (a line naming the bound)
# and how many are still open; then, on "wait" from stdin, waits for casfsd to close
# the open ones and prints what they were told.
FLOOD = """
import json, os, select, socket, sys, time
S, N = os.environ["SOCK"], int(os.environ["N"])
socks = []
for _ in range(N):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(S)
    socks.append(s)
def answered(s, wait):
    p = select.poll()  # not select(): fds past 1024
    p.register(s, select.POLLIN)
    if not p.poll(wait * 1000):
        return None
    try:
        return s.recv(65536).decode()
    except OSError as e:
        return "error: " + str(e)
time.sleep(float(os.environ.get("SETTLE", "1")))
told = [answered(s, 0) for s in socks]
stable = 0
while stable < 4:  # until no more answers come for 2 s: casfsd has caught up
    time.sleep(0.5)
    more = [t if t is not None else answered(s, 0) for s, t in zip(socks, told)]
    stable = stable + 1 if sum(t is None for t in more) == sum(t is None for t in told) else 0
    told = more
print(json.dumps({"refused": [t for t in told if t is not None],
                  "open": sum(t is None for t in told)}), flush=True)
sys.stdin.readline()
late = [answered(s, 60) for s, t in zip(socks, told) if t is None]
print(json.dumps({"late": late}), flush=True)
sys.stdin.readline()
"""


class Flood:
    def __init__(self, user: RealUser, d: Daemon, n: int, settle: float = 1.0) -> None:
        py, _ = user_python()
        self.proc = user.popen([py, "-c", FLOOD], stdin=subprocess.PIPE,
                               env=user.env(SOCK=sock_of(d), N=str(n), SETTLE=str(settle)))

    def line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        out = self.proc.stdout.readline()
        if not out:
            raise AssertionError(f"flood failed: {self.proc.stderr.read()}")  # type: ignore[union-attr]
        return dict(json.loads(out))

    def tell(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def casfs_env(user: RealUser, d: Daemon) -> str:
    """``casfs env`` as ``user`` through the jobs socket; the cache dir it got."""
    py, _ = user_python()
    env = user.env(CASFS_SOCKET=sock_of(d), CASFS_ROOT=str(d.root),
                   CASFS_STATE_DIR=str(user.home / "state"), CASFS_BUILD_KEY="victim",
                   CASFS_LEASE_TIMEOUT="60")
    r = user.run(["/bin/sh", "-c", f'eval "$({py} -m casfs.cli.main env --family generic)"'
                  ' && echo "$CASFS_CACHE_DIR"'], env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip(), (r.stdout, r.stderr)
    return r.stdout.strip()


def test_idle_connections_cost_no_thread_and_another_tenant_still_leases(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    """1,500 idle connections (bounds set above them, so all are admitted): casfsd's
    thread count stays within a small constant, and another tenant's ``casfs env``
    gets its lease meanwhile. Before: one thread per connection (1,500 more)."""
    d = daemons("a", [], defaults=FAST, node={"lease_grace": 0.5},
                extra=jobs_table(connections=4000, connections_per_tenant=3000,
                                 request_timeout=300.0))
    assert d.proc is not None
    pid = d.proc.pid
    with real_users(2, tmp_path) as (attacker, victim):
        before_threads, before_socks = threads(pid), sockets(pid)
        flood = Flood(attacker, d, 1500, settle=0.5)
        try:
            first = flood.line()
            assert first["open"] == 1500 and not first["refused"], first
            # casfsd has accepted them all (each is a socket it holds)...
            wait_until(lambda: sockets(pid) >= before_socks + 1500,
                       "casfsd accepting 1,500 connections", proc=flood.proc)
            # ...without a thread each.
            assert threads(pid) <= before_threads + 2, (before_threads, threads(pid))
            t0 = time.monotonic()
            path = casfs_env(victim, d)
            assert Path(path).parent.name == victim.tenant
            assert time.monotonic() - t0 < 60
            # Answering the lease took a worker or two, not one per connection.
            assert threads(pid) <= before_threads + 4, (before_threads, threads(pid))
        finally:
            flood.stop()


@pytest.mark.expect_log(r"jobs socket: refused tenant u\d+: tenant u\d+ has 8 connections open",
                        r"jobs socket: refused tenant u\d+: no request within 15s")
def test_connections_are_bounded_per_tenant_and_idle_ones_closed(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    """A tenant's connections beyond ``connections_per_tenant`` are refused with one
    line (and a WARNING naming the tenant); those it keeps open sending nothing are
    closed after ``request_timeout``; another tenant leases throughout."""
    d = daemons("a", [], defaults=FAST, node={"lease_grace": 0.5},
                extra=jobs_table(connections_per_tenant=8, request_timeout=15.0))
    with real_users(2, tmp_path) as (attacker, victim):
        flood = Flood(attacker, d, 1500)
        try:
            first = flood.line()
            assert first["open"] == 8, first["open"]
            assert len(first["refused"]) == 1492
            assert all("connections_per_tenant" in t and attacker.tenant in t
                       for t in first["refused"]), first["refused"][:3]
            wait_until(lambda: warned(d, attacker.tenant, "connections_per_tenant"),
                       "casfsd's warning naming the flooding tenant")
            # The other tenant is not refused: it has its own bound.
            assert Path(casfs_env(victim, d)).parent.name == victim.tenant
            # The 8 idle ones are closed after request_timeout, with a line saying so.
            flood.tell()
            late = flood.line()["late"]
            assert len(late) == 8 and all(t and "no request within" in t for t in late), late
            wait_until(lambda: warned(d, attacker.tenant, "no request within"),
                       "casfsd's warning about the idle connections")
            # The bound counts open connections only: the attacker may lease again.
            r = ask(attacker, d, 'out = lease(["mine"])')
            assert r.get("ok"), r
        finally:
            flood.stop()
    # A flood logs a line now and then, not one per refused connection.
    assert sum("connections_per_tenant" in ln for ln in d.log().splitlines()) < 10


@pytest.mark.expect_log(
    r"jobs socket: refused tenant u\d+: .*\(jobs\.(namespaces|leases)_per_tenant")
def test_leases_and_namespaces_are_bounded_per_tenant(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    """A lease naming 300 namespaces is refused (before: granted, 300 namespaces
    served by the shared mount process); so are namespaces and leases beyond the
    tenant's bounds, while another tenant is served."""
    d = daemons("a", [], defaults=FAST, node={"lease_grace": 0.5},
                extra=jobs_table(namespaces_per_tenant=4, leases_per_tenant=3))
    with real_users(2, tmp_path) as (u1, u2):
        out = ask(u1, d, """
out = {}
out["flood"] = lease([f"flood-{i}" for i in range(300)])
out["three"] = lease(["a", "b", "c"])
out["two_more"] = lease(["d", "e"])   # 3 + 2 > 4
out["one_more"] = lease(["a", "d"])   # 4: at the bound
out["fifth"] = lease(["e"])
out["third_lease"] = lease(["b"])     # leases: three, one_more, this one
out["fourth_lease"] = lease(["c"])
""")
        refused(out["flood"], "namespaces_per_tenant", u1.tenant)
        assert out["three"]["ok"], out["three"]
        refused(out["two_more"], "namespaces_per_tenant", u1.tenant)
        assert out["one_more"]["ok"], out["one_more"]
        refused(out["fifth"], "namespaces_per_tenant", u1.tenant)
        assert out["third_lease"]["ok"], out["third_lease"]
        refused(out["fourth_lease"], "leases_per_tenant", u1.tenant)
        for what in ("names 300 namespaces", "namespaces_per_tenant", "leases_per_tenant"):
            assert warned(d, u1.tenant, what), what
        # Never more than 4 of u1's namespaces were served (the 300 never were).
        assert len(served(d, u1.tenant)) <= 4
        assert not any(n.startswith("flood-") for n in served(d, u1.tenant))
        # The other tenant has bounds of its own.
        r = ask(u2, d, 'out = lease(["a", "b", "c", "d"])')
        assert r.get("ok"), r


@pytest.mark.expect_log(
    r"jobs socket: refused tenant u\d+: (process \d+ may not hold this lease|no such process)")
def test_a_lease_is_held_only_by_the_callers_own_process(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    """The holder named in a lease: the caller, its ancestors or descendants of its
    uid and tenant (what ``casfs run`` and ``casfs env`` name) are accepted; another
    user's process, pid 1, root's ancestor of the caller and an unrelated process of
    the same user are refused. Before: any live pid was accepted."""
    d = daemons("a", [], defaults=FAST, node={"lease_grace": 0.5})
    with real_users(2, tmp_path) as (u1, u2):
        theirs = subprocess.Popen(u2.argv(["sleep", "600"]))
        stray = subprocess.Popen(u1.argv(["sleep", "600"]))
        try:
            wait_until(lambda: _uid_of(theirs.pid) == u2.uid and _uid_of(stray.pid) == u1.uid,
                       "the sleepers running as their users")
            out = ask(u1, d, f"""
import subprocess
out = {{}}
out["other_user"] = lease(["x"], pid={theirs.pid})
out["init"] = lease(["x"], pid=1)
out["root_parent"] = lease(["x"], pid=os.getppid())  # pytest's setpriv: root
out["stray"] = lease(["x"], pid={stray.pid})        # u1's, not in the caller's tree
out["gone"] = lease(["x"], pid=999999)
child = subprocess.Popen(["sleep", "600"])
out["child"] = lease(["x"], pid=child.pid)           # casfs run's job
out["self"] = lease(["x"])                           # casfs run itself
child.kill()
""")
            for k in ("other_user", "init", "root_parent", "stray", "gone"):
                assert not out[k].get("ok"), (k, out[k])
                assert "\n" not in out[k]["error"]
            assert "caller's uid" in out["other_user"]["error"]
            assert "caller's uid" in out["init"]["error"]
            assert "caller's uid" in out["root_parent"]["error"]
            assert "ancestors or descendants" in out["stray"]["error"]
            assert "no such process" in out["gone"]["error"]
            assert out["child"]["ok"] and out["self"]["ok"], out
            assert warned(d, u1.tenant, "may not hold this lease")
            # A process already gone holds nothing: said at INFO, not as a WARNING
            # (a very short job's casfs run names it after it ended).
            gone = [ln for ln in d.log().splitlines() if "hold the lease: 999999" in ln]
            assert gone and all("INFO" in ln and "WARNING" not in ln for ln in gone), gone
            # casfs env names the shell that runs it (its parent): accepted.
            assert Path(casfs_env(u1, d)).parent.name == u1.tenant
        finally:
            for p in (theirs, stray):
                p.kill()
                p.wait()


def _uid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def test_one_tenants_slow_requests_never_take_every_worker(tmp_path: Path) -> None:
    """In process: a tenant with many requests stuck in the handler has at most
    ``requests_per_tenant`` of them answered at once; another tenant's request is
    answered meanwhile, and its own wait their turn (none is dropped)."""
    import sys
    import threading

    from casfs.daemon.controlsock import ControlServer, ServerLimits
    from casfs.node import control

    release = threading.Event()
    lock = threading.Lock()
    running = {"now": 0, "most": 0}

    def handler(req: dict[str, Any]) -> dict[str, Any]:
        if req.get("slow"):
            with lock:
                running["now"] += 1
                running["most"] = max(running["most"], running["now"])
            release.wait(60)
            with lock:
                running["now"] -= 1
        return {"ok": True}

    me = os.getpid()
    path = tmp_path / "jobs.sock"
    srv = ControlServer(path, handler, public=True, name="test-jobs",
                        limits=ServerLimits(workers=4, requests_per_tenant=2,
                                            request_timeout=30),
                        tenant_of=lambda p: "slow" if p and p["pid"] == me else "fast")
    replies: list[dict[str, Any]] = []
    slow = [threading.Thread(target=lambda: replies.append(
        control.request(path, "x", timeout=60, slow=True))) for _ in range(6)]
    try:
        for t in slow:
            t.start()
        wait_until(lambda: running["now"] == 2, "two of the slow tenant's requests running")
        r = subprocess.run([sys.executable, "-c", "import sys; from casfs.node import control;"
                            f" print(control.request({str(path)!r}, 'x', timeout=30))"],
                           capture_output=True, text=True, timeout=60)
        assert "'ok': True" in r.stdout, (r.stdout, r.stderr)  # another pid: "fast"
        assert running["most"] == 2
    finally:
        release.set()
        for t in slow:
            t.join(60)
        srv.close()
    assert len(replies) == 6 and all(x["ok"] for x in replies)
