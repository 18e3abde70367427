"""Compile time per entry (docs/format.md "cs"): a job that makes a missing Triton kernel
through a fuse mount publishes how long it took (first miss to last write) on the
kernel's group file; a job on another node that hits it counts those seconds saved,
once per entry, in every view mode; each mount writes an outcome record at release."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from casfs.store import outcomes
from casfs.store.entry import compile_seconds
from casfs.store.root import SharedRoot
from casfs.view import overlay

from .test_two_nodes import published

pytestmark = pytest.mark.fuse

KEY = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567ABCDEFGHIJKLMNOPQRST"  # 52 base32 characters
COMPILE_S = 1.5


def _compile(mnt: Path, key: str = KEY) -> None:
    """What Triton does on a miss: look the key up, compile, write the files, then the group."""
    assert not (mnt / key).exists()  # the miss the clock starts from
    time.sleep(COMPILE_S)
    (mnt / key).mkdir()
    (mnt / key / "k.cubin").write_bytes(b"\x7fELF kernel " + key.encode())
    (mnt / key / "k.json").write_text('{"name": "k"}')
    group = {"child_paths": {n: str(mnt / key / n) for n in ("k.cubin", "k.json")}}
    (mnt / key / "__grp__k.json").write_text(json.dumps(group))


def _outcome_rows(root: Path) -> list[outcomes.Row]:
    return outcomes.read(SharedRoot.open(root).backend, "testns").rows


def test_compile_seconds_published_and_counted_on_hits(cluster: dict[str, Any]) -> None:
    root, a, b = cluster["root"], cluster["a"], cluster["b"]
    w = a.mount(family="triton")
    _compile(w.cfg.mountpoint)
    (w.cfg.mountpoint / "cuda_utils.so").write_bytes(b"launcher")  # no entry's file
    a.stop(w)
    entries = published(root)
    cs = compile_seconds(entries[f"{KEY}/__grp__k.json"])
    assert cs is not None and COMPILE_S <= cs < COMPILE_S + 30, entries
    # One row per entry: the group file (its commit record) only.
    assert [p for p, e in entries.items() if compile_seconds(e) is not None] == [
        f"{KEY}/__grp__k.json"]
    rows = _outcome_rows(root)
    assert len(rows) == 1 and rows[0].misses >= 1 and rows[0].hits == 0

    # Node b's job hits the kernel: every file of it opened, twice; saved once.
    w = b.mount(family="triton")
    for _ in range(2):
        for n in ("__grp__k.json", "k.cubin", "k.json"):
            assert (w.cfg.mountpoint / KEY / n).read_bytes()
    wait_until(lambda: b.ask(w, "stats")["counters"].get("entries_hit", 0) >= 1,
               "the hit was not counted")
    c = b.ask(w, "stats")["counters"]
    assert c["entries_hit"] == 1 and c["compile_ms_saved"] == round(cs * 1000)
    assert not c.get("entries_missed")
    b.stop(w)
    rows = sorted(_outcome_rows(root), key=lambda r: r.hits)
    assert [(r.hits, r.saved_ms) for r in rows] == [(0, 0), (1, round(cs * 1000))]
    assert {r.day for r in rows} == {outcomes.day_of(time.time())}


@pytest.mark.parametrize("mode", ["overlay", "dir"])
def test_hits_counted_in_every_mode(cluster: dict[str, Any], mode: str) -> None:
    if mode == "overlay" and (why := overlay.unavailable_reason()) is not None:
        pytest.skip(why)
    root, a, b = cluster["root"], cluster["a"], cluster["b"]
    w = a.mount(family="triton")
    _compile(w.cfg.mountpoint)
    a.stop(w)
    cs = compile_seconds(published(root)[f"{KEY}/__grp__k.json"])
    assert cs is not None
    kw: dict[str, Any] = {"mode": mode}
    if mode == "dir":
        kw["mountpoint"] = cluster["mnt"] / "plain"
    w = b.mount(family="triton", **kw)
    assert (w.cfg.mountpoint / KEY / "k.cubin").read_bytes()
    wait_until(lambda: b.ask(w, "stats")["counters"].get("entries_hit", 0) >= 1,
               f"the hit was not counted in {mode} mode")
    assert b.ask(w, "stats")["counters"]["compile_ms_saved"] == round(cs * 1000)
    b.stop(w)


@pytest.mark.parametrize("mode", ["overlay", "dir"])
def test_what_each_mode_times(cluster: dict[str, Any], mode: str) -> None:
    """overlay: overlayfs's lookups in the FUSE lower layer start the clock; dir mode
    sees no failed lookup and publishes no figure."""
    if mode == "overlay" and (why := overlay.unavailable_reason()) is not None:
        pytest.skip(why)
    root, a = cluster["root"], cluster["a"]
    kw: dict[str, Any] = {"mode": mode}
    if mode == "dir":
        kw["mountpoint"] = cluster["mnt"] / "plain"
    w = a.mount(family="triton", **kw)
    _compile(w.cfg.mountpoint)
    if mode == "dir":
        os.sync()
    a.stop(w)
    cs = compile_seconds(published(root)[f"{KEY}/__grp__k.json"])
    if mode == "dir":
        assert cs is None
    else:
        assert cs is not None and cs >= COMPILE_S


def test_summary_line_says_what_was_saved() -> None:
    from casfs.cli.summary import summary_line

    st = {"namespace": "triton-ab", "counters": {
        "entries_hit": 37, "compile_ms_saved": 212_400, "entries_hit_untimed": 2}}
    line = summary_line("triton", st)
    assert "; 37 entries hit, saved ~212 s of compilation (2 with no recorded compile time)" \
        in line
    assert "saved" not in summary_line("triton", {"namespace": "n", "counters": {}})
