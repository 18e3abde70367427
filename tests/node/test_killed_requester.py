"""A job killed in the middle of its FUSE requests never stalls the mount process.

pyfuse3 reads /dev/fuse (a blocking fd) once trio says it is readable. A request
withdrawn in between (the kernel drops an unread request whose process got
SIGKILL, and an INTERRUPT answered before it was read) left that read blocking
the whole process until the next request came: no control socket, no
publication, no lease check. With nothing else using the mount (the job was the
one killed) that was for good. casfs.view.session's dead man's switch (SIGALRM
once the loop is stuck for a second) turns the read into EINTR.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import pytest

pytestmark = [pytest.mark.fuse]

# Threads asking the mount for names it never saw (each a LOOKUP the kernel cannot
# answer from its cache) and creating files, until killed.
HAMMER = """
import os, sys, threading
mnt = sys.argv[1]
def ask(t):
    i = 0
    while True:
        i += 1
        try:
            os.stat(os.path.join(mnt, f"no-{os.getpid()}-{t}-{i}"))
        except OSError:
            pass
        with open(os.path.join(mnt, f"w-{os.getpid()}-{t}-{i % 50}"), "w") as f:
            f.write("x")
for t in range(8):
    threading.Thread(target=ask, args=(t,), daemon=True).start()
print("asking", flush=True)
threading.Event().wait()
"""


def test_a_job_killed_mid_request_leaves_the_mount_answering(cluster: dict[str, Any]) -> None:
    b = cluster["b"]
    w = b.mount()
    mp = w.cfg.mountpoint
    for _ in range(20):
        job = subprocess.Popen([sys.executable, "-c", HAMMER, str(mp)], stdout=subprocess.PIPE)
        try:
            assert job.stdout is not None and job.stdout.readline() == b"asking\n"
            os.kill(job.pid, signal.SIGKILL)
        finally:
            job.kill()
            job.wait()
        # Nothing uses the mount now: only a live event loop answers (a stuck one
        # times out: control.request's deadline, DaemonUnavailableError).
        assert b.ask(w, "status")["ok"]
    assert (mp / "after").write_text("still serving") == 13
