"""Store figures: import throughput, export vs ``cp -a``, growth on re-import, compression.

Usage: ``python -m bench.store_figures [--inductor-cache DIR] [--files 10000] [--workdir DIR]``

Prints one JSON document. Two trees are measured:

- ``inductor``: a real TorchInductor cache directory (``--inductor-cache``), or one made
  here by running ``casfs.demo.inductor_workload`` in a fresh process;
- ``synthetic_triton``: ``--files`` files in Triton-like kernel directories (IR text that
  compresses like real IR, random "cubin" bytes that do not, a ``__grp__`` record per
  kernel), median file size about 20 KB.

For each: a cold import into a fresh shared root (MB/s and files/s of logical bytes),
a second import of the same tree (time and store growth in bytes, expected 0), export
of the generation vs ``cp -a`` of the source tree (same page-cache state: both read
warm sources), and the store's dedup and compression ratios (``casfs du``).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from casfs.families import rules as family_rules
from casfs.promote.importer import import_tree
from casfs.store import maintenance
from casfs.store.export import export_tree
from casfs.store.root import SharedRoot

# Triton kernel directory: (extension, median size, text?)
KERNEL_FILES = [("ttir", 16_000, True), ("ttgir", 20_000, True), ("llir", 40_000, True),
                ("ptx", 32_000, True), ("cubin", 24_000, False), ("json", 2_000, True)]
_IR_WORDS = ["%0", "%1", "%arg0", "=", "tt.load", "tt.store", "arith.addf", "arith.mulf",
             "tt.splat", "tt.broadcast", "ld.global.f32", "st.global.f32", "mov.u32",
             "add.s32", "mad.lo.s32", "setp.lt.s32", "bra", "define", "void", "@kernel", "ptr",
             "addrspace(1)", "i32", "float", "getelementptr", "inbounds", "%r1", "%r2", "%f1",
             "%f2", "%rd1", "%rd2", ";", "loc(#loc1)", "scf.for", "tt.reduce", "tt.dot"]


def _ir_pool(size: int = 4 << 20) -> bytes:
    rng = random.Random(11)
    lines, n = [], 0
    while n < size:
        line = f"  {' '.join(rng.choice(_IR_WORDS) for _ in range(rng.randint(3, 12)))}" \
               f" {rng.randint(0, 4096)}\n"
        lines.append(line)
        n += len(line)
    return "".join(lines).encode()


def synthetic_triton_tree(dest: Path, files: int) -> None:
    pool = _ir_pool()
    per_kernel = len(KERNEL_FILES) + 1
    for k in range(max(1, files // per_kernel)):
        key = base64.b32encode(hashlib.sha256(f"k{k}".encode()).digest()).decode()[:52]
        kdir = dest / key
        kdir.mkdir(parents=True)
        rng = random.Random(k)
        children = {}
        for ext, median, text in KERNEL_FILES:
            size = max(64, int(median * rng.uniform(0.75, 1.25)))
            head = f"// {key}/k.{ext}\n".encode()
            if text:
                off = rng.randrange(0, len(pool) - size)
                body = pool[off:off + size]
            else:
                body = rng.randbytes(size)
            (kdir / f"k.{ext}").write_bytes(head + body[: size - len(head)])
            children[f"k.{ext}"] = str(kdir / f"k.{ext}")
        (kdir / "__grp__k.json").write_text(json.dumps({"child_paths": children}))


def inductor_cache(dest: Path) -> dict[str, Any]:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(dest))
    out = subprocess.run([sys.executable, "-m", "casfs.demo.inductor_workload", "--json"],
                         env=env, capture_output=True, text=True, check=True, timeout=1800)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def synthetic_source(work: Path, files: int, result: dict[str, Any]) -> tuple[Path, int]:
    """``files`` Triton-like files under ``work/src`` (synthetic_triton_tree), its file and
    byte counts recorded in ``result`` beside the machine's cores and load; (src, bytes)."""
    result.update({"cpus": os.cpu_count(), "loadavg": round(os.getloadavg()[0], 2)})
    src = work / "src"
    synthetic_triton_tree(src, files)
    count, nbytes = tree_bytes(src)
    result["tree"] = {"files": count, "bytes": nbytes}
    return src, nbytes


def tree_bytes(path: Path) -> tuple[int, int]:
    files = nbytes = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            st = os.lstat(os.path.join(dirpath, n))
            files += 1
            nbytes += st.st_size
    return files, nbytes


def measure(src: Path, family: str, work: Path) -> dict[str, Any]:
    root = SharedRoot.open(work / "root", create=True)
    rules = family_rules(family)
    t0 = time.perf_counter()
    first = import_tree(root, src, "bench", rules=rules, node="bench")
    t_import = time.perf_counter() - t0
    stored_before = tree_bytes(root.path)
    t0 = time.perf_counter()
    second = import_tree(root, src, "bench", rules=rules, node="bench")
    t_reimport = time.perf_counter() - t0
    stored_after = tree_bytes(root.path)
    rec = root.generations().resolve("bench", None)
    t0 = time.perf_counter()
    exp = export_tree(root, rec, work / "export")
    t_export = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run(["cp", "-a", str(src), str(work / "cp")], check=True)
    t_cp = time.perf_counter() - t0
    usage = maintenance.usage(root, "bench").to_json()
    mb = first.bytes / 1e6
    return {
        "source_files": tree_bytes(src)[0],
        "imported_files": first.files,
        "logical_bytes": first.bytes,
        "median_file_bytes": _median_size(src),
        "import_seconds": round(t_import, 3),
        "import_mb_per_s": round(mb / t_import, 2),
        "import_files_per_s": round(first.files / t_import, 1),
        "reimport_seconds": round(t_reimport, 3),
        "reimport_new_objects": second.new_objects,
        "reimport_added": second.publish.added if second.publish else None,
        "store_growth_on_reimport_bytes": stored_after[1] - stored_before[1],
        "store_growth_on_reimport_files": stored_after[0] - stored_before[0],
        "export_seconds": round(t_export, 3),
        "export_failed": len(exp.failed),
        "cp_a_seconds": round(t_cp, 3),
        "export_vs_cp_a": round(t_export / t_cp, 2) if t_cp else None,
        "stored_bytes": usage["stored_bytes"],
        "dedup_ratio": usage["dedup_ratio"],
        "compression_ratio": usage["compression_ratio"],
    }


def _median_size(path: Path) -> int:
    sizes = sorted(os.lstat(os.path.join(d, n)).st_size for d, _, ns in os.walk(path) for n in ns)
    return sizes[len(sizes) // 2] if sizes else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.store_figures")
    p.add_argument("--inductor-cache", type=Path, help="an existing TORCHINDUCTOR_CACHE_DIR")
    p.add_argument("--files", type=int, default=10_000, help="synthetic Triton tree size")
    p.add_argument("--workdir", type=Path, help="scratch space (default: a temp dir)")
    p.add_argument("--skip-inductor", action="store_true")
    args = p.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="casfs-bench-", dir=args.workdir))
    out: dict[str, Any] = {"bench": "store_figures", "cpus": os.cpu_count(),
                           "loadavg": list(os.getloadavg())}
    try:
        if not args.skip_inductor:
            cache = args.inductor_cache
            if cache is None:
                cache = base / "inductor-cache"
                run = inductor_cache(cache)
                out["inductor_workload"] = {k: run[k] for k in ("compile_seconds", "counters")}
            (base / "ind").mkdir()
            out["inductor"] = measure(cache, "inductor", base / "ind")
        src = base / "triton-src"
        synthetic_triton_tree(src, args.files)
        (base / "tri").mkdir()
        out["synthetic_triton"] = measure(src, "triton", base / "tri")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
