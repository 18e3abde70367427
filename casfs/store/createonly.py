"""Whether an object store still honours create-only writes, before a record is made.

A record is created with a create-only write (``If-None-Match: *``); the node whose
create succeeds has the seq, and every other retries at the next one (docs/format.md,
"Publication protocol"). ``casfs init`` refuses a store where racing creates both
succeed (``root.probe_create_only``), but a gateway, load balancer or proxy put in
front later that drops the header makes every create succeed: two nodes publishing
one seq at once both said "published", and one's generation was silently lost (a
review, 2 runs of 2). So before the first record a process creates on a remote root
(and once an hour after), one key is created twice: the second must be refused.
Two small PUTs, made beside the manifest's upload.
"""

from __future__ import annotations

import threading
import time

from casfs.store.backend import Backend

KEY = "probes/create-only"
RECHECK_S = 3600.0
_DATA = b"casfs: the key a create-only write is checked on (never read)\n"

_lock = threading.Lock()
_honoured: dict[str, float] = {}  # repr(backend) -> when it was last seen honouring them


def refusal(backend: Backend) -> str | None:
    """None if create-only writes are honoured (or need no check: a local root), else
    why not, in one line. OSError if the store cannot be reached."""
    if not backend.remote:
        return None  # a POSIX root: link(2) is atomic, no server decides
    name = repr(backend)
    now = time.monotonic()
    with _lock:
        if now - _honoured.get(name, -RECHECK_S) < RECHECK_S:
            return None
    backend.create_exclusive(KEY, _DATA)  # there from now on, whoever made it
    if backend.create_exclusive(KEY, _DATA):
        return (f"{name} took a create-only write (If-None-Match: *) over a key that"
                " exists: a gateway or proxy in front of it drops the header? Not"
                " publishing: nodes racing for one generation would lose each other's")
    with _lock:
        _honoured[name] = now
    return None
