"""Shared pieces: results, timing, medians, temp workspaces, page-cache dropping."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PY = sys.executable


@dataclass
class Target:
    """A goal from the issue: ``metric`` compared with ``limit`` (``le``: at most, ``ge``)."""

    metric: str
    limit: float
    op: str = "le"  # "le" or "ge"

    def check(self, value: float | None) -> bool | None:
        if value is None:
            return None
        return value <= self.limit if self.op == "le" else value >= self.limit

    def text(self) -> str:
        return f"{self.metric} {'<=' if self.op == 'le' else '>='} {self.limit:g}"


@dataclass
class Result:
    """One benchmark row: raw figures, ratios and the targets they are held to."""

    bench: str
    case: str
    figures: dict[str, Any] = field(default_factory=dict)
    ratios: dict[str, float | None] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def value(self, metric: str) -> float | None:
        v = self.ratios.get(metric, self.figures.get(metric))
        return float(v) if isinstance(v, int | float) else None

    def verdicts(self) -> list[dict[str, Any]]:
        return [{"target": t.text(), "value": self.value(t.metric),
                 "met": t.check(self.value(t.metric))} for t in self.targets]

    def to_json(self) -> dict[str, Any]:
        return {"bench": self.bench, "case": self.case, "figures": self.figures,
                "ratios": self.ratios, "targets": self.verdicts(), "raw": self.raw,
                "notes": self.notes}


@dataclass
class Settings:
    quick: bool
    workdir: Path
    repeats: int

    def reps(self, full: int, quick: int = 1) -> int:
        return quick if self.quick else full


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def ratio(a: float | None, b: float | None, nd: int = 3) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, nd)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def repeat(n: int, fn: Callable[[], object], before: Callable[[], object] | None = None
           ) -> list[float]:
    """Time ``fn`` ``n`` times; ``before`` (untimed) runs ahead of each repetition."""
    out = []
    for _ in range(n):
        if before is not None:
            before()
        out.append(round(timed(fn), 4))
    return out


@dataclass
class ProcRun:
    wall: float
    cpu: float  # user + sys of the child and its descendants
    rc: int
    stdout: str


def run_proc(cmd: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None,
             timeout: float = 900) -> ProcRun:
    """Run a child, measuring wall time and the CPU time it (and its children) used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(list(cmd), env=env, cwd=cwd, capture_output=True,
                       text=True, timeout=timeout, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-3000:])
    return ProcRun(round(wall, 3), round(cpu, 3), p.returncode, p.stdout)


def proc_cpu(pid: int) -> float:
    """User + system seconds a live process has used so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int | None) -> dict[int, int]:
    """CPU nanoseconds of each live thread of ``pid`` (schedstat: exact, where
    ``proc_cpu`` counts 10 ms ticks, a 4,000-file pass's whole cost); {} if gone."""
    out: dict[int, int] = {}
    if pid is None:
        return out
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            out[int(t)] = int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[0])
    return out


def cpu_since(pid: int | None, before: dict[int, int]) -> float:
    """Seconds of CPU ``pid``'s threads used since ``before`` (``thread_cpu``); a thread
    that ended meanwhile is left out (its last moments: nothing in the passes here)."""
    now = thread_cpu(pid)
    return sum(ns - before.get(t, 0) for t, ns in now.items()) / 1e9


def drop_caches() -> bool:
    """Drop the page cache (root only); False where not permitted.

    True only means the write was accepted: a container or VM may accept it and
    drop nothing. ``drop_works`` checks that pages really left the cache.
    """
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def resident_fraction(paths: Sequence[Path]) -> float | None:
    """Fraction of the pages of ``paths`` in the page cache (mincore), None if unknown."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = mmap.PAGESIZE
    total = resident = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                continue
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            n = (size + page - 1) // page
            vec = (ctypes.c_ubyte * n)()
            rc = libc.mincore(addr, size, vec)
            libc.munmap(addr, size)
            if rc != 0:
                return None
            total += n
            resident += sum(v & 1 for v in vec)
        finally:
            os.close(fd)
    return resident / total if total else None


def drop_works(sample: Sequence[Path]) -> bool:
    """Read ``sample``, drop caches, and check the pages really left (mincore)."""
    for p in sample:
        p.read_bytes()
    if not drop_caches():
        return False
    frac = resident_fraction(sample)
    return frac is not None and frac < 0.5


def rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def workspace(parent: Path | None, name: str) -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix=f"casfs-bench-{name}-", dir=parent))
    try:
        yield d
    finally:
        rmtree(d)


def du_bytes(path: Path) -> tuple[int, int]:
    """(apparent bytes, allocated bytes) of every file under ``path``."""
    apparent = allocated = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except FileNotFoundError:
                continue
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return apparent, allocated


def scratch_fs(path: Path) -> dict[str, Any]:
    """The filesystem ``path`` lies on: type, source, and for ext4 whether it keeps a
    journal (None where that is not known). An ext4 without one (this VM's root) checks
    every inode it is about to hand out against the ones deleted in the last minutes
    (``recently_deleted``), so after a run's churn each file created costs several times
    more and swings with the minute. A node's disk keeps a journal: ``journaled_scratch``
    (or ``--workdir`` on such a filesystem) gives the figures a node would see
    (docs/performance.md, "A node's disk keeps a journal")."""
    dev = os.stat(path).st_dev
    fstype, source = "?", "?"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            major, minor = left.split()[2].split(":")
            if os.makedev(int(major), int(minor)) == dev:
                fstype, source = right.split()[:2]  # the last match: the top mount
    journal: bool | None = None
    if fstype == "ext4":
        task = Path("/sys/fs/ext4") / os.path.basename(os.path.realpath(source)) / "journal_task"
        with contextlib.suppress(OSError):
            journal = task.read_text().strip() != "<none>"
    return {"path": str(path), "fstype": fstype, "source": source, "journal": journal}


@contextlib.contextmanager
def loop_fs(parent: Path | None, mkfs: Sequence[str], size: int) -> Iterator[Path]:
    """A fresh file system made by ``mkfs`` (its argv; the image is appended) on a
    sparse image of ``size`` bytes in ``parent``, loop-mounted (needs root); removed
    after."""
    base = Path(tempfile.mkdtemp(prefix="casfs-bench-scratch-", dir=parent))
    img, mnt = base / "fs.img", base / "mnt"
    try:
        with open(img, "wb") as f:
            f.truncate(size)
        subprocess.run([*mkfs, str(img)], check=True, capture_output=True)
        mnt.mkdir()
        subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True,
                       capture_output=True)
        try:
            yield mnt
        finally:
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    finally:
        rmtree(base)


@contextlib.contextmanager
def journaled_scratch(parent: Path | None, size: int = 16 << 30) -> Iterator[Path]:
    """A fresh ext4 with a journal, loop-mounted for one benchmark (needs root): where
    a node's files would be created (a sparse image in ``parent``; removed after)."""
    with loop_fs(parent, ["mkfs.ext4", "-q", "-F"], size) as mnt:
        yield mnt


@contextlib.contextmanager
def bench_dir(parent: Path | None, prefix: str, journaled: bool) -> Iterator[Path]:
    """A temp dir for one benchmark in ``parent``; ``journaled``: inside a
    journaled_scratch made there for it."""
    with contextlib.ExitStack() as stack:
        if journaled:
            parent = stack.enter_context(journaled_scratch(parent))
        yield Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix, dir=parent)))


def warn_scratch_fs(fs: dict[str, Any]) -> None:
    """One line on stderr when ``fs`` (scratch_fs) makes file creation unlike a node's."""
    if fs["fstype"] == "ext4" and fs["journal"] is False:
        log(f"{fs['path']} is on ext4 without a journal ({fs['source']}): every file"
            " created there scans recently deleted inodes, and the figures swing with"
            " the minute; --journaled-scratch (or --workdir on a journaled filesystem)"
            " gives a node's")


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)
