"""Path <-> inode numbers for one mount, with the kernel's lookup counts.

Inode numbers are handed out once and never reused during a mount, so the
kernel never confuses an old file with a new one at the same path. An inode
lives while the kernel holds a lookup count on it (``forget`` drops it at
zero). Unlinking or replacing a path *detaches* its inode: the number keeps
working for open handles but the path now belongs to the next inode created
there. A directory rename moves the paths of every known descendant.
"""

from __future__ import annotations

import pyfuse3

ROOT_INODE: int = pyfuse3.ROOT_INODE


class InodeTable:
    def __init__(self) -> None:
        self._path: dict[int, str] = {ROOT_INODE: ""}
        self._ino: dict[str, int] = {"": ROOT_INODE}
        self._count: dict[int, int] = {}
        self._detached: set[int] = set()
        self._next = ROOT_INODE + 1

    def __len__(self) -> int:
        return len(self._path)

    def path(self, ino: int) -> str | None:
        """Current path of ``ino``; None if it is detached or unknown."""
        if ino in self._detached:
            return None
        return self._path.get(ino)

    def last_path(self, ino: int) -> str | None:
        """The path ``ino`` had, even if it is detached since."""
        return self._path.get(ino)

    def ino(self, path: str) -> int:
        """The inode of ``path``, assigning a new one (with no lookup count) if needed."""
        ino = self._ino.get(path)
        if ino is None:
            ino = self._next
            self._next += 1
            self._ino[path] = ino
            self._path[ino] = path
        return ino

    def find(self, path: str) -> int | None:
        return self._ino.get(path)

    def lookup(self, path: str) -> int:
        """The kernel learned about ``path`` once more (lookup, create, readdirplus)."""
        ino = self.ino(path)
        if ino != ROOT_INODE:
            self._count[ino] = self._count.get(ino, 0) + 1
        return ino

    def drop_if_unused(self, ino: int) -> None:
        """Forget an inode assigned speculatively that the kernel never heard of."""
        if ino != ROOT_INODE and self._count.get(ino, 0) == 0:
            self._remove(ino)

    def forget(self, ino: int, n: int) -> None:
        if ino == ROOT_INODE:
            return
        left = self._count.get(ino, 0) - n
        if left > 0:
            self._count[ino] = left
        else:
            self._remove(ino)

    def _remove(self, ino: int) -> None:
        self._count.pop(ino, None)
        path = self._path.pop(ino, None)
        if ino in self._detached:
            self._detached.discard(ino)
        elif path is not None and self._ino.get(path) == ino:
            del self._ino[path]

    def _subtree(self, path: str) -> list[str]:
        prefix = path + "/"
        return [p for p in self._ino if p == path or p.startswith(prefix)]

    def detach(self, path: str) -> None:
        """``path`` (and anything below it) is gone; its inodes stay valid as numbers."""
        for p in self._subtree(path):
            ino = self._ino.pop(p)
            if ino == ROOT_INODE:
                continue
            if self._count.get(ino, 0) > 0:
                self._detached.add(ino)
            else:
                self._path.pop(ino, None)

    def rename(self, old: str, new: str) -> None:
        """``old`` now lives at ``new`` (replacing whatever was there)."""
        if old == new:
            return
        self.detach(new)
        for p in self._subtree(old):
            ino = self._ino.pop(p)
            np = new + p[len(old):]
            self._ino[np] = ino
            self._path[ino] = np
