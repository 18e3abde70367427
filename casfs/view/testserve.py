"""Serve a plain directory as the lower layer of an overlay mount (tests, demos).

    python -m casfs.view.testserve --lower-dir D --upper U --mount M [--events F]

Every regular file under D becomes a lower entry; the fetcher returns the
file's own path, except for files whose name contains "corrupt", which fail
like a corrupt object would. With ``--events``, the WriteTracker events and
the counters are written to F as JSON lines on shutdown (and on SIGUSR1).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

import trio

from casfs.errors import CorruptObjectError
from casfs.promote.tracker import WriteTracker
from casfs.store.entry import Entry
from casfs.util.counters import Counters
from casfs.view.lower import DictLowerTree
from casfs.view.ops import OverlayOperations
from casfs.view.session import serve


def tree_from_dir(root: Path) -> tuple[DictLowerTree, dict[str, str]]:
    """A lower tree of the regular files under ``root``; digest -> source path."""
    tree = DictLowerTree()
    sources: dict[str, str] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, root)
            digest = f"{len(sources):064x}"  # a stand-in: tests never hash here
            sources[digest] = full
            tree.add(Entry(rel, digest, st.st_size, st.st_mode & 0o7777, st.st_mtime_ns))
    return tree, sources


class DirFetcher:
    """Serves lower files from their source paths; names with "corrupt" fail to verify."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.sources = sources
        self.pins: dict[str, int] = {}
        self._lock = threading.Lock()

    def fetch(self, entry: Entry) -> str:
        if "corrupt" in os.path.basename(entry.path):
            raise CorruptObjectError(f"object for {entry.path} failed verification")
        with self._lock:
            self.pins[entry.digest] = self.pins.get(entry.digest, 0) + 1
        return self.sources[entry.digest]

    def cached(self, entry: Entry) -> str | None:
        return None  # always through fetch (the threaded path)

    def open_cached(self, entry: Entry) -> int | None:
        return None  # always through fetch (the threaded path)


    def release_cached(self, digest: str, fd: int) -> None:
        os.close(fd)
        self.unpin(digest)

    def unpin(self, digest: str) -> None:
        with self._lock:
            self.pins[digest] -= 1


class RecordingTracker(WriteTracker):
    """A WriteTracker that also keeps the sequence of events (for tests)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, ...]] = []

    def opened_for_write(self, path: str) -> None:
        self.events.append(("opened_for_write", path))
        super().opened_for_write(path)

    def closed_for_write(self, path: str) -> None:
        self.events.append(("closed_for_write", path))
        super().closed_for_write(path)

    def modified(self, path: str) -> None:
        self.events.append(("modified", path))
        super().modified(path)

    def removed(self, path: str) -> None:
        self.events.append(("removed", path))
        super().removed(path)

    def renamed(self, old: str, new: str) -> None:
        self.events.append(("renamed", old, new))
        super().renamed(old, new)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="casfs.view.testserve")
    p.add_argument("--lower-dir", type=Path, required=True)
    p.add_argument("--upper", type=Path, required=True)
    p.add_argument("--mount", type=Path, required=True)
    p.add_argument("--events", type=Path)
    p.add_argument("--allow-other", action="store_true")
    p.add_argument("--debug", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO, stream=sys.stderr)

    tree, sources = tree_from_dir(args.lower_dir)
    fetcher = DirFetcher(sources)
    tracker = RecordingTracker()
    counters = Counters()
    args.upper.mkdir(parents=True, exist_ok=True)
    ops = OverlayOperations(tree, fetcher, args.upper, tracker, counters)

    def dump() -> None:
        if args.events is None:
            return
        tmp = args.events.with_suffix(".tmp")
        with open(tmp, "w") as f:
            for ev in tracker.events:
                f.write(json.dumps({"event": list(ev)}) + "\n")
            f.write(json.dumps({"counters": counters.snapshot()}) + "\n")
            f.write(json.dumps({"pins": fetcher.pins}) + "\n")
        os.replace(tmp, args.events)

    async def background(nursery: trio.Nursery) -> None:
        async def dump_on_usr1() -> None:
            with trio.open_signal_receiver(signal.SIGUSR1) as sigs:
                async for _ in sigs:
                    dump()

        nursery.start_soon(dump_on_usr1)

    async def on_shutdown() -> None:
        dump()

    serve(
        ops,
        args.mount,
        fsname="casfs-test",
        allow_other=args.allow_other,
        debug=args.debug,
        on_ready=lambda: print("READY", flush=True),
        background=background,
        on_shutdown=on_shutdown,
    )
    dump()
    return 0


if __name__ == "__main__":
    sys.exit(main())
