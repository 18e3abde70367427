"""casfsd's signals are handled in a thread (casfs.daemon.signals): a CI run's casfsd
never stopped after SIGTERM, its handler blocked on the lock of the Event the main
loop was waiting on."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# The main thread holds the Event's lock (as Event.wait does between taking it and
# waiting) when SIGTERM arrives; the handler sets the Event.
SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading, time
    from casfs.daemon.signals import SignalRelay

    ev = threading.Event()
    before = signal.getsignal(signal.SIGTERM)
    if sys.argv[1] == "relay":
        relay = SignalRelay({signal.SIGTERM: lambda s: ev.set()})
    else:  # what casfsd did: the work in the Python signal handler
        signal.signal(signal.SIGTERM, lambda s, f: ev.set())
    with ev._cond:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
    print("set" if ev.wait(10) else "not set", flush=True)
    if sys.argv[1] == "relay":
        relay.close()
        assert signal.getsignal(signal.SIGTERM) == before
        assert signal.set_wakeup_fd(-1) == -1
""")


def _run(how: str) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run([sys.executable, "-c", SCRIPT, how], capture_output=True,
                              text=True, timeout=8)
    except subprocess.TimeoutExpired:
        return None


def test_a_signal_while_the_main_thread_holds_the_lock_is_handled() -> None:
    r = _run("relay")
    assert r is not None, "the relay deadlocked"
    assert r.returncode == 0 and r.stdout.strip() == "set", r.stderr


def test_the_hazard_is_real_with_a_python_handler() -> None:
    """The control: the same script with the work in the handler hangs (this is what the
    relay is for; if it ever stops hanging the test above proves less)."""
    assert _run("handler") is None


@pytest.mark.expect_log(r"handling SIGHUP")
def test_every_signal_reaches_its_handler_and_a_failing_one_does_not_stop_the_relay(
        caplog: pytest.LogCaptureFixture) -> None:
    import os
    import signal
    import threading

    from casfs.daemon.signals import SignalRelay

    seen: list[int] = []
    done = threading.Event()

    def boom(signum: int) -> None:
        raise RuntimeError("a bug")

    def note(signum: int) -> None:
        seen.append(signum)
        if signum == signal.SIGUSR2:
            done.set()

    before = signal.getsignal(signal.SIGHUP)  # (ignored under nohup)
    relay = SignalRelay({signal.SIGHUP: boom, signal.SIGUSR1: note, signal.SIGUSR2: note})
    try:
        with caplog.at_level("ERROR", logger="casfs.daemon.signals"):
            os.kill(os.getpid(), signal.SIGHUP)
            os.kill(os.getpid(), signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGUSR2)
            assert done.wait(5)
    finally:
        relay.close()
    assert seen == [signal.SIGUSR1, signal.SIGUSR2]
    assert any("handling SIGHUP" in r.getMessage() for r in caplog.records)
    assert signal.getsignal(signal.SIGHUP) == before  # put back
