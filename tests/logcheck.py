"""Fail any test during which casfs logged a WARNING or ERROR it did not expect.

Loaded by tests/conftest.py. Two sources are read after each test:
- the test process's own log records (a handler on the root logger);
- every casfs process the test started: they inherit ``CASFS_LOG_TAP`` (a fresh
  directory per test) and append their warnings there (casfs.util.logtap),
  real users' processes included (tests/users.py passes it on).

A test that expects warnings (faults, attacks, fallbacks) says which:
``@pytest.mark.expect_log(r"regex", ...)`` on the test, its class or its module
(``pytestmark``); a line matching any pattern is allowed. A background task that
raises logs an ERROR with its traceback, so it fails the test the same way.

On by default (``CASFS_LOG_CHECK=fail``). ``CASFS_LOG_CHECK=report:FILE`` writes what
would fail to FILE (JSON lines) and fails nothing: for surveying a whole run.
``CASFS_LOG_CHECK=off`` turns it off.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs.util.logtap import ENV

MARK = "expect_log"


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not record.name.startswith("casfs"):
            return  # other libraries' warnings are theirs
        msg = " ".join(record.getMessage().splitlines())
        if record.exc_info and record.exc_info[1] is not None:
            msg += f" [{type(record.exc_info[1]).__name__}: {record.exc_info[1]}]"
        self.lines.append(f"{record.levelname}\t{record.name}\t{msg}")


def _ours(line: str) -> bool:
    """A tapped line from casfs's own loggers (``__main__``: a casfs module run with -m).

    Other libraries' lines are theirs, as in this process (_Collect)."""
    logger = line.split("\t", 2)[1] if line.count("\t") >= 2 else ""
    return logger.startswith("casfs") or logger == "__main__"


def _tapped(tap: Path) -> list[str]:
    out = []
    for f in sorted(tap.glob("*.log")):
        try:
            text = f.read_text(errors="backslashreplace")
        except OSError:
            continue
        out += [f"{ln}\t({f.stem})" for ln in text.splitlines() if ln.strip() and _ours(ln)]
    return out


def _patterns(item: pytest.Item) -> list[re.Pattern[str]]:
    pats: list[re.Pattern[str]] = []
    for m in item.iter_markers(MARK):
        pats += [re.compile(p) for p in m.args]
    return pats


@pytest.fixture(autouse=True)
def _casfs_log_check(request: pytest.FixtureRequest) -> Iterator[None]:
    mode = os.environ.get("CASFS_LOG_CHECK", "fail")
    if mode == "off":
        yield
        return
    tap = Path(tempfile.mkdtemp(prefix="casfs-tap-"))
    os.chmod(tap, 0o1777)  # real users' processes add their files too
    old = os.environ.get(ENV)
    os.environ[ENV] = str(tap)
    handler = _Collect()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old
        lines = handler.lines + _tapped(tap)
        shutil.rmtree(tap, ignore_errors=True)
    pats = _patterns(request.node)
    unexpected = [ln for ln in lines if not any(p.search(ln) for p in pats)]
    if not unexpected:
        return
    if mode.startswith("report:"):
        with open(mode.split(":", 1)[1], "a") as f:
            f.write(json.dumps({"test": request.node.nodeid, "lines": unexpected}) + "\n")
        return
    shown = "\n".join(unexpected[:20]) + (f"\n... {len(unexpected) - 20} more"
                                          if len(unexpected) > 20 else "")
    pytest.fail(f"casfs logged {len(unexpected)} unexpected warning/error lines (declare"
                f" expected ones with @pytest.mark.{MARK}(regex)):\n{shown}", pytrace=False)
