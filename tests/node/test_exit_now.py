"""A mount process's exit once its work is done (casfs.node.worker.exit_now): no
interpreter teardown for ``casfs run`` to wait for when only daemon threads are
left, the interpreter's own exit otherwise; logs and stdio reach their files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROG = """
import atexit, logging, sys, threading, time
from casfs.node.worker import exit_now
logging.basicConfig(filename=sys.argv[1], level=logging.INFO)
logging.getLogger("t").info("the last line")
atexit.register(lambda: print("teardown ran", flush=True))
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
if sys.argv[2] == "busy":
    threading.Thread(target=time.sleep, args=(0.3,)).start()
sys.stdout.write("stdout kept")
exit_now(3)
"""


@pytest.mark.parametrize("other", ["daemons", "busy"])
def test_exit_now(tmp_path: Path, other: str) -> None:
    log = tmp_path / "log"
    p = subprocess.run([sys.executable, "-c", PROG, str(log), other], capture_output=True,
                       text=True, timeout=30, check=False)
    assert p.returncode == 3, p.stderr
    assert "the last line" in log.read_text()
    assert p.stdout.startswith("stdout kept")
    # Only daemon threads left: _exit, no teardown; a non-daemon thread running: the
    # interpreter's exit, which waits for it and runs the atexit handlers.
    assert ("teardown ran" in p.stdout) == (other == "busy"), p.stdout
