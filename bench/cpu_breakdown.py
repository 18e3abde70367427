"""Where a promotion round's CPU goes (``bench.promotion --breakdown``).

Wraps the steps of one promotion + publication (bench.s3_store's
``run_promotion``) and sums ``time.thread_time`` per step, so the figures hold
on a loaded machine. zstd runs serially in the packing thread here (its native
threads would be invisible to thread_time): its figure is the single-threaded
cost. A step's figure includes what it calls; a phase's ``rest`` is its
thread's CPU outside the named steps (the interpreter's per-file work).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

# (module, attribute, step): the attribute is patched where the code looks it up.
_STEPS = [
    ("casfs.promote.promoter", "read_regular", "read files"),
    ("casfs.promote.promoter", "read_regular_stat", "read files"),
    ("casfs.promote.promoter", "digest_bytes", "blake3"),
    ("casfs.promote.promoter", "Promoter._check", "check (lstat, rules, group check)"),
    ("casfs.promote.promoter", "Promoter._finish", "finish (lstat, entry)"),
    ("casfs.index.node_index", "NodeIndex.get_promoted_many", "index"),
    ("casfs.index.node_index", "NodeIndex.pack_locations", "index"),
    ("casfs.index.node_index", "NodeIndex.add_promoted_many", "index"),
    ("casfs.index.node_index", "NodeIndex.mark_published", "index"),
    ("casfs.index.node_index", "NodeIndex.pending", "index"),
    ("casfs.index.lower", "LmdbLowerTree.lookup", "index"),
    ("casfs.store.generations", "GenerationStore._next_record", "manifest"),
    ("casfs.store.backend", "LocalBackend.sync", "syncfs"),
    ("casfs.store.objects", "ObjectStore.encode_many", "zstd"),
    ("casfs.store.packs", "write_pack", "pack files (write, blake3)"),
    ("casfs.promote.promoter", "Promoter._probe", "loose probes"),
]
# Entry points: the phase each thread's CPU is counted under.
_PHASES = [
    ("casfs.promote.promoter", "Promoter._run_once", "promotion"),
    ("casfs.promote.publisher", "Publisher.publish", "publication"),
    ("casfs.store.packs", "PackWriter.add_many", "packing thread"),
    ("casfs.promote.promoter", "Promoter._probe", "probe threads"),  # rare now
]


def _owner(module: str, attr: str) -> tuple[Any, str]:
    obj: Any = __import__(module, fromlist=["_"])
    *owners, name = attr.split(".")
    for o in owners:
        obj = getattr(obj, o)
    return obj, name


@contextlib.contextmanager
def breakdown(out: dict[str, float]) -> Iterator[None]:
    """Measure inside the ``with``; ``out`` gets CPU-seconds per phase and step on exit."""
    import casfs.promote.promoter as promoter

    cpu: dict[str, float] = defaultdict(float)
    local = threading.local()
    saved: list[tuple[Any, str, Any]] = []

    def patch(module: str, attr: str, make: Any) -> None:
        owner, name = _owner(module, attr)
        fn = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        saved.append((owner, name, fn))
        setattr(owner, name, make(fn))

    def phase_of(fn: Any, phase: str) -> Any:
        def wrapped(*a: Any, **kw: Any) -> Any:
            outer = getattr(local, "phase", None)
            if outer is not None:
                return fn(*a, **kw)
            local.phase, t0 = phase, time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                cpu[f"{phase}: total"] += time.thread_time() - t0
                local.phase = None
        return wrapped

    def step_of(fn: Any, step: str) -> Any:
        def wrapped(*a: Any, **kw: Any) -> Any:
            if getattr(local, "step", None) is not None:
                return fn(*a, **kw)  # nested: counted in the outer step
            local.step, t0 = step, time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                cpu[f"{getattr(local, 'phase', None) or 'other'}: {step}"] += (
                    time.thread_time() - t0)
                local.step = None
        return wrapped

    for module, attr, step in _STEPS:
        patch(module, attr, lambda fn, s=step: step_of(fn, s))
    for module, attr, phase in _PHASES:
        patch(module, attr, lambda fn, p=phase: phase_of(fn, p))
    zstd_threads, promoter.ZSTD_THREADS = promoter.ZSTD_THREADS, 1
    try:
        yield
    finally:
        promoter.ZSTD_THREADS = zstd_threads
        for owner, name, fn in reversed(saved):
            setattr(owner, name, fn)
    for phase in {k.split(": ")[0] for k in cpu if k.endswith(": total")}:
        named = sum(v for k, v in cpu.items()
                    if k.startswith(f"{phase}: ") and not k.endswith(": total"))
        cpu[f"{phase}: rest"] = cpu[f"{phase}: total"] - named
    out.update({k: round(v, 4) for k, v in sorted(cpu.items())})
