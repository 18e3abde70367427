"""FUSE requests per file, by operation: a load-independent measure of the FUSE path.

    python -m bench.fusecount write KERNELS     the Triton put pattern into an empty view
    python -m bench.fusecount read KERNELS      a Triton-like lower tree, read twice
    python -m bench.fusecount chunked KERNELS   the put pattern, 4 KB per write() (a linker)

Serves casfs's view (OverlayOperations over a plain-directory lower, as in
casfs.view.testserve) with every handler counted, runs the bench client against
it in a child process and prints one JSON line: requests per file for each
operation, per pass. Timing on a loaded machine is noise; a request count is not.
"""

from __future__ import annotations

import collections
import functools
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyfuse3
import trio

from bench import tree
from casfs.promote.tracker import WriteTracker
from casfs.util.counters import Counters
from casfs.view.ops import OverlayOperations
from casfs.view.session import serve
from casfs.view.testserve import DirFetcher, tree_from_dir

HANDLERS = ("lookup", "forget", "getattr", "setattr", "readlink", "open", "create", "read",
            "write", "flush", "fsync", "release", "opendir", "readdir", "releasedir", "mkdir",
            "rmdir", "unlink", "rename", "link", "symlink", "mknod", "statfs", "access",
            "getxattr", "listxattr", "setxattr", "removexattr", "fsyncdir")


def counting_ops(*args: Any, **kw: Any) -> tuple[OverlayOperations, collections.Counter[str]]:
    counts: collections.Counter[str] = collections.Counter()

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        async def counted(*a: Any, **k: Any) -> Any:
            counts[name] += 1
            return await fn(*a, **k)

        return counted

    ops = OverlayOperations(*args, **kw)
    for name in HANDLERS:
        fn = getattr(ops, name, None)
        if fn is not None:
            setattr(ops, name, wrap(name, fn))
    return ops, counts


def measure(mode: str, kernels: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="casfs-fusecount-"))
    try:
        lower_dir, upper, mnt = work / "lower", work / "upper", work / "mnt"
        lower_dir.mkdir()
        mnt.mkdir()
        files = kernels * tree.FILES_PER_KERNEL
        if mode == "read":
            tree.build(lower_dir, kernels, seed="count")
        lower, sources = tree_from_dir(lower_dir)
        ops, counts = counting_ops(lower, DirFetcher(sources), upper, WriteTracker(), Counters())
        passes: dict[str, dict[str, float]] = {}
        client = [sys.executable, "-m", "bench.clients"]

        async def run_pass(label: str, cmd: list[str]) -> None:
            before = collections.Counter(counts)
            await trio.run_process(cmd, capture_stdout=True)
            delta = counts - before
            passes[label] = {k: round(v / files, 2) for k, v in sorted(delta.items())}
            passes[label]["total"] = round(sum(delta.values()) / files, 2)

        async def background(nursery: trio.Nursery) -> None:
            async def drive() -> None:
                if mode == "write":
                    await run_pass("write", [*client, "write", str(mnt), str(kernels), "c"])
                elif mode == "chunked":
                    await run_pass("chunked", [*client, "write", str(mnt), str(kernels), "c",
                                               "4096"])
                else:
                    await run_pass("first", [*client, "read", str(mnt)])
                    await run_pass("warm", [*client, "read", str(mnt)])
                pyfuse3.terminate()

            nursery.start_soon(drive)

        serve(ops, mnt, background=background)
        return {"mode": mode, "files": files, "requests_per_file": passes}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("read", "write", "chunked"):
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(measure(argv[0], int(argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
