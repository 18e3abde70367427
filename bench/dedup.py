"""5. Dedup and growth: 8 nodes compiling overlapping sets (80 % shared) and publishing.

Each node's cache is a Triton-like tree: the same shared kernels (80 %) plus
kernels only it compiled (20 %). Each node imports its tree into one namespace
of one shared root (what promotion + publication do, through the importer).
Compared: the shared root's bytes (objects, manifests, records), the unique
bytes (each distinct file once, uncompressed), the same compressed with zstd
(what an ideal deduplicating compressed store needs), and per-job copy-back
(one tar+zstd archive of each node's whole cache, as jobs do today).
"""

from __future__ import annotations

import subprocess

from bench import tree
from bench.common import Result, Settings, Target, du_bytes, log, ratio, rmtree
from casfs.families import rules as family_rules
from casfs.promote.importer import import_tree
from casfs.store.root import SharedRoot

NODES = 8


def run(s: Settings) -> list[Result]:
    work = s.workdir / "dedup"
    per_node = 100 if s.quick else 600  # kernel dirs per node
    shared = int(per_node * 0.8)
    root_path = work / "root"
    root = SharedRoot.open(root_path, create=True)
    archives = 0
    for n in range(NODES):
        src = work / f"node{n}"
        tree.build(src, shared, seed="shared")
        tree.build(src, per_node - shared, seed=f"own{n}")
        log(f"dedup: node {n + 1}/{NODES} publishes {per_node * tree.FILES_PER_KERNEL} files")
        import_tree(root, src, "bench-dedup", rules=family_rules("triton"), node=f"node{n}")
        arc = work / f"node{n}.tar.zst"
        subprocess.run(["bash", "-c", f"tar -C '{src}' -cf - . | zstd -q -3 -T0 -o '{arc}'"],
                       check=True)
        archives += arc.stat().st_size
        if n:
            rmtree(src)
    # Unique content: node 0's tree plus every other node's own kernels.
    uniq = work / "unique"
    tree.build(uniq, shared, seed="shared")
    for n in range(NODES):
        tree.build(uniq, per_node - shared, seed=f"own{n}")
    unique_bytes, _ = du_bytes(uniq)
    uarc = work / "unique.tar.zst"
    subprocess.run(["bash", "-c", f"tar -C '{uniq}' -cf - . | zstd -q -3 -T0 -o '{uarc}'"],
                   check=True)
    unique_zstd = uarc.stat().st_size
    stored, allocated = du_bytes(root_path)
    objects, _ = du_bytes(root_path / "objects")
    rec = root.generations().latest("bench-dedup")
    rmtree(work)
    assert rec is not None
    figures = {
        "nodes": NODES, "files_per_node": per_node * tree.FILES_PER_KERNEL,
        "published_files": rec.entries, "unique_mb": round(unique_bytes / 1e6, 2),
        "unique_zstd_mb": round(unique_zstd / 1e6, 2),
        "shared_root_mb": round(stored / 1e6, 2), "shared_root_allocated_mb":
            round(allocated / 1e6, 2), "objects_mb": round(objects / 1e6, 2),
        "copy_back_archives_mb": round(archives / 1e6, 2),
    }
    ratios = {
        "shared_root_over_unique": ratio(stored, unique_bytes),
        "shared_root_over_unique_zstd": ratio(stored, unique_zstd),
        "allocated_over_unique": ratio(allocated, unique_bytes),
        "copy_back_over_shared_root": ratio(archives, stored, 2),
    }
    return [Result("dedup", f"{NODES} nodes, 80% shared", figures, ratios,
                   [Target("shared_root_over_unique", 1.05)],
                   notes=["unique = distinct files once, uncompressed; casfs compresses, so"
                          " shared_root_over_unique_zstd is the overhead over an ideal"
                          " compressed store"])]
