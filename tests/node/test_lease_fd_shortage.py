"""The mount process out of file descriptors never takes a lease's holder for gone.

Another tenant holding the shared mount process at its open-file limit made every
read of /proc fail with EMFILE, which the lease check took for "the process is
gone": every lease on the node was dropped and its namespaces went from under
running jobs (found by a review on 2026-12-06). Now such an answer is unknown:
the lease stays, and a users scan that could not look says so instead of
"nobody".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from casfs.node import leases

PROBE = r"""
import json, os, resource, sys
from casfs.node import leases
holder = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
held = []
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
out = {"start": leases.start_time(holder), "alive": leases.alive(holder, "1")}
try:
    leases.users(["/nonexistent-dir"])
    out["scan"] = "complete"
except leases.ScanIncomplete as e:
    out["scan"] = f"incomplete: {e.strerror}"
for fd in held:
    os.close(fd)
out["after"] = leases.alive(holder, leases.start_time(holder))
out["gone"] = leases.alive(2 ** 22 + 7, None)
print(json.dumps(out))
"""


def test_a_holder_is_never_gone_because_this_process_is_out_of_descriptors() -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        r = subprocess.run([sys.executable, "-c", PROBE, str(holder.pid)],
                           capture_output=True, text=True, timeout=60, check=True)
        out = json.loads(r.stdout)
    finally:
        holder.kill()
        holder.wait()
    assert out["start"] == leases.UNKNOWN  # not None: that would read as gone
    assert out["alive"] is True  # even against a start time it cannot compare
    assert out["gone"] is False  # with descriptors again, a pid that is not there is gone
    assert out["scan"].startswith("incomplete")
    assert out["after"] is True


def test_a_dead_holder_is_still_gone() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    started = leases.start_time(p.pid)
    p.wait()
    assert leases.start_time(p.pid) is None and not leases.alive(p.pid, started)
    assert leases.alive(os.getpid(), leases.start_time(os.getpid()))


@pytest.mark.parametrize("errno_", [24, 23, 12])  # EMFILE, ENFILE, ENOMEM
def test_a_short_scan_is_refused_not_taken_for_nobody(errno_: int) -> None:
    with pytest.raises(leases.ScanIncomplete):
        leases._unless_short(OSError(errno_, os.strerror(errno_)))
    leases._unless_short(OSError(2, "gone"))  # ENOENT: the process went away
