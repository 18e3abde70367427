"""A second copy of every WARNING and ERROR a casfs process logs, for the test suite.

With ``CASFS_LOG_TAP=<dir>`` in its environment (the tests set it per test), a
casfs process (CLI, casfsd, mount, host, workers) appends one line per warning
or error to ``<dir>/<prog>-<pid>.log``: ``LEVEL<TAB>logger<TAB>message``, the
message on one line, an exception's type and text appended. A test fails on a
line it did not declare (tests/logcheck.py). Without the variable: nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os

ENV = "CASFS_LOG_TAP"


class TapHandler(logging.Handler):
    def __init__(self, path: str) -> None:
        super().__init__(logging.WARNING)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                e = record.exc_info[1]
                msg += f" [{type(e).__name__}: {e}]"
            line = f"{record.levelname}\t{record.name}\t{' '.join(msg.splitlines())}\n"
            os.write(self.fd, line.encode("utf-8", "backslashreplace"))
        except Exception:  # a log line must never hurt the process
            self.handleError(record)


def install(prog: str) -> None:
    """Add the tap to the root logger when ``$CASFS_LOG_TAP`` names a directory."""
    d = os.environ.get(ENV)
    if not d or not os.path.isdir(d):
        return
    root = logging.getLogger()
    if any(isinstance(h, TapHandler) for h in root.handlers):
        return
    with contextlib.suppress(OSError):  # a tap this user may not write: untapped
        root.addHandler(TapHandler(os.path.join(d, f"{prog}-{os.getpid()}.log")))
