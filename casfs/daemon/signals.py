"""casfsd's signals, handled in a thread of their own rather than in a signal handler.

A Python signal handler runs in the main thread between two bytecodes, wherever
that thread is: inside ``Event.wait`` holding the Event's lock, inside a log call.
A handler that takes a lock the interrupted code holds never returns (the signal
module's documentation warns). casfsd hung so in CI: SIGTERM's handler called
``stop_requested.set()`` while the main thread sat in ``stop_requested.wait()``
between taking and dropping the Event's lock; it never stopped, and a second
SIGTERM only logged again. Here the Python handler does nothing; the interpreter's
C handler writes the signal's number to a wakeup pipe (``signal.set_wakeup_fd``),
and a thread reads it and runs the real handler, which may log and take locks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger(__name__)


def _ignore(signum: int, frame: FrameType | None) -> None:
    """Installed so the default action (termination) does not happen; the work is the
    relay thread's."""


class SignalRelay:
    """Runs ``handlers[signum](signum)`` in a thread for each of those signals received.
    Install from the main thread; ``close`` puts the previous dispositions back."""

    def __init__(self, handlers: dict[int, Callable[[int], object]]) -> None:
        self.handlers = dict(handlers)
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)  # the C handler must never block on a full pipe
        self._old_fd = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        self._old = {s: signal.signal(s, _ignore) for s in self.handlers}
        self._thread = threading.Thread(target=self._relay, name="signals", daemon=True)
        self._thread.start()

    def _relay(self) -> None:
        while True:
            try:
                data = os.read(self._r, 64)
            except OSError:
                return  # closed
            if not data:
                return
            for signum in data:
                handler = self.handlers.get(signum)
                if handler is None:
                    continue  # another Python-handled signal (SIGINT's default): not ours
                try:
                    handler(signum)
                except Exception:  # a bug: the next signal must still be handled
                    log.exception("handling %s", signal.Signals(signum).name)

    def close(self) -> None:
        signal.set_wakeup_fd(self._old_fd)
        for s, old in self._old.items():
            signal.signal(s, old if old is not None else signal.SIG_DFL)
        with contextlib.suppress(OSError):
            os.close(self._w)  # the relay thread's read returns 0: it ends
        self._thread.join(5)
        with contextlib.suppress(OSError):
            os.close(self._r)
