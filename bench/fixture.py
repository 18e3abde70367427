"""The shared root every benchmark reads from, built once per run.

One Triton-like tree of the largest size (100,000 files; 10,000 with --quick) is
written and imported with casfs's importer (what ``casfs import`` runs); smaller
generations are published from subsets of its entries, and plain-directory
copies of the subsets are hard-linked out of it (cheap to make; ``cp -a``,
rsync and tar copy their contents as ordinary files).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import tree
from bench.common import log
from casfs.families import rules as family_rules
from casfs.promote.importer import import_tree
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot


@dataclass
class Fixture:
    workdir: Path
    root_path: Path
    src: Path
    kernels: int
    files: int
    nbytes: int
    import_seconds: float
    namespace: str = "bench-big"
    subsets: dict[int, tuple[str, Path]] = field(default_factory=dict)  # files -> (ns, dir)

    def root(self) -> SharedRoot:
        return SharedRoot.open(self.root_path)

    def subset(self, files: int) -> tuple[str, Path]:
        """(namespace, plain dir) of a generation with ``files`` files (made on first use)."""
        if files in self.subsets:
            return self.subsets[files]
        k = tree.kernels_for(files)
        if k >= self.kernels:
            self.subsets[files] = (self.namespace, self.src)
            return self.subsets[files]
        keys = {tree.kernel_key("ready", i) for i in range(k)}
        ns = f"bench-{files}"
        gens = self.root().generations()
        snap = gens.entries(self.namespace)
        chosen: list[Entry] = [e for p, e in snap.entries.items() if p.split("/", 1)[0] in keys]
        gens.publish(ns, chosen, node="bench")
        d = self.workdir / f"src-{files}"
        for key in keys:
            (d / key).mkdir(parents=True)
            for name in os.listdir(self.src / key):
                os.link(self.src / key / name, d / key / name)
        self.subsets[files] = (ns, d)
        return ns, d


def build(workdir: Path, files: int) -> Fixture:
    kernels = tree.kernels_for(files)
    src = workdir / "src-big"
    log(f"fixture: writing a Triton-like tree of {kernels * tree.FILES_PER_KERNEL} files")
    nfiles, nbytes = tree.build(src, kernels, seed="ready")
    root_path = workdir / "root"
    root = SharedRoot.open(root_path, create=True)
    log(f"fixture: importing it ({nbytes / 1e6:.0f} MB)")
    t0 = time.perf_counter()
    rep = import_tree(root, src, "bench-big", rules=family_rules("triton"), node="bench")
    dt = time.perf_counter() - t0
    assert rep.files == nfiles, (rep.files, nfiles, rep.skipped_other[:5])
    fx = Fixture(workdir, root_path, src, kernels, nfiles, nbytes, round(dt, 3))
    fx.subsets[nfiles] = (fx.namespace, src)
    return fx
