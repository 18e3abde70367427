"""The sd_notify protocol (sd_notify(3)), without libsystemd.

systemd passes a unix datagram socket in ``NOTIFY_SOCKET`` (a path, or an
abstract name written with a leading ``@``); each datagram is newline
separated ``KEY=VALUE`` assignments: ``READY=1``, ``STATUS=...``,
``STOPPING=1``, ``RELOADING=1``, ``WATCHDOG=1``. Without ``NOTIFY_SOCKET`` every
call is a no-op, so the daemon runs the same under systemd, in a container or
in a terminal.

The watchdog (``WatchdogSec=`` in the unit): systemd passes ``WATCHDOG_USEC``
(and ``WATCHDOG_PID``, the process it is meant for); the daemon must send
``WATCHDOG=1`` more often than that, or systemd aborts and restarts it
(sd_watchdog_enabled(3)).
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)

ENV = "NOTIFY_SOCKET"
WATCHDOG_USEC = "WATCHDOG_USEC"
WATCHDOG_PID = "WATCHDOG_PID"


def _watchdog_seconds(usec: str | None, pid: str | None) -> float | None:
    """The watchdog interval systemd asked for, in seconds; None: no watchdog (or another
    process's: WATCHDOG_PID names a process that is not this one)."""
    if not usec:
        return None
    try:
        if pid and int(pid) != os.getpid():
            return None
        seconds = int(usec) / 1e6
    except ValueError:
        log.warning("ignoring %s=%r: not a number of microseconds", WATCHDOG_USEC, usec)
        return None
    return seconds if seconds > 0 else None


class Notifier:
    def __init__(self, address: str | None, watchdog: float | None = None) -> None:
        self._addr: str | bytes | None = None
        self._sock: socket.socket | None = None
        self.taken: dict[str, str] = {}  # the variables from_environment took
        # seconds: systemd restarts the daemon if no WATCHDOG=1 comes for this long
        self.watchdog_interval = watchdog if address else None
        if not address:
            return
        if address.startswith("@"):
            self._addr = b"\0" + address[1:].encode()
        elif address.startswith("/"):
            self._addr = address
        else:
            log.warning("ignoring %s=%r: not a path or an abstract socket name", ENV, address)
            return
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @classmethod
    def from_environment(cls) -> Notifier:
        """Take NOTIFY_SOCKET (and the watchdog's variables) out of the environment: the
        mount workers must not notify."""
        usec, pid = os.environ.pop(WATCHDOG_USEC, None), os.environ.pop(WATCHDOG_PID, None)
        addr = os.environ.pop(ENV, None)
        n = cls(addr, watchdog=_watchdog_seconds(usec, pid))
        n.taken = {k: v for k, v in ((ENV, addr), (WATCHDOG_USEC, usec), (WATCHDOG_PID, pid))
                   if v is not None}
        return n

    def restore_environment(self) -> None:
        """Put back what ``from_environment`` took: casfsd re-executes itself (the same
        pid, still systemd's main process)."""
        os.environ.update(self.taken)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, **fields: str | int) -> bool:
        """Send ``KEY=VALUE`` fields in one datagram; False if it could not be delivered."""
        if self._sock is None or self._addr is None:
            return False
        text = "\n".join(f"{k}={str(v).replace(chr(10), ' ')}" for k, v in fields.items())
        try:
            self._sock.sendto(text.encode(), self._addr)
        except OSError as e:
            log.warning("sd_notify to %r failed: %s", self._addr, e)
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send(READY=1, STATUS=status)

    def status(self, status: str) -> bool:
        return self.send(STATUS=status)

    def stopping(self, status: str = "stopping") -> bool:
        return self.send(STOPPING=1, STATUS=status)

    def reloading(self, status: str = "reloading") -> bool:
        """The service is ``reloading`` until the next ``ready``."""
        return self.send(RELOADING=1, STATUS=status)

    def watchdog(self) -> bool:
        return self.send(WATCHDOG=1)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
