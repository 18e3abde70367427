"""Log formats for casfs processes: plain text, or systemd journal priority prefixes.

Under systemd (``JOURNAL_STREAM`` set) stderr goes to the journal, which reads
a ``<N>`` prefix on each line as the syslog priority (sd-daemon(3)), adds its
own timestamp and pid, and shows errors in red. The daemon and its mount
workers share this module so their lines look alike in ``journalctl -u casfsd``.
"""

from __future__ import annotations

import logging
import os
import sys

from casfs.util import logtap

PLAIN = "plain"
JOURNAL = "journal"
AUTO = "auto"
FORMATS = (AUTO, PLAIN, JOURNAL)

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}

# syslog priorities: 3 err, 4 warning, 6 info, 7 debug
_PRIORITY = ((logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))


def priority(levelno: int) -> int:
    for threshold, prio in _PRIORITY:
        if levelno >= threshold:
            return prio
    return 7


# Control characters in a message, escaped: a tenant names her files, and a name
# like "k\n<3>casfsd casfs.node: ..." must not forge a line of its own in the journal
# or in an operator's grep. (A traceback, appended after the message, keeps its lines.)
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F) if c != 0x09}
_CONTROL.update({0x0A: "\\n", 0x0D: "\\r"})


def one_line(text: str) -> str:
    return text.translate(_CONTROL)


class OneLineFormatter(logging.Formatter):
    """Each message on one line, its control characters escaped (``one_line``)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = one_line(record.message)
        return super().formatMessage(record)


class JournalFormatter(OneLineFormatter):
    """``<prio>tag logger: message``; continuation lines (tracebacks) keep the priority."""

    def __init__(self, tag: str) -> None:
        super().__init__("%(name)s: %(message)s")
        self.tag = tag

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{priority(record.levelno)}>"
        text = super().format(record)
        return "\n".join(f"{prefix}{self.tag}{line}" for line in text.splitlines() or [""])


def resolve_format(fmt: str) -> str:
    """``auto`` means journal when stderr is the journal (systemd sets JOURNAL_STREAM)."""
    if fmt == AUTO:
        return JOURNAL if os.environ.get("JOURNAL_STREAM") else PLAIN
    return fmt


def setup(level: int, fmt: str = AUTO, tag: str = "", prog: str = "casfs") -> None:
    """Send the root logger to stderr at ``level`` in format ``fmt``; ``tag`` prefixes lines."""
    handler = logging.StreamHandler(sys.stderr)
    if resolve_format(fmt) == JOURNAL:
        handler.setFormatter(JournalFormatter(tag))
    else:
        handler.setFormatter(OneLineFormatter(
            f"%(asctime)s {prog}[%(process)d] %(levelname)s {tag}%(name)s: %(message)s"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    logtap.install(prog)
