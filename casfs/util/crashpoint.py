"""Crash points for fault injection: ``CASFS_CRASHPOINT=<step>`` kills the process there.

The fault suite (tests/faults/test_crashpoints.py) sets it to each step of
promotion and publication in turn and checks that what a kill -9 leaves
behind is always a valid store and a node that recovers. Unset (always, in
production) it costs one environment lookup per step. With
``CASFS_CRASHPOINT_AFTER=n`` the first n passes through the step survive.
Besides STEPS (promotion and publication), ``fetch-worker`` kills a mount's
fetch worker before each fill (tests/faults/test_fetch_worker.py), and
``s3-part-sent`` kills a multipart upload to an S3 root after each part it
hands over (tests/cli/test_s3_large.py), and ``handover-stepped-aside`` a mount
process that stepped aside before it answers (tests/node/test_handover.py). With
``CASFS_CRASHPOINT_ONCE=<file>`` only the first process to get there dies
(it creates the file): a mount's promotion worker dies at the step once and
its replacement goes through (tests/faults/test_crashpoints.py).

``fault`` raises instead (an unexpected exception: what a bug or an input casfs
does not handle does): with ``CASFS_FAULT=<step>`` and ``CASFS_FAULT_MATCH=<text>``,
at a call whose detail contains the text. ``promote-file`` (a file being
promoted, its path the detail) checks that one such file cannot stop the rest
of its namespace (tests/cli/test_unpromotable.py).

``pausepoint`` stops a process at a step instead, for race tests: with
``CASFS_PAUSEPOINT=<step>`` and ``CASFS_PAUSEPOINT_FILE=<f>`` it creates
``<f>.reached`` there and waits until ``<f>`` exists (at most
``CASFS_PAUSEPOINT_MAX`` seconds, 120 by default). PAUSE_STEPS lists them.
"""

from __future__ import annotations

import os
import signal
import time

STEPS = (
    "object-staged",  # an object written to staging, not linked into place
    "pack-staged",  # a pack of small objects written to staging, not in place
    "after-objects",  # promotion stored objects, the node index does not know yet
    "before-manifest",  # publication merged, nothing written
    "after-manifest",  # the delta/full manifest stored, not synced
    "after-sync",  # objects durable, no record yet
    "after-record",  # record N+1 created, the node has not marked its entries published
)
_passes: dict[str, int] = {}


def crashpoint(step: str) -> None:
    if os.environ.get("CASFS_CRASHPOINT") != step:
        return
    n = _passes.get(step, 0)
    _passes[step] = n + 1
    if n < int(os.environ.get("CASFS_CRASHPOINT_AFTER", "0") or 0):
        return
    once = os.environ.get("CASFS_CRASHPOINT_ONCE")
    if once:
        try:
            os.close(os.open(once, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            return  # another process died here already
    os.kill(os.getpid(), signal.SIGKILL)


def fault(step: str, detail: str) -> None:
    if os.environ.get("CASFS_FAULT") == step and os.environ.get("CASFS_FAULT_MATCH", "\0") in (
            detail):
        raise RuntimeError(f"injected fault at {step}: {detail}")


PAUSE_STEPS = (
    "reclaim-listed",  # reclaim found the namespace idle, holds no lock yet
    "reclaim-locked",  # reclaim holds the namespace's lock, has promoted nothing yet
    "reclaim-published",  # reclaim published what was left, has dropped nothing yet
    "reclaim-dropped",  # reclaim dropped the index entries, the upper is still there
    "dir-final-publication",  # a dir-mode process marked its entry stopping, has not
    # started its final promotion/publication
    "host-release",  # the node's host stopped a namespace's tasks, has not started its
    # final promotion/publication
    "overlay-shutdown",  # an overlay mode process got its stop signal, has not started
    # its final promotion/publication
)


def pausepoint(step: str) -> None:
    if os.environ.get("CASFS_PAUSEPOINT") != step:
        return
    flag = os.environ.get("CASFS_PAUSEPOINT_FILE")
    if not flag:
        return
    with open(flag + ".reached", "a") as f:  # a line a process: tests count them
        f.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + float(os.environ.get("CASFS_PAUSEPOINT_MAX", "120"))
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.02)
