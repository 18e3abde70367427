"""FUSE requests per file, by operation: a load-independent measure of the FUSE path.

    python -m bench.fusecount write KERNELS     the Triton put pattern into an empty view
    python -m bench.fusecount read KERNELS      a Triton-like lower tree, read twice
    python -m bench.fusecount chunked KERNELS   the put pattern, 4 KB per write() (a linker)
    python -m bench.fusecount probe KERNELS     stat 7 missing names per directory, twice
                                                (per file: per name probed)
    ... [--floor] [--tasks MIN,MAX]

``--floor``: serve the pyfuse3 write floor (bench.floorwfs, a plain passthrough
facing the kernel as casfs does) instead of casfs's view: it must get the same
requests. ``--tasks``: ``pyfuse3.main(min_tasks, max_tasks)`` (default 1,99).

Serves casfs's view (OverlayOperations over a plain-directory lower, as in
casfs.view.testserve) with every handler counted, runs the bench client against
it in a child process and prints one JSON line: requests per file for each
operation, per pass. Timing on a loaded machine is noise; a request count is not.
Beside the counts: the mount process's user and system CPU per file during the
pass (``server_user_us``, ``server_sys_us``: handlers, pyfuse3 and trio, the
upper's syscalls) and the client's own files/s.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyfuse3
import trio

from bench import tree
from bench.floorwfs import FloorWFS
from casfs.promote.tracker import WriteTracker
from casfs.util.counters import Counters
from casfs.view.ops import OverlayOperations
from casfs.view.session import serve
from casfs.view.testserve import DirFetcher, tree_from_dir

PROBES = 7  # missing names stat-ed per directory in ``probe`` mode

HANDLERS = ("lookup", "forget", "getattr", "setattr", "readlink", "open", "create", "read",
            "write", "flush", "fsync", "release", "opendir", "readdir", "releasedir", "mkdir",
            "rmdir", "unlink", "rename", "link", "symlink", "mknod", "statfs", "access",
            "getxattr", "listxattr", "setxattr", "removexattr", "fsyncdir")


def counting_ops(*args: Any, floor: bool = False, **kw: Any
                 ) -> tuple[pyfuse3.Operations, collections.Counter[str]]:
    counts: collections.Counter[str] = collections.Counter()

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        async def counted(*a: Any, **k: Any) -> Any:
            counts[name] += 1
            return await fn(*a, **k)

        return counted

    ops: pyfuse3.Operations = FloorWFS(*args) if floor else OverlayOperations(*args, **kw)
    for name in HANDLERS:
        fn = getattr(ops, name, None)
        if fn is not None:
            setattr(ops, name, wrap(name, fn))
    return ops, counts


def measure(mode: str, kernels: int, *, floor: bool = False,
            tasks: tuple[int, int] = (1, 99)) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="casfs-fusecount-"))
    try:
        lower_dir, upper, mnt = work / "lower", work / "upper", work / "mnt"
        lower_dir.mkdir()
        mnt.mkdir()
        files = kernels * tree.FILES_PER_KERNEL
        if mode == "probe":
            files = (kernels + 1) * PROBES  # every kernel directory and the top one
        if mode in ("read", "probe"):
            tree.build(lower_dir, kernels, seed="count")
        lower, sources = tree_from_dir(lower_dir)
        if floor:  # a passthrough of the lower dir (empty for the writes)
            ops, counts = counting_ops(lower_dir, floor=True)
        else:
            ops, counts = counting_ops(lower, DirFetcher(sources), upper, WriteTracker(),
                                       Counters())
        passes: dict[str, dict[str, float]] = {}
        client = [sys.executable, "-m", "bench.clients"]

        async def run_pass(label: str, cmd: list[str]) -> None:
            before = collections.Counter(counts)
            t0 = os.times()
            proc = await trio.run_process(cmd, capture_stdout=True)
            t1 = os.times()
            delta = counts - before
            passes[label] = {k: round(v / files, 2) for k, v in sorted(delta.items())}
            passes[label]["total"] = round(sum(delta.values()) / files, 2)
            # This process is the mount (the client is a child): its CPU per file
            # (handlers, pyfuse3, trio; the counting wrappers add ~1 us a request).
            passes[label]["server_user_us"] = round((t1.user - t0.user) / files * 1e6, 1)
            passes[label]["server_sys_us"] = round((t1.system - t0.system) / files * 1e6, 1)
            passes[label]["client_files_per_s"] = json.loads(proc.stdout).get("files_per_s")

        async def background(nursery: trio.Nursery) -> None:
            async def drive() -> None:
                if mode == "write":
                    await run_pass("write", [*client, "write", str(mnt), str(kernels), "c"])
                elif mode == "chunked":
                    await run_pass("chunked", [*client, "write", str(mnt), str(kernels), "c",
                                               "4096"])
                elif mode == "probe":  # per file: PROBES missing names per directory
                    for label in ("first", "again"):
                        await run_pass(label, [*client, "probe", str(mnt), str(PROBES)])
                else:
                    await run_pass("first", [*client, "read", str(mnt)])
                    await run_pass("warm", [*client, "read", str(mnt)])
                pyfuse3.terminate()

            nursery.start_soon(drive)

        main = pyfuse3.main
        pyfuse3.main = functools.partial(main, min_tasks=tasks[0], max_tasks=tasks[1])
        try:
            serve(ops, mnt, background=background)
        finally:
            pyfuse3.main = main
        return {"mode": mode, "server": "floor" if floor else "casfs",
                "tasks": list(tasks), "files": files, "requests_per_file": passes}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str]) -> int:
    floor = "--floor" in argv
    argv = [a for a in argv if a != "--floor"]
    tasks = (1, 99)
    if "--tasks" in argv[:-1]:
        i = argv.index("--tasks")
        lo, hi = argv[i + 1].split(",")
        tasks = (int(lo), int(hi))
        del argv[i:i + 2]
    if len(argv) != 2 or argv[0] not in ("read", "write", "chunked", "probe"):
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(measure(argv[0], int(argv[1]), floor=floor, tasks=tasks)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
