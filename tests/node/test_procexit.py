"""casfs.node.procexit: how a process ended, from the kernel's process connector
(issue 21: a ``casfs env`` job killed mid-write must not publish its torn files).

Real processes, the real connector (the tests run as root): a child killed with
SIGKILL is seen killed by SIGKILL, one exiting 0 exits cleanly, a shell whose
job was killed (exit 137) counts as killed; the BPF filter lets through only the
watched pids; without the connector (a network namespace has none) every verdict
is unknown, which counts as killed."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from waiting import wait_until

from casfs.node import procexit

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the process connector needs root")


@pytest.fixture
def watch() -> Iterator[procexit.ExitWatch]:
    w = procexit.ExitWatch()
    assert w.start(), w.unavailable
    yield w
    w.stop()


def test_a_sigkilled_child_is_seen_killed_and_a_clean_exit_clean(
        watch: procexit.ExitWatch) -> None:
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    clean = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.5)"])
    failed = subprocess.Popen(["sh", "-c", "sleep 0.5; exit 3"])
    shell = subprocess.Popen(["sh", "-c", "sleep 0.5; exit 137"])  # its job was SIGKILLed
    procs = (killed, clean, failed, shell)
    watch.watch(p.pid for p in procs)
    before = time.monotonic()
    killed.kill()
    for p in procs:
        p.wait()
    after = time.monotonic()

    ex = watch.exit_of(killed.pid, wait=5.0)
    assert ex is not None and ex.signal == signal.SIGKILL and ex.killed, ex
    assert ex.describe() == "killed by SIGKILL"
    assert before <= ex.at <= after  # the kernel's CLOCK_MONOTONIC: time.monotonic()'s
    assert watch.verdict(killed.pid) == (True, ex)

    ex = watch.exit_of(clean.pid, wait=5.0)
    assert ex is not None and ex.signal is None and ex.code == 0 and not ex.killed, ex
    assert watch.verdict(clean.pid) == (False, ex)
    ex = watch.exit_of(failed.pid, wait=5.0)
    assert ex is not None and ex.code == 3 and not ex.killed  # failed, not torn
    ex = watch.exit_of(shell.pid, wait=5.0)
    assert ex is not None and ex.code == 137 and ex.killed


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGSEGV])
def test_other_fatal_signals_are_killed(watch: procexit.ExitWatch, sig: int) -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    watch.watch([p.pid])
    time.sleep(0.3)  # its interpreter started: SIGSEGV is not python's to handle yet
    p.send_signal(sig)
    p.wait()
    ex = watch.exit_of(p.pid, wait=5.0)
    assert ex is not None and ex.signal == sig and ex.killed


def test_only_watched_pids_and_whole_processes_pass_the_filter(
        watch: procexit.ExitWatch) -> None:
    watched = subprocess.Popen(["sleep", "600"])
    other = subprocess.Popen(["sleep", "600"])
    # A thread exiting in a watched process is not the process exiting.
    threads = subprocess.Popen([sys.executable, "-c",
                                "import threading, time\n"
                                "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
                                "print('joined', flush=True); time.sleep(600)\n"],
                               stdout=subprocess.PIPE, text=True)
    watch.watch([watched.pid, threads.pid])
    try:
        assert threads.stdout is not None and threads.stdout.readline() == "joined\n"
        other.kill()
        other.wait()
        watched.kill()
        watched.wait()
        assert watch.exit_of(watched.pid, wait=5.0) is not None
        time.sleep(0.2)
        assert watch.exit_of(other.pid) is None  # filtered out by the kernel
        assert watch.exit_of(threads.pid) is None  # only a thread of it ended
    finally:
        threads.kill()
        threads.wait()
    assert watch.exit_of(threads.pid, wait=5.0) is not None


def test_a_pid_watched_again_forgets_its_earlier_process(watch: procexit.ExitWatch) -> None:
    p = subprocess.Popen(["sleep", "0.3"])
    watch.watch([p.pid])  # while it lives (a pid watched once dead is never heard of)
    p.wait()
    assert watch.exit_of(p.pid, wait=5.0) is not None
    watch.watch([])
    assert watch.exit_of(p.pid) is not None  # kept: a lease may still ask
    watch.watch([p.pid])  # as a new holder with that pid, alive now
    assert watch.exit_of(p.pid) is None


def test_the_filter_program_past_its_size_lets_every_exit_through() -> None:
    few = procexit.program(range(1000, 1010))
    many = procexit.program(range(1000, 1000 + procexit.MAX_FILTERED + 1))
    assert len(few) == 9 + 1 + 10 + 2
    assert len(many) == 12  # every process's exit; the reader keeps a bounded map
    assert all(jt <= 255 and jf <= 255
               for _, jt, jf, _ in procexit.program(range(procexit.MAX_FILTERED)))


def test_the_map_of_exits_is_bounded() -> None:
    w = procexit.ExitWatch(keep=3)
    for pid in range(10):
        w._record(procexit.Exit(pid, 0, time.monotonic()))
    assert sorted(w._exits) == [7, 8, 9]


def test_unknown_counts_as_killed_and_is_told_once(caplog: pytest.LogCaptureFixture) -> None:
    # The connector lives in the first network namespace only: a process in another has
    # none (the same verdict as a kernel without it, or one refusing a non-root caller);
    # one in a pid namespace of its own (a container) is ignored: its pids are not the
    # kernel's.
    code = ("from casfs.node import procexit\n"
            "w = procexit.ExitWatch()\n"
            "assert not w.start()\n"
            "print(w.unavailable)\n")
    for unshare in (["unshare", "-n"], ["unshare", "-p", "-f", "--mount-proc"]):
        r = subprocess.run([*unshare, sys.executable, "-c", code], capture_output=True,
                           text=True, timeout=60)
        if r.returncode and "unshare" in r.stderr:
            pytest.skip(f"no namespaces here: {r.stderr.strip()}")
        assert r.returncode == 0, (unshare, r.stderr)
        assert "process connector is unavailable" in r.stdout

    w = procexit.ExitWatch()  # never started: nothing known
    w.unavailable = "the kernel's process connector is unavailable (Connection refused)"
    with caplog.at_level(logging.INFO, logger="casfs.node.procexit"):
        assert w.verdict(12345, wait=0.0) == (True, None)
        assert w.verdict(12346, wait=0.0) == (True, None)
    told = [r for r in caplog.records if "counts as killed" in r.getMessage()]
    assert len(told) == 1 and told[0].levelno == logging.INFO


def test_a_pid_not_watched_when_it_died_is_unknown(watch: procexit.ExitWatch) -> None:
    # A holder that died while no mount process ran: its new host never watched it.
    start = time.monotonic()
    assert watch.verdict(os.getpid() + 100000, wait=2.0) == (True, None)
    assert time.monotonic() - start < 1.0  # nothing to wait for


def test_exits_lost_to_an_overflow_are_unknown_and_not_waited_for() -> None:
    # A small queue, and the reader held up (it records under the watch's lock): the
    # kernel drops what does not fit and says ENOBUFS.
    w = procexit.ExitWatch(rcvbuf=4096)
    assert w.start(), w.unavailable
    procs = [subprocess.Popen(["sleep", "0.3"]) for _ in range(60)]
    try:
        w.watch(p.pid for p in procs)
        with w._cond:
            for p in procs:
                p.wait()
            time.sleep(0.2)
        wait_until(lambda: w.lost, "the overflow to be seen")
        unknown = [p.pid for p in procs if w.exit_of(p.pid) is None]
        assert unknown  # lost: no record, and nothing to wait for
        start = time.monotonic()
        assert w.verdict(unknown[0], wait=5.0) == (True, None)
        assert time.monotonic() - start < 1.0
        assert "overflowed" in w.why_unknown(unknown[0])
        # A holder watched after the overflow is heard of again.
        later = subprocess.Popen(["sleep", "0.3"])
        w.watch([later.pid])
        later.wait()
        ex = w.exit_of(later.pid, wait=5.0)
        assert ex is not None and not ex.killed
    finally:
        w.stop()
