"""What a mount process that failed tells its parent: one line that says why.

A review (2026-12-06) filled the state dir's filesystem: the write at READY failed
inside the serving nursery, so the OSError came wrapped in an ExceptionGroup that the
process did not catch; it died with a traceback, and ``casfs run`` showed a frame of
it as the reason (``the mount process ... failed:     |   File ".../control.py"``).
"""

from __future__ import annotations

from pathlib import Path

from casfs.errors import UsageError
from casfs.node import worker

GROUP_TRACEBACK = """\
2026-12-06 12:00:00 INFO casfs.node.mount m: serving
  + Exception Group Traceback (most recent call last):
  |   File "/x/trio/_core/_run.py", line 10, in run
  |     raise combined_error_from_nursery
  | ExceptionGroup: Exceptions from Trio nursery (1 sub-exception)
  +-+---------------- 1 ----------------
    | Traceback (most recent call last):
    |   File "/work/main/casfs/node/control.py", line 15, in write_registry
    |     atomic.write_atomic(path, data)
    | OSError: [Errno 28] No space left on device: '/h/.local/state/casfs/run/m.json'
    +------------------------------------
"""


def test_the_reason_is_the_exception_not_a_frame(tmp_path: Path) -> None:
    log = tmp_path / "m.log"
    log.write_text(GROUP_TRACEBACK)
    assert worker._last_log_line(log) == (
        "OSError: [Errno 28] No space left on device: '/h/.local/state/casfs/run/m.json'")
    log.write_text(GROUP_TRACEBACK.rsplit("    | OSError", 1)[0])  # cut by the full disk
    assert worker._last_log_line(log) == ""  # "it exited without saying why", no frame
    log.write_text("2026 ERROR casfs.node.worker m: the mount point is not a directory\n")
    assert worker._last_log_line(log).endswith("the mount point is not a directory")


def test_an_environment_error_inside_a_nursery_is_told_as_one() -> None:
    full = OSError(28, "No space left on device")
    nested = BaseExceptionGroup("outer", [BaseExceptionGroup("inner", [full])])
    assert worker._environment_error(nested) is full
    usage = UsageError("bad")
    assert worker._environment_error(BaseExceptionGroup("g", [usage])) is usage
    # a bug beside it: not the environment's, raised as it is
    assert worker._environment_error(BaseExceptionGroup("g", [full, ValueError("x")])) is None
