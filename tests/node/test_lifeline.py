"""The lifeline's end and adoption (casfs.node.lifeline), in-process with real pipes,
pidfds and processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from casfs.node import lifeline

GONE = r"the parent process is gone: shutting down"
NOT_ADOPTED = r"no casfsd adopted this mount within 0.5s: shutting down"


def _watch(grace: float) -> tuple[lifeline.Lifeline, int, threading.Event]:
    r, w = os.pipe()
    gone = threading.Event()
    line = lifeline.Lifeline(r, grace, {"config": "{}", "build": "b"}, on_gone=gone.set)
    line.start()
    return line, w, gone


@pytest.mark.expect_log(GONE)
def test_without_a_grace_the_end_of_the_lifeline_shuts_down_at_once() -> None:
    _, w, gone = _watch(0)
    assert not gone.wait(0.2)
    os.close(w)
    assert gone.wait(5)


@pytest.mark.expect_log(NOT_ADOPTED)
def test_nobody_adopts_within_the_grace_then_it_shuts_down() -> None:
    _, w, gone = _watch(0.5)
    t0 = time.monotonic()
    os.close(w)
    assert gone.wait(10)
    assert time.monotonic() - t0 >= 0.45


@pytest.mark.expect_log(NOT_ADOPTED)
def test_an_adopter_is_watched_until_it_exits_then_the_grace_again() -> None:
    line, w, gone = _watch(0.5)
    os.close(w)
    adopter = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    try:
        reply = line.adopt({"pid": adopter.pid, "uid": os.geteuid(), "gid": 0})
        assert reply["ok"] and reply["pid"] == os.getpid() and reply["build"] == "b"
        assert not gone.wait(1.0)  # adopted: the first grace passed without a shutdown
        adopter.wait(10)
        assert gone.wait(5)  # the adopter died, nobody else adopted
    finally:
        adopter.kill()
        adopter.wait()


def test_adoption_is_refused_to_other_users_and_after_stepping_aside() -> None:
    line, w, gone = _watch(0.5)
    assert not line.adopt({"pid": os.getpid(), "uid": 12345, "gid": 0})["ok"]
    assert not line.adopt(None)["ok"]
    line.detached = True
    assert not line.adopt({"pid": os.getpid(), "uid": 0, "gid": 0})["ok"]
    os.close(w)
    assert not gone.wait(1.0)  # stepped aside: drains and exits by itself
