"""gc racing readers and publishers through a real mount.

I1/I2: every read during repeated `casfs gc --grace 0` is the correct bytes
(published entries are never unreferenced: generations only add paths) or a
miss; I3: the store verifies afterwards and the newest generation is complete.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from casfs.store.root import SharedRoot

pytestmark = pytest.mark.fuse


def _casfs(root: Path, state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(root),
                           "--state-dir", str(state), *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_gc_racing_readers_and_publishers(cluster: dict[str, Any], tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    files = {f"f{i}": os.urandom(5000 + i) for i in range(30)}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    assert _casfs(cluster["root"], tmp_path / "seed", "import", str(src), "-n",
                  "testns").returncode == 0
    a, b = cluster["a"], cluster["b"]
    wa, wb = a.mount(), b.mount(mountpoint=cluster["mnt"] / "b")
    bad: list[str] = []
    stop = threading.Event()

    def read_loop() -> None:
        while not stop.is_set():
            for rel, data in files.items():
                try:
                    if (wb.cfg.mountpoint / rel).read_bytes() != data:
                        bad.append(f"wrong bytes {rel}")
                except FileNotFoundError:
                    pass  # a miss is allowed (I2)
                except OSError as e:
                    bad.append(f"{rel}: {e}")

    readers = [threading.Thread(target=read_loop) for _ in range(2)]
    for t in readers:
        t.start()
    try:
        for round_ in range(4):
            for i in range(5):  # a publisher on node a meanwhile
                (wa.cfg.mountpoint / f"a{round_}-{i}").write_bytes(f"{round_}/{i}".encode())
            assert a.ask(wa, "publish")["ok"] is True
            res = _casfs(cluster["root"], tmp_path / "gc", "gc", "--keep", "1", "--grace", "0")
            assert res.returncode == 0, res.stderr
    finally:
        stop.set()
        for t in readers:
            t.join(60)
    assert bad == []
    a.stop(wa)
    b.stop(wb)
    ver = _casfs(cluster["root"], tmp_path / "gc", "verify", "--json")
    assert ver.returncode == 0, ver.stdout
    snap = SharedRoot.open(cluster["root"]).generations().entries("testns")
    assert len(snap.entries) == len(files) + 20
