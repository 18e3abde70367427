"""The FUSE handlers alone, in-process: CPU microseconds per file of a warm read.

    python -m bench.handlers [KERNELS] [REPS]     (default 600 kernels, 7 repetitions)

Builds a Triton-like tree, imports it into a shared root, and builds the
mount's ``MountService`` the way a mount process does, without mounting:
its ``OverlayOperations`` are called directly on the trio loop, as pyfuse3
would (``readdir_reply`` is stubbed: it needs a kernel request). After one
pass that fetches every object into the local cache, each repetition times
(process CPU, the best of REPS) OPEN+RELEASE of every file, OPENDIR+READDIR
+RELEASEDIR of every directory, and GETATTR of every file, per file; then a
Triton put of each file again into fresh kernel directories, as the kernel's
requests for it arrive (17 handler calls a file, the sequence
``bench.fusecount write`` counts), per file, user and system time apart (the
system time is mostly the upper's own mkdir, rmdir and rename). What
pyfuse3, trio and the kernel add per request is not in these figures (see
bench/readpath.py for the mount process's CPU per file, with the pyfuse3
floor beside it); what casfs's own code costs per request is, without the
load noise of a mount on a busy machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pyfuse3
import trio

from bench import tree
from bench.common import rmtree
from bench.mounts import config
from casfs.families import rules as family_rules
from casfs.node.mount import MountService
from casfs.promote.importer import import_tree
from casfs.store.root import SharedRoot

CTX = pyfuse3.RequestContext()


class _TimesOnly:
    """SetattrFields of the writeback cache's time flush (pyfuse3's own is read-only)."""

    update_atime = update_mode = update_uid = update_gid = update_size = False
    update_mtime = update_ctime = True


def measure(kernels: int, reps: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="casfs-handlers-"))
    try:
        src, root = work / "src", work / "root"
        tree.build(src, kernels, seed="handlers")
        import_tree(SharedRoot.open(root, create=True), src, "handlers",
                    rules=family_rules("triton"), node="bench")
        (work / "mnt").mkdir()
        svc = MountService(config(root, work / "node", work / "mnt", "handlers",
                                  family="triton"))
        ops = svc.ops
        assert ops is not None
        real_reply = pyfuse3.readdir_reply
        pyfuse3.readdir_reply = lambda token, name, attrs, off: True
        try:
            return trio.run(_passes, ops, reps)
        finally:
            pyfuse3.readdir_reply = real_reply
            svc.wait_indexed(60)
    finally:
        rmtree(work)


async def _passes(ops: Any, reps: int) -> dict[str, Any]:
    files: list[int] = []
    dirs: list[int] = []

    async def walk(ino: int) -> None:
        fh = await ops.opendir(ino, CTX)
        names = ops._dirs[fh][1]
        await ops.releasedir(fh)
        dirs.append(ino)
        for name in names:
            a = await ops.lookup(ino, name.encode(), CTX)
            if a.st_mode & 0o040000:
                await walk(a.st_ino)
            else:
                files.append(a.st_ino)

    async def opens() -> None:
        for ino in files:
            fi = await ops.open(ino, os.O_RDONLY, CTX)
            await ops.release(fi.fh)

    async def listings() -> None:
        for ino in dirs:
            fh = await ops.opendir(ino, CTX)
            await ops.readdir(fh, 0, None)
            await ops.releasedir(fh)

    async def getattrs() -> None:
        for ino in files:
            await ops.getattr(ino, CTX)

    await walk(ops.inodes.root)
    await opens()  # first touch: every object fetched, verified, cached

    async def best(fn: Callable[[], Awaitable[None]]) -> float:
        out = float("inf")
        for _ in range(reps):
            c0 = time.process_time()
            await fn()
            out = min(out, time.process_time() - c0)
        return round(out / len(files) * 1e6, 2)

    results = {"files": len(files), "dirs": len(dirs),
               "open_release_us_per_file": await best(opens),
               "opendir_readdir_releasedir_us_per_file": await best(listings),
               "getattr_us_per_file": await best(getattrs)}
    # Last (they add kernel dirs to the root). A put's system time is mostly the
    # upper's own mkdir/rmdir/rename on the node's disk (what a plain directory
    # pays too, and what load moves most): user time (the handlers' Python) and
    # system time are reported apart, best of each.
    put_user = put_sys = float("inf")
    for i in range(reps):
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        await put_kernels(ops, len(dirs) - 1, f"put{i}")
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        put_user = min(put_user, r1.ru_utime - r0.ru_utime)
        put_sys = min(put_sys, r1.ru_stime - r0.ru_stime)
    return {**results, "put_user_us_per_file": round(put_user / len(files) * 1e6, 1),
            "put_sys_us_per_file": round(put_sys / len(files) * 1e6, 1)}


async def put_kernels(ops: Any, kernels: int, seed: str) -> None:
    """Triton puts of ``kernels`` new kernel dirs, as the kernel's requests arrive.

    Per file (``bench.clients write``: mkdir a temp dir, create, write, close,
    rename into <KEY>/, removedirs), in the order a mount receives them: the
    GETATTRs are default_permissions re-reading a directory changed just before,
    the two SETATTRs the writeback cache flushing times (at close, after rename).
    """
    root = ops.inodes.root
    for i in range(kernels):
        kernel = list(tree.kernel_files(seed, i))
        key = kernel[0][0].split("/")[0].encode()
        a = await ops.lookup(root, key, CTX)
        if not a.st_ino:
            a = await ops.mkdir(root, key, 0o777, CTX)
        kino = a.st_ino
        for rel, data in kernel:
            name = rel.split("/")[1].encode()
            tmp = f"tmp.pid_1_{seed}_{name.decode()}".encode()
            await ops.getattr(kino, CTX)
            await ops.lookup(kino, tmp, CTX)
            t = await ops.mkdir(kino, tmp, 0o777, CTX)
            await ops.getattr(kino, CTX)
            await ops.lookup(t.st_ino, name, CTX)
            fi, fa = await ops.create(t.st_ino, name, 0o666,
                                      os.O_WRONLY | os.O_CREAT | os.O_TRUNC, CTX)
            await ops.write(fi.fh, 0, data)
            times = pyfuse3.EntryAttributes()
            times.st_mtime_ns = times.st_ctime_ns = time.time_ns()
            await ops.setattr(fa.st_ino, times, _TimesOnly(), None, CTX)
            await ops.release(fi.fh)
            await ops.getattr(t.st_ino, CTX)
            await ops.lookup(kino, name, CTX)
            await ops.rename(t.st_ino, name, kino, name, 0, CTX)
            await ops.setattr(fa.st_ino, times, _TimesOnly(), None, CTX)
            await ops.getattr(kino, CTX)
            await ops.rmdir(kino, tmp, CTX)
            await ops.forget([(t.st_ino, 1)])
            with contextlib.suppress(pyfuse3.FUSEError):  # ENOTEMPTY: removedirs's last step
                await ops.rmdir(root, key, CTX)


def main(argv: list[str]) -> int:
    kernels = int(argv[0]) if argv else 600
    reps = int(argv[1]) if len(argv) > 1 else 7
    print(json.dumps(measure(kernels, reps)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
