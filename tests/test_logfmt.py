"""A log message stays one line whatever a tenant names her files: a name like
``k\n<3>casfsd casfs.node: ...`` used to forge a line of its own (an error, to the
journal) in casfsd's and the CLI's logs (found on 2026-12-06)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from casfs.node import logfmt

FORGED = "KEY/k\n<3>casfsd casfs.node: FORGED\r\x1b[31mred"


def _record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            info = sys.exc_info()
    return logging.LogRecord("casfs.promote", logging.INFO, __file__, 1, msg, args, info)


def test_both_formats_keep_a_message_on_one_line() -> None:
    for fmt in (logfmt.JournalFormatter("casfsd "),
                logfmt.OneLineFormatter("%(levelname)s %(name)s: %(message)s")):
        out = fmt.format(_record("not promoting %s: %s", FORGED, "why"))
        assert out.count("\n") == 0, out
        assert "KEY/k\\n<3>casfsd casfs.node: FORGED\\r\\x1b[31mred" in out
        tb = fmt.format(_record("failed %s", FORGED, exc=True)).splitlines()
        assert len(tb) > 2 and "Traceback" in tb[1] and "FORGED" not in "".join(tb[1:])


@pytest.mark.expect_log(r"FORGED")
def test_the_cli_logs_one_line_a_message() -> None:
    code = ("import logging, sys; from casfs.cli.main import setup_logging;"
            " setup_logging(0); logging.getLogger('casfs.x').warning('at %s', sys.argv[1])")
    r = subprocess.run([sys.executable, "-c", code, FORGED], capture_output=True, text=True,
                       timeout=60, check=True)
    lines = r.stderr.splitlines()
    assert lines == ["casfs: WARNING casfs.x: at KEY/k\\n<3>casfsd casfs.node: FORGED\\r"
                     "\\x1b[31mred"], lines
