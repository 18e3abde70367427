"""What the view and promotion need from the index: the read-only lower tree and its objects.

The protocols live here, below their users (view, promote), so imports point
down only; casfs.view.lower re-exports them. The view never imports lmdb: it
is handed objects that satisfy these protocols (the node index implements
``LowerTree`` over LMDB, the local object cache implements ``ObjectFetcher``).
``DictLowerTree`` is an in-memory implementation for tests and small trees.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Literal, Protocol

from casfs.store.entry import Entry

DIR: Literal["dir"] = "dir"
LowerNode = Entry | Literal["dir"]


class LowerTree(Protocol):
    """The served generation as a tree. Paths are relative; the root is ''."""

    def lookup(self, path: str) -> LowerNode | None:
        """The file entry at ``path``, DIR for a directory, None if absent."""
        ...

    def children(self, dirpath: str) -> Iterator[tuple[str, LowerNode]]:
        """(name, node) of each direct child of ``dirpath``, sorted by name."""
        ...


def walk(tree: LowerTree, dirpath: str = "") -> Iterator[Entry]:
    """Every file of ``tree`` under ``dirpath``, depth first, in name order."""
    for name, node in tree.children(dirpath):
        path = f"{dirpath}/{name}" if dirpath else name
        if node is DIR:
            yield from walk(tree, path)
        elif isinstance(node, Entry):
            yield node


class ObjectFetcher(Protocol):
    """Turns an entry into a verified, read-only local file."""

    def fetch(self, entry: Entry) -> str:
        """Path of a local file holding exactly the entry's bytes, pinned against eviction.

        Blocking (may read shared storage): call it from a worker thread. Raises
        casfs.errors.CasfsError when the object is missing or corrupt: the
        caller treats that as a miss.
        """
        ...

    def cached(self, entry: Entry) -> str | None:
        """Like ``fetch`` (pinned) if the object is already local, else None.

        Never touches shared storage, so the view may call it inline in a
        handler: a warm open then costs no thread hand-off.
        """
        ...

    def open_cached(self, entry: Entry) -> int | None:
        """An open read-only fd of the object, pinned, if it is local and trusted
        already; else None (the caller then uses ``cached`` or ``fetch``).

        The warm open's shortcut: no lookup of the file before opening it.
        """
        ...

    def release_cached(self, digest: str, fd: int) -> None:
        """Give back an fd of ``open_cached`` (unpins; the fetcher closes it or keeps
        it for the next open: never close it yourself)."""
        ...

    def unpin(self, digest: str) -> None:
        """The caller no longer uses the file returned by ``fetch`` for ``digest``."""
        ...


class DictLowerTree:
    """An in-memory LowerTree built from entries (tests, small trees)."""

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        self._nodes: dict[str, LowerNode] = {"": DIR}
        self._children: dict[str, dict[str, LowerNode]] = {"": {}}
        for e in entries:
            self.add(e)

    def add(self, entry: Entry) -> None:
        """Add a file (first writer wins: an existing path is kept)."""
        if entry.path in self._nodes:
            return
        parts = entry.path.split("/")
        for i in range(1, len(parts)):
            d = "/".join(parts[:i])
            if d not in self._nodes:
                parent = "/".join(parts[: i - 1])
                self._nodes[d] = DIR
                self._children[d] = {}
                self._children[parent][parts[i - 1]] = DIR
            elif self._nodes[d] is not DIR:
                return  # a file already sits where this entry needs a directory
        self._nodes[entry.path] = entry
        self._children["/".join(parts[:-1])][parts[-1]] = entry

    def lookup(self, path: str) -> LowerNode | None:
        return self._nodes.get(path)

    def children(self, dirpath: str) -> Iterator[tuple[str, LowerNode]]:
        kids = self._children.get(dirpath, {})
        return iter(sorted(kids.items()))

    def __len__(self) -> int:
        return sum(1 for n in self._nodes.values() if n is not DIR)
