"""The mount process's side of its promotion worker: promotion and publication in a child.

Promotion (hashing, zstd, pack and object writes, promoted rows) and
publication (manifests, generation records on a POSIX or S3 root) run in
casfs.node.promoteworker, a child of the mount process, one per mount
process and state directory, for all its namespaces. The machinery is the
fetch worker's (casfs.node.fetchproc.FetchWorker: socketpair, watchdog,
restart), with another module:

* the worker dies (kill -9, OOM, a native crash): the request in flight is
  sent once more to a fresh worker; a second loss fails the round, whose
  paths stay dirty in the mount's tracker and go again next round. The upper
  files are the truth until a round completes: nothing is lost.
* the worker hangs (no sign of life, see promoteworker, for ``hang_after``):
  it is killed and replaced, the stalled round fails and is retried next
  interval by the new worker.
* no spare: a promotion round can wait for an interpreter start (a job never
  waits on promotion), and a mount process keeps one process fewer.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from casfs.node.fetchproc import FetchWorker
from casfs.util.envnum import env_float

HANG_AFTER = 60.0  # seconds without a sign of life before a promotion worker is replaced
CHUNK = 2000  # paths per promote request: a round of 100,000 new files is 50 requests

_workers: dict[str, FetchWorker] = {}
_workers_lock = threading.Lock()


def hang_after() -> float:
    """CASFS_PROMOTE_HANG_AFTER overrides HANG_AFTER (tests wedge a worker)."""
    return env_float("CASFS_PROMOTE_HANG_AFTER", HANG_AFTER)


def shared(state_dir: Path) -> FetchWorker:
    """This process's promotion worker for a state directory (one for all its namespaces)."""
    key = os.path.realpath(state_dir)
    with _workers_lock:
        w = _workers.get(key)
        if w is None:
            w = _workers[key] = FetchWorker(
                Path(key), hang_after=hang_after(), threads=8,
                module="casfs.node.promoteworker", args=["--state-dir", key],
                label="promotion worker", spare=False)
        return w


def stop(state_dir: Path) -> None:
    """Stop this process's promotion worker for ``state_dir`` (a process done with it)."""
    with _workers_lock:
        w = _workers.pop(os.path.realpath(state_dir), None)
    if w is not None:
        w.close()


def status_of(state_dir: Path) -> dict[str, Any] | None:
    """What this process's promotion worker did (casfs status), if it has one."""
    with _workers_lock:
        w = _workers.get(os.path.realpath(state_dir))
    if w is None:
        return None
    return {"pid": w.pid, **w.counters.snapshot()}


def enabled() -> bool:
    """CASFS_PROMOTE_WORKER=0 promotes and publishes in the mount process (debugging)."""
    return os.environ.get("CASFS_PROMOTE_WORKER", "1") != "0"
