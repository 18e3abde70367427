"""One tenant's flood of opens and closes never holds another tenant's closes back.

casfsd's on-demand namespaces share one FUSE connection. The kernel hands a
connection's server at most ``max_background`` background requests at once (12
by default: RELEASE and RELEASEDIR after a close, the writeback cache's WRITEs)
and queues the rest, one queue for every tenant. One tenant's 40 processes
opening and closing a directory in a loop (a review on 2026-12-06 used a
100,000-entry one; any will do) left 40,000 RELEASEDIRs waiting there, and
another tenant's close of a file she had written, whose WRITE queued behind
them, took 7 s. casfs widens the queue through fusectl (casfs.util.fusectl).
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.users import open_tmp, real_users, user_python

from .conftest import Daemon
from .test_tenants import FAST, Job, ok

pytestmark = [pytest.mark.fuse, pytest.mark.slow]

LISTERS = 40
LIST = r"""
import os, sys, time
d, procs, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
for k in range(procs):
    if os.fork() == 0:
        end = time.time() + secs
        while time.time() < end:
            os.close(os.open(d, os.O_RDONLY | os.O_DIRECTORY))
        os._exit(0)
print("listing", flush=True)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
"""
PROBE = r"""
import os, sys, time
d, secs = sys.argv[1], float(sys.argv[2])
worst, end, i = 0.0, time.time() + secs, 0
while time.time() < end:
    i += 1
    t = time.monotonic()
    try:
        os.stat(f"{d}/miss-{i}")
    except FileNotFoundError:
        pass
    with open(f"{d}/v{i % 5}", "wb") as f:
        f.write(b"v")
    worst = max(worst, time.monotonic() - t)
    time.sleep(0.05)
print(f"{worst:.3f}", flush=True)
"""


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    with open_tmp() as d:
        yield d


# The jobs end by a kill (Job.stop): what the victim's probe wrote last is held back.
@pytest.mark.expect_log(r"a job was killed: \d+ files it may have been writing")
def test_a_tenants_flood_of_closes_never_queues_ahead_of_another_tenants(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    d = daemons("a", [], defaults=FAST, node={"lease_grace": 0.5})
    py, _ = user_python()
    with real_users(2, tmp_path) as (victim, attacker):
        v, a = Job(victim, d), Job(attacker, d)
        lister = None
        try:
            ok(attacker.sh(f"mkdir {a.path}/d && touch {a.path}/d/f"))
            lister = attacker.popen([py, "-c", LIST, f"{a.path}/d", str(LISTERS), "10"],
                                    stderr=None, start_new_session=True)
            assert lister.stdout is not None and lister.stdout.readline() == "listing\n"
            time.sleep(1)
            worst = float(ok(victim.run([py, "-c", PROBE, str(v.path), "5"])))
            waiting = [int(Path(w).read_text())
                       for w in glob.glob("/sys/fs/fuse/connections/*/waiting")]
            # Was 7.4 s (every close behind her tens of thousands of RELEASEDIRs).
            assert worst < 2.0, (worst, waiting)
            assert max(waiting, default=0) < 5000, waiting
        finally:
            if lister is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(lister.pid, signal.SIGKILL)  # its listers too
                lister.wait(60)
            v.stop()
            a.stop()
