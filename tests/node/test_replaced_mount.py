"""Replaced paths through real mounts: newest or merged version wins, readers see whole versions."""

from __future__ import annotations

import ast
import os
import pprint
from pathlib import Path
from typing import Any

import pytest

from casfs.store.root import SharedRoot
from tests.fusehelpers import root_objects

pytestmark = pytest.mark.fuse

RANK = "torch_compile_cache/3f2a1b0c9d/rank_0_0/backbone"
INDEX = f"{RANK}/vllm_compile_cache.py"
MODEL = "torch_compile_cache/torch_aot_compile/9a8b/rank_0_0/model"
ARTIFACT = f"{RANK}/inductor_cache/ab/cab.py"


def index_bytes(d: dict[Any, Any]) -> bytes:
    return pprint.PrettyPrinter(indent=4).pformat(d).encode()  # as vLLM writes it


def write(mp: Path, rel: str, data: bytes, *, rename: bool = False) -> None:
    p = mp / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if rename:  # as vLLM's AOT save does: a temp file renamed over the old one
        tmp = p.parent / f".{p.name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, p)
    else:  # as vLLM's save_to_file does: open("w") over the old content
        with open(p, "wb") as f:
            f.write(data)


def test_replaced_paths_across_nodes(cluster: dict[str, Any]) -> None:
    a, b, c = cluster["a"], cluster["b"], cluster["c"]
    mnt: Path = cluster["mnt"]
    wa = a.mount("vllm", mountpoint=mnt / "a")
    ma = wa.cfg.mountpoint
    write(ma, INDEX, index_bytes({((1, 8), 0, "inductor"): {"graph_handle": ("h1", "x")}}))
    write(ma, MODEL, b"model-from-a", rename=True)
    write(ma, ARTIFACT, b"artifact-from-a")
    assert a.ask(wa, "publish")["ok"]

    wb = b.mount("vllm", mountpoint=mnt / "b")
    mb = wb.cfg.mountpoint
    assert (mb / MODEL).read_bytes() == b"model-from-a"
    # B's engine adds a compile range (its index only knows its own), re-saves the
    # AOT artifact, and compiles one graph with other bytes.
    write(mb, INDEX, index_bytes({((9, 16), 0, "inductor"): {"graph_handle": ("h2", "y")}}))
    write(mb, MODEL, b"model-from-b, longer", rename=True)
    write(mb, ARTIFACT, b"artifact-from-b")
    out = b.ask(wb, "publish")
    assert out["ok"], out

    snap = SharedRoot.open(cluster["root"]).generations().entries("testns").entries
    objects = root_objects(cluster["root"])
    merged = ast.literal_eval(objects.get_bytes(snap[INDEX].digest).decode())
    assert set(merged) == {((1, 8), 0, "inductor"), ((9, 16), 0, "inductor")}
    assert objects.get_bytes(snap[MODEL].digest) == b"model-from-b, longer"
    assert objects.get_bytes(snap[ARTIFACT].digest) == b"artifact-from-a"  # first writer

    # Node C, fresh: reads the merged index; holds the model open across a refresh.
    wc = c.mount("vllm", mountpoint=mnt / "c")
    mc = wc.cfg.mountpoint
    assert ast.literal_eval((mc / INDEX).read_text()) == merged
    held = open(mc / MODEL, "rb")  # noqa: SIM115 (held across the refresh on purpose)
    try:
        assert held.read(5) == b"model"
        # A re-traces again (vLLM's CPU AOT mode does on every run) and publishes.
        a.ask(wa, "refresh")
        # A's own published copies stopped shadowing the newer versions.
        assert (ma / MODEL).read_bytes() == b"model-from-b, longer"
        assert ast.literal_eval((ma / INDEX).read_text()) == merged
        write(ma, MODEL, b"model v3", rename=True)
        assert a.ask(wa, "publish")["ok"]
        assert c.ask(wc, "refresh")["ok"]
        # The old reader finishes the version it opened, whole.
        assert held.read() == b"-from-b, longer"
    finally:
        held.close()
    # Immediately after the refresh: the kernel forgot the old size and pages.
    assert (mc / MODEL).stat().st_size == len(b"model v3")
    assert (mc / MODEL).read_bytes() == b"model v3"
    st = c.ask(wc, "stats")["counters"]
    assert st["replaced_refreshed"] >= 1
    assert a.ask(wa, "stats")["counters"]["replaced_upper_released"] >= 1
    # B still holds its own unpublished-since copy? No: B's copies were published;
    # after a refresh it serves the newest too.
    assert b.ask(wb, "refresh")["ok"]
    assert (mb / MODEL).read_bytes() == b"model v3"
    assert (mb / ARTIFACT).read_bytes() == b"artifact-from-b"  # its own, first-writer elsewhere

    # A longer version while C holds the shorter one open (its inode stays alive):
    # a new open reads every byte of the new version, the old handle the old one.
    held = open(mc / MODEL, "rb")  # noqa: SIM115 (held across the refresh on purpose)
    try:
        assert held.read(5) == b"model"
        write(ma, MODEL, b"model v4, longer than any before", rename=True)
        assert a.ask(wa, "publish")["ok"]
        assert c.ask(wc, "refresh")["ok"]
        assert (mc / MODEL).read_bytes() == b"model v4, longer than any before"
        assert (mc / MODEL).stat().st_size == len(b"model v4, longer than any before")
        assert held.read() == b" v3"
    finally:
        held.close()
