"""Path <-> inode numbers for one mount, with the kernel's lookup counts.

Inode numbers are handed out once and never reused during a mount, so the
kernel never confuses an old file with a new one at the same path. An inode
lives while the kernel holds a lookup count on it (``forget`` drops it at
zero). Unlinking or replacing a path *detaches* its inode: the number keeps
working for open handles but the path now belongs to the next inode created
there. A directory rename moves the paths of every known descendant; a children
index keeps that (and unlink) proportional to the subtree, not to the table.

Hard links: an inode may have several names. ``path`` answers its primary
name (any name reaches the same file); unlinking one name keeps the inode
attached through the others. A name first seen for an upper file with more
than one link is matched to the inode of its siblings by ``key`` (the upper
file's device and inode number), so every name reports one inode number.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyfuse3

from casfs.view.inodejournal import InodeJournal, key_of, read

ROOT_INODE: int = pyfuse3.ROOT_INODE
HELD = 1 << 40  # a restored inode's lookup count: the kernel's is unknown, keep it


class InodeTable:
    """``root``: the number of the top directory; the table hands out ``root + 1`` on.

    A multiplexed mount (casfs.view.mux) gives each namespace its own range, so
    numbers stay unique across the namespaces of one FUSE session.
    """

    def __init__(self, root: int = ROOT_INODE, journal: InodeJournal | None = None) -> None:
        self.root = root
        self.journal = journal
        self._path: dict[int, str] = {root: ""}
        self._ino: dict[str, int] = {"": root}
        self._count: dict[int, int] = {}
        self._detached: set[int] = set()
        self._kids: dict[str, set[str]] = {}  # known paths by parent path
        self._aliases: dict[int, set[str]] = {}  # hard links: names besides the primary
        self._by_key: dict[tuple[int, int], int] = {}  # upper (st_dev, st_ino) -> inode
        self._key_of: dict[int, tuple[int, int]] = {}
        self._next = root + 1

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

    def ino(self, path: str, key: tuple[int, int] | None = None) -> int:
        """The inode of ``path``, assigning a new one (with no lookup count) if needed.

        ``key``: the upper file's (st_dev, st_ino) when it has several links;
        a name of an inode already known under that key becomes its alias.
        """
        ino = self._ino.get(path)
        if ino is not None:
            return ino
        if key is not None:
            known = self._by_key.get(key)
            if known is not None and self.path(known) is not None:
                self.add_name(known, path)
                return known
        ino = self._next
        self._next += 1
        self._name(path, ino)
        self._path[ino] = path
        if key is not None:
            self._set_key(ino, key)
        if self.journal is not None:
            self.journal.named(ino, path, key)
            if self.journal.due(len(self._path)):
                self.journal.rewrite(self.snapshot())
        return ino

    def _set_key(self, ino: int, key: tuple[int, int]) -> None:
        old = self._key_of.pop(ino, None)
        if old is not None and self._by_key.get(old) == ino:
            del self._by_key[old]
        self._by_key[key] = ino
        self._key_of[ino] = key

    def add_name(self, ino: int, path: str, key: tuple[int, int] | None = None) -> None:
        """``path`` is a new hard link to ``ino`` (replacing whatever the table had there)."""
        if self._ino.get(path) == ino:
            return
        if self.journal is not None:
            self.journal.aliased(ino, path, key)
        if path in self._ino:
            self._detach(path)
        self._name(path, ino)
        self._aliases.setdefault(ino, set()).add(path)
        if key is not None:
            self._set_key(ino, key)

    def aliases(self, ino: int) -> set[str]:
        """The names of ``ino`` besides its primary one (hard links), if any."""
        return self._aliases.get(ino) or set()

    def names(self, ino: int) -> list[str]:
        """Every current name of ``ino`` (primary first)."""
        primary = self.path(ino)
        if primary is None:
            return []
        return [primary, *sorted(self._aliases.get(ino, ()))]

    def _name(self, path: str, ino: int) -> None:
        self._ino[path] = ino
        # Link the path, and any ancestor the table does not know, into _kids
        # so a subtree walk from any known ancestor reaches it.
        child = path
        while child:
            parent = _parent(child)
            kids = self._kids.setdefault(parent, set())
            if child in kids:
                break
            kids.add(child)
            if parent in self._ino:
                break
            child = parent

    def _unname(self, path: str) -> int:
        ino = self._ino.pop(path)
        if path not in self._kids:  # still an ancestor of known paths: keep the link
            parent = _parent(path)
            kids = self._kids.get(parent)
            if kids is not None:
                kids.discard(path)
                if not kids:
                    del self._kids[parent]
        return ino

    def find(self, path: str) -> int | None:
        return self._ino.get(path)

    def lookup(self, path: str, key: tuple[int, int] | None = None) -> int:
        """The kernel learned about ``path`` once more (lookup, create, readdirplus, link)."""
        ino = self.ino(path, key)
        if ino != self.root:
            self._count[ino] = self._count.get(ino, 0) + 1
        return ino

    def drop_if_unused(self, ino: int) -> None:
        """Forget an inode assigned speculatively that the kernel never heard of."""
        if ino != self.root and self._count.get(ino, 0) == 0:
            self._remove(ino)

    def forget(self, ino: int, n: int) -> None:
        if ino == self.root:
            return
        left = self._count.get(ino, 0) - n
        if left > 0:
            self._count[ino] = left
        else:
            self._remove(ino)

    def _remove(self, ino: int) -> None:
        if self.journal is not None:
            self.journal.retired(ino)
        self._count.pop(ino, None)
        path = self._path.pop(ino, None)
        for alias in self._aliases.pop(ino, ()):
            if self._ino.get(alias) == ino:
                self._unname(alias)
        key = self._key_of.pop(ino, None)
        if key is not None and self._by_key.get(key) == ino:
            del self._by_key[key]
        if ino in self._detached:
            self._detached.discard(ino)
        elif path is not None and self._ino.get(path) == ino:
            self._unname(path)

    def _drop_name(self, ino: int, path: str) -> bool:
        """Remove one of several names of ``ino``; False if ``path`` is its only name."""
        aliases = self._aliases.get(ino)
        if not aliases:
            return False
        self._unname(path)
        if path in aliases:
            aliases.discard(path)
        else:  # the primary goes: an alias takes its place
            self._path[ino] = aliases.pop()
        if not aliases:
            del self._aliases[ino]
        return True

    def _subtree(self, path: str) -> list[str]:
        """``path`` (if known) and every known path below it."""
        out = [path] if path in self._ino else []
        stack = [path]
        while stack:
            for child in self._kids.get(stack.pop(), ()):
                if child in self._ino:
                    out.append(child)
                stack.append(child)
        return out

    def detach(self, path: str) -> None:
        """``path`` (and anything below it) is gone; its inodes stay valid as numbers."""
        if self.journal is not None:
            self.journal.detached(path)
        self._detach(path)

    def _detach(self, path: str) -> None:
        for p in self._subtree(path):
            if self._drop_name(self._ino[p], p):
                continue
            ino = self._unname(p)
            if ino == self.root:
                continue
            if self._count.get(ino, 0) > 0:
                self._detached.add(ino)
            else:
                self._path.pop(ino, None)

    def rename(self, old: str, new: str) -> None:
        """``old`` now lives at ``new`` (replacing whatever was there)."""
        if old == new:
            return
        if self.journal is not None:
            self.journal.renamed(old, new)
        self._detach(new)
        moved = [(p, self._unname(p)) for p in self._subtree(old)]
        for p, ino in moved:
            np = new + p[len(old):]
            self._name(np, ino)
            aliases = self._aliases.get(ino)
            if aliases is not None and p in aliases:
                aliases.discard(p)
                aliases.add(np)
            else:
                self._path[ino] = np

    def snapshot(self) -> list[list[Any]]:
        """Journal records that rebuild this table's numbers (casfs.view.inodejournal)."""
        out: list[list[Any]] = [["m", self._next]]
        for ino, path in self._path.items():
            if ino == self.root:
                continue
            if ino in self._detached:
                out.append(["x", ino, path])
                continue
            out.append(["n", ino, path, self._key_of.get(ino)])
            out.extend(["a", ino, alias, None] for alias in sorted(self._aliases.get(ino, ())))
        return out

    @classmethod
    def restore(cls, path: Path, root: int = ROOT_INODE, to: Path | None = None) -> InodeTable:
        """The table a crashed process's journal at ``path`` describes, journaling on
        (to ``to``: a new journal, the old one left as it was; default: ``path``).

        Every inode it names is held (count HELD) until the mount ends: the
        kernel's lookup counts were not journaled.
        """
        t = cls(root)
        for rec in read(path):
            op = rec[0]
            if op == "n":
                t._assign(int(rec[1]), rec[2], key_of(rec[3]))
            elif op == "a":
                t.add_name(int(rec[1]), rec[2], key_of(rec[3]))
            elif op == "d":
                t._detach(rec[1])
            elif op == "r":
                t.rename(rec[1], rec[2])
            elif op == "f":
                t._remove(int(rec[1]))
            elif op == "x":
                t._path[int(rec[1])] = rec[2]
                t._count[int(rec[1])] = HELD
                t._detached.add(int(rec[1]))
            elif op == "m":
                t._next = max(t._next, int(rec[1]))
        t.journal = InodeJournal(to or path)
        t.journal.rewrite(t.snapshot())
        return t

    def _assign(self, ino: int, path: str, key: tuple[int, int] | None) -> None:
        if path in self._ino:
            self._detach(path)
        self._name(path, ino)
        self._path[ino] = path
        self._count[ino] = HELD
        if key is not None:
            self._set_key(ino, key)
        self._next = max(self._next, ino + 1)


def _parent(path: str) -> str:
    return path.rpartition("/")[0]
