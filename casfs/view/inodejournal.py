"""The inode table's changes, appended to a file a crashed process's adopter replays.

A process that adopts a crashed mount's FUSE connection (casfs.view.adopt)
must read the kernel's node ids as the dead process did. The table appends
every change of meaning (a number given to a path, a hard link, a detach, a
rename, a number retired) as one line, one ``write`` each, to a file on tmpfs:
a crash loses nothing that reached ``write``. Lookup counts are not kept (one
write per lookup would cost every request): a restored inode is held until
the mount ends, a bounded leak.

Format: JSON lines, ``[op, ...]``: ``["n", ino, path, key]`` a new number,
``["a", ino, path, key]`` another name, ``["d", path]`` detached (and below),
``["r", old, new]`` renamed, ``["f", ino]`` retired, ``["x", ino, path]``
(snapshots) detached while held. ``key``: [st_dev, st_ino] or null.
The first record is ``["v", VERSION]``; a reader of another version refuses
the file (ValueError), and the adopter then does not adopt.
The journal is rewritten as a snapshot of the live table when it has grown
to several times its size, so it stays proportional to what the kernel holds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

Key = tuple[int, int] | None

VERSION = 1  # docs/format.md "Inode journal"
_COMPACT_AFTER = 20_000  # records, and at least 4x the live entries
_FLAGS = os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW


def _lines(records: list[list[Any]]) -> bytes:
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode(
        "utf-8", "surrogateescape")


class InodeJournal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, _FLAGS | os.O_APPEND | os.O_CREAT, 0o600)
        self.records = 0
        if os.fstat(self._fd).st_size == 0:
            os.write(self._fd, _lines([["v", VERSION]]))

    def close(self) -> None:
        os.close(self._fd)

    def _put(self, rec: list[Any]) -> None:
        os.write(self._fd, _lines([rec]))
        self.records += 1

    def named(self, ino: int, path: str, key: Key) -> None:
        self._put(["n", ino, path, key])

    def aliased(self, ino: int, path: str, key: Key) -> None:
        self._put(["a", ino, path, key])

    def detached(self, path: str) -> None:
        self._put(["d", path])

    def renamed(self, old: str, new: str) -> None:
        self._put(["r", old, new])

    def retired(self, ino: int) -> None:
        self._put(["f", ino])

    def due(self, live: int) -> bool:
        return self.records > max(_COMPACT_AFTER, 4 * live)

    def rewrite(self, records: list[list[Any]]) -> None:
        """Replace the journal by ``records`` (a snapshot), atomically."""
        tmp = self.path.with_name(self.path.name + ".new")
        fd = os.open(tmp, _FLAGS | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, _lines([["v", VERSION], *records]))
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        os.close(self._fd)
        self._fd = os.open(self.path, _FLAGS | os.O_APPEND)
        self.records = len(records)


def read(path: Path) -> list[list[Any]]:
    """The records of a journal; a torn last line (a crash mid-write) is dropped."""
    out: list[list[Any]] = []
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            rec = json.loads(line.decode("utf-8", "surrogateescape"))
            if rec[0] == "v":
                if rec[1] != VERSION:
                    raise ValueError(f"{path.name}: inode journal format {rec[1]}; this"
                                     f" release reads {VERSION}")
                continue
            out.append(rec)
    return out


def key_of(raw: Any) -> Key:
    return None if raw is None else (int(raw[0]), int(raw[1]))
