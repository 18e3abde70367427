"""Client processes for the read and write benchmarks; each prints one JSON line.

    python -m bench.clients read DIR [DIR...]   open+read every file under the DIRs
    python -m bench.clients probe DIR N          stat N missing names in every directory
    python -m bench.clients write DIR KERNELS SEED [CHUNK]
        write a Triton-like tree the way triton.runtime.cache.FileCacheManager.put
        does (triton 3.7.1): makedirs(<KEY>), then per file mkdir
        <KEY>/tmp.pid_<pid>_<uuid>/, write the file there, os.replace it into
        <KEY>/, os.removedirs the temp dir (whose final rmdir of <KEY> fails
        ENOTEMPTY); the group file last. With CHUNK, each file is written
        CHUNK bytes per write() call (the linker writes .so files 1-16 KB at a time).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import uuid
from pathlib import Path


def read_all(*tops: str) -> dict[str, float]:
    c0 = time.process_time()
    t0 = time.perf_counter()
    files = nbytes = 0
    for dirpath, _, names in (w for top in tops for w in os.walk(top)):
        for n in names:
            with open(os.path.join(dirpath, n), "rb") as f:
                while chunk := f.read(1 << 20):
                    nbytes += len(chunk)
            files += 1
    dt = time.perf_counter() - t0
    # the pass's own CPU (user + sys), without the interpreter's start-up
    cpu = time.process_time() - c0
    return {"files": files, "bytes": nbytes, "seconds": round(dt, 4),
            "files_per_s": round(files / dt, 1), "cpu_seconds": round(cpu, 4)}


def write_tree(top: str, kernels: int, seed: str, chunk: int = 0) -> dict[str, float]:
    from bench.tree import kernel_files

    todo = [list(kernel_files(seed, i)) for i in range(kernels)]  # generated before timing
    pid = os.getpid()
    c0 = time.process_time()
    t0 = time.perf_counter()
    files = nbytes = 0
    for kernel in todo:
        key_dir = os.path.join(top, kernel[0][0].split("/")[0])
        os.makedirs(key_dir, exist_ok=True)
        for rel, data in kernel:
            name = rel.split("/")[1]
            tmp_dir = os.path.join(key_dir, f"tmp.pid_{pid}_{uuid.uuid4()}")
            os.makedirs(tmp_dir, exist_ok=True)
            tmp = os.path.join(tmp_dir, name)
            with open(tmp, "wb", buffering=0) as f:
                if chunk:
                    for off in range(0, len(data), chunk):
                        f.write(data[off:off + chunk])
                else:
                    f.write(data)
            os.replace(tmp, os.path.join(key_dir, name))
            with contextlib.suppress(OSError):
                os.removedirs(tmp_dir)
            files += 1
            nbytes += len(data)
    dt = time.perf_counter() - t0
    # the pass's own CPU (user + sys), without the interpreter's start-up
    cpu = time.process_time() - c0
    return {"files": files, "bytes": nbytes, "seconds": round(dt, 4),
            "files_per_s": round(files / dt, 1), "cpu_seconds": round(cpu, 4)}


def probe_missing(top: str, per_dir: int) -> dict[str, float]:
    """stat ``per_dir`` names that do not exist in every directory under ``top`` (what
    compilers do looking for cache keys and autotune results before compiling)."""
    dirs = [d for d, _, _ in os.walk(top)]
    t0 = time.perf_counter()
    misses = 0
    for d in dirs:
        for i in range(per_dir):
            try:
                os.stat(os.path.join(d, f"missing-{i}.json"))
            except FileNotFoundError:
                misses += 1
    dt = time.perf_counter() - t0
    return {"files": misses, "seconds": round(dt, 4), "files_per_s": round(misses / dt, 1)}


def main(argv: list[str]) -> int:
    if argv[:1] == ["read"] and len(argv) >= 2:
        out = read_all(*argv[1:])
    elif argv[:1] == ["probe"] and len(argv) == 3:
        out = probe_missing(argv[1], int(argv[2]))
    elif argv[:1] == ["write"] and len(argv) in (4, 5):
        Path(argv[1]).mkdir(parents=True, exist_ok=True)
        out = write_tree(argv[1], int(argv[2]), argv[3], int(argv[4]) if len(argv) == 5 else 0)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
