"""Which code a process runs: a digest of the casfs package's sources.

``__version__`` does not change between two commits of one release, nor for a
hot fix installed over a release; the sources do. casfsd compares the build of
a mount process it adopts with its own and replaces the process (a seamless
handover) when they differ: an upgrade reaches every mount process.
"""

from __future__ import annotations

import functools
from pathlib import Path

import blake3

PACKAGE = Path(__file__).resolve().parents[1]


@functools.cache
def build_id() -> str:
    """blake3 over the package's ``.py`` files (relative path and bytes), 16 hex digits."""
    h = blake3.blake3()
    for p in sorted(PACKAGE.rglob("*.py")):
        try:
            data = p.read_bytes()
        except OSError:
            continue
        h.update(str(p.relative_to(PACKAGE)).encode() + b"\0")
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()[:16]
