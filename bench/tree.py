"""Synthetic Triton-like cache trees: kernel directories of 7 files, ~20 KB median.

Layout per kernel (Triton 3.x, ``FileCacheManager``): ``<KEY>/`` with KEY 52 base32
characters, holding ``k.ttir k.ttgir k.llir k.ptx k.cubin k.json`` and the commit
record ``__grp__k.json`` whose ``child_paths`` name the others by absolute path.
IR files are text (compresses ~3-5x with zstd, like real IR); the cubin is random
bytes (stored raw, like real ELF code). Every file is unique (its header names the
kernel), so dedup only happens where a benchmark shares kernels on purpose.

Size plan (bytes, before a +-25 % per-kernel jitter); the median of the 7 is 20 KB:
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

SIZES = {
    "ttir": 16_000,
    "ttgir": 20_000,
    "llir": 40_000,
    "ptx": 32_000,
    "cubin": 24_000,
    "json": 2_000,
}
FILES_PER_KERNEL = len(SIZES) + 1  # + the group file
GROUP_PREFIX = "/run/casfs/triton"  # where Triton would have written it (absolute paths)
_WORDS = [
    "%0",
    "%1",
    "%arg0",
    "=",
    "tt.load",
    "tt.store",
    "arith.addf",
    "arith.mulf",
    "tt.splat",
    "tt.broadcast",
    "ld.global.f32",
    "st.global.f32",
    "mov.u32",
    "add.s32",
    "mad.lo.s32",
    "setp.lt.s32",
    "bra",
    "define",
    "void",
    "@kernel",
    "ptr",
    "addrspace(1)",
    "i32",
    "float",
    "getelementptr",
    "inbounds",
    "#blocked",
    "=",
    "#triton_gpu.blocked<{sizePerThread",
    "=",
    "[1],",
    "threadsPerWarp",
    "=",
    "[32]}>",
    "%r1",
    "%r2",
    "%f1",
    "%f2",
    "%rd1",
    "%rd2",
    ";",
    "loc(#loc1)",
    "scf.for",
    "tt.reduce",
    "tt.dot",
]


def _text_pool(seed: int = 7, size: int = 4 << 20) -> bytes:
    rng = random.Random(seed)
    out: list[str] = []
    n = 0
    while n < size:
        line = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
        line = f"  {line} {rng.randint(0, 4096)}\n"
        out.append(line)
        n += len(line)
    return "".join(out).encode()[:size]


_POOL = _text_pool()


def kernel_key(seed: str, i: int) -> str:
    return base64.b32encode(hashlib.sha256(f"{seed}:{i}".encode()).digest()).decode()[:52]


def kernel_files(seed: str, i: int) -> Iterator[tuple[str, bytes]]:
    """(relative path, content) of kernel ``i`` of the tree named ``seed``."""
    key = kernel_key(seed, i)
    rng = random.Random(f"{seed}:{i}")
    children = {}
    for ext, base in SIZES.items():
        size = max(64, int(base * rng.uniform(0.75, 1.25)))
        name = f"k.{ext}"
        head = f"// {key}/{name}\n".encode()
        if ext == "cubin":
            body = rng.randbytes(size)
        else:
            off = rng.randrange(0, len(_POOL) - size)
            body = _POOL[off : off + size]
        children[name] = f"{GROUP_PREFIX}/{key}/{name}"
        yield f"{key}/{name}", head + body[: size - len(head)]
    group = json.dumps({"child_paths": children}).encode()
    yield f"{key}/__grp__k.json", group


def build(dest: Path, kernels: int, seed: str = "t", start: int = 0) -> tuple[int, int]:
    """Write kernels ``start .. start+kernels-1`` under ``dest``; (files, bytes)."""
    files = nbytes = 0
    for i in range(start, start + kernels):
        for rel, data in kernel_files(seed, i):
            p = dest / rel
            if files % FILES_PER_KERNEL == 0:
                p.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            files += 1
            nbytes += len(data)
    return files, nbytes


def kernels_for(files: int) -> int:
    return max(1, round(files / FILES_PER_KERNEL))
