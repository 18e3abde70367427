"""A job asking for its lease while casfsd restarts waits for it, and gets the lease.

A review (stop 55) ran 12 `casfs env` loops through the jobs socket across two
SIGUSR2 re-executions: 9 of 72 failed ("no casfs mount process serves this
node", exit 7), each such job then running uncached. casfsd unlinked its
sockets on the way out and the next one bound them seconds later (2-6 s with
handovers). Now a restarting casfsd leaves its sockets (refusing meanwhile), a
new one renames its own over them, and the client waits for a refusing one.
A real user, a real casfsd re-executed twice, then killed and started again 5 s
later as systemd would, while jobs ask.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.daemon import conftest as daemon_conftest
from tests.daemon.conftest import Daemon
from tests.users import RealUser, open_tmp, real_users, user_python

pytestmark = [pytest.mark.fuse, pytest.mark.slow]

daemons = daemon_conftest.daemons


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """Overrides pytest's (root-only 0700) so the user can reach the jobs socket."""
    with open_tmp() as d:
        yield d


def _ask_for_leases(user: RealUser, d: Daemon, stop: threading.Event,
                    results: list[tuple[int, str]]) -> None:
    py, _ = user_python()
    env = user.env(CASFS_SOCKET=str(d.state.parent / "mnt-base" / "casfsd.sock"),
                   CASFS_ROOT=str(d.root), CASFS_STATE_DIR=str(user.home / "state"),
                   CASFS_BUILD_KEY="restart", CASFS_LEASE_TIMEOUT="60")
    while not stop.is_set():
        # the lease's holder is the job's shell, the caller's parent (as a TaskProlog's)
        r = user.run(["/bin/sh", "-c", f"{py} -m casfs.cli.main env --family generic"],
                     env=env, timeout=120)
        results.append((r.returncode, r.stderr.strip()[-300:]))


@pytest.mark.parametrize("mark", ["none", "fresh", "stale", "ahead"])
def test_a_dead_casfsd_is_waited_for_only_while_its_mark_is_fresh(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mark: str) -> None:
    """A socket a casfsd left (kill -9, an exit for a restart) refuses: beside a fresh
    alive mark the lease waits for the next casfsd, once; with no mark (stopped), one
    older than 2 minutes (dead for good) or one dated ahead of the clock (a clock
    stepped back), the job is told at once (a review: the first form made a dead
    casfsd cost `casfs run` 40 s, once per start try)."""
    from casfs.errors import DaemonUnavailableError
    from casfs.node import client, control

    sock = tmp_path / "casfsd.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(sock))
    s.close()  # what kill -9 leaves: the path, nobody listening
    if mark != "none":
        alive = control.alive_mark(sock)
        alive.write_text("1 0\n")
        t = time.time() + {"fresh": -20, "stale": -300, "ahead": 3600}[mark]
        os.utime(alive, (t, t))
    monkeypatch.setenv("CASFS_SOCKET", str(sock))
    monkeypatch.setattr(client, "RESTART_WAIT", 1.5)
    t0 = time.monotonic()
    with pytest.raises(DaemonUnavailableError):
        client.lease(tmp_path / "state", [], os.getpid(), timeout=30)
    waited = time.monotonic() - t0
    assert (1.5 <= waited < 3.0) if mark == "fresh" else waited < 1.0, waited


def test_jobs_asking_during_restarts_get_their_leases(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    d = daemons("a", [], node={"lease_grace": 5})
    assert d.proc is not None and d.notify is not None
    with real_users(1, tmp_path) as (user,):
        stop = threading.Event()
        results: list[tuple[int, str]] = []
        askers = [threading.Thread(target=_ask_for_leases, args=(user, d, stop, results))
                  for _ in range(3)]
        for t in askers:
            t.start()
        try:
            time.sleep(3)
            for _ in range(2):  # re-executions (kill -USR2, an upgrade in place)
                d.notify.messages.clear()
                d.proc.send_signal(signal.SIGUSR2)
                d.notify.wait_for("READY", "1", proc=d.proc)
                time.sleep(2)
            d.proc.kill()  # a crash: systemd starts it again 5 s later (RestartSec)
            d.proc.wait(30)
            time.sleep(5)
            d.start()
            time.sleep(3)
        finally:
            stop.set()
            for t in askers:
                t.join(180)
    failed = [r for r in results if r[0] != 0]
    assert len(results) >= 6 and not failed, (len(results), failed)
