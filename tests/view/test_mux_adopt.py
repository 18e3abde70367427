"""What a process adopting the node host's connection reads back (casfs.view.mux).

In-process, real OverlayOperations over real upper dirs: a "dead" mux serves two
namespaces, journals their inodes and keeps its handle table in files; a new
mux restores the layout, attaches each namespace at its slot from its journal,
and must answer the old node ids and handle numbers as the dead one did. The
whole path under a real kernel and casfsd: tests/daemon/test_crash_adopt.py.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pyfuse3
import pytest
import trio

from casfs.util.counters import Counters
from casfs.view.lower import DictLowerTree
from casfs.view.mux import MuxOperations, ns_root_inode
from casfs.view.ops import OverlayOperations
from casfs.view.testserve import RecordingTracker

from .test_mux import CTX, ROOT, NoFetch, lookup_path, make_ops


class Names:
    def __init__(self) -> None:
        self.got: list[bytes] = []


def _collect(monkeypatch: pytest.MonkeyPatch) -> Names:
    names = Names()

    def reply(token: object, name: bytes, attrs: object, nxt: int) -> bool:
        names.got.append(name)
        return True

    monkeypatch.setattr(pyfuse3, "readdir_reply", reply)
    return names


def test_an_adopter_answers_the_dead_muxs_inodes_and_handles(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    run.mkdir()
    dead_dir, new_dir = tmp_path / "dead", tmp_path / "new"
    dead_dir.mkdir()
    new_dir.mkdir()  # for a namespace attached after the adoption

    def journal(pid: str, slot: int) -> Path:
        return run / f"host.{pid}.ns{slot}.inodes"

    old = MuxOperations()
    old.keep_handles(run / "host.1.handles")
    slots = {}
    for tenant, ns in (("u1", "alpha"), ("u2", "beta")):
        ops = make_ops(dead_dir, ns)
        slots[ns] = old.attach(tenant, ns, ops)
        ops.journal_inodes(journal("1", slots[ns]))
    old.init()
    names = _collect(monkeypatch)

    async def before() -> dict[str, int]:
        fi, attrs = await old.create((await lookup_path(old, "u1/alpha")).st_ino, b"k.bin",
                                     0o644, os.O_RDWR | os.O_CREAT, CTX)
        await old.write(fi.fh, 0, b"kernel bytes")
        ro = await old.open(attrs.st_ino, os.O_RDONLY, CTX)
        sub = await old.mkdir((await lookup_path(old, "u2/beta")).st_ino, b"sub", 0o755, CTX)
        dh = await old.opendir(sub.st_ino, CTX)
        root_dh = await old.opendir(ROOT, CTX)
        gone = await old.open(attrs.st_ino, os.O_RDONLY, CTX)
        await old.release(gone.fh)
        return {"rw": fi.fh, "ro": ro.fh, "ino": attrs.st_ino, "dh": dh, "root_dh": root_dh,
                "sub": sub.st_ino, "gone": gone.fh}

    h = trio.run(before)
    layout = old.layout()
    # The crash: nothing of the old mux is closed or told; its files stay as they were.

    new = MuxOperations()
    restored = new.restore_layout(layout)
    assert [(s, t, n) for s, t, n in restored] == [(slots["alpha"], "u1", "alpha"),
                                                  (slots["beta"], "u2", "beta")]
    new.keep_handles(run / "host.2.handles", restore_from=run / "host.1.handles")
    for slot, tenant, ns in restored:
        ops = OverlayOperations(DictLowerTree(), NoFetch(), dead_dir / ns, RecordingTracker(),
                                Counters())  # a new process over the same upper
        assert new.attach(tenant, ns, ops, slot=slot) == slot
        ops.journal_inodes(journal("2", slot), dead=journal("1", slot))
        assert not journal("1", slot).exists()
    new.init()
    assert set(new.handles.held) == {h["rw"], h["ro"], h["dh"], h["root_dh"]}

    async def after() -> None:
        # node ids: the file, a directory, the tenants' directories, as before
        assert (await new.getattr(h["ino"], CTX)).st_size == len(b"kernel bytes")
        assert (await lookup_path(new, "u1/alpha/k.bin")).st_ino == h["ino"]
        assert (await lookup_path(new, "u2/beta")).st_ino == ns_root_inode(slots["beta"])
        assert (await new.getattr(h["sub"], CTX)).st_ino == h["sub"]
        # handles: reopened on first use, read-write and read-only as given out
        assert await new.read(h["ro"], 0, 100) == b"kernel bytes"
        assert await new.write(h["rw"], 12, b", more") == 6
        assert await new.read(h["ro"], 0, 100) == b"kernel bytes, more"
        await new.readdir(h["root_dh"], 0, None)  # the synthetic level lists again
        assert names.got == [b"u1", b"u2"]
        await new.readdir(h["dh"], 0, None)  # an empty directory of a namespace
        assert names.got == [b"u1", b"u2"]
        # a released handle is no handle; a new namespace never reuses a slot
        with pytest.raises(pyfuse3.FUSEError) as e:
            await new.read(h["gone"], 0, 1)
        assert e.value.errno == errno.EBADF
        for fh in (h["rw"], h["ro"]):
            await new.release(fh)
        await new.releasedir(h["dh"])
        await new.releasedir(h["root_dh"])
        assert not new.handles.held
        assert new.attach("u1", "gamma", make_ops(new_dir, "gamma")) > max(slots.values())

    trio.run(after)
    assert (dead_dir / "alpha" / "k.bin").read_bytes() == b"kernel bytes, more"


def test_a_layout_of_another_format_is_refused() -> None:
    layout = MuxOperations().layout()
    assert layout["v"] == 1
    with pytest.raises(ValueError, match="layout format 2"):
        MuxOperations().restore_layout({**layout, "v": 2})
