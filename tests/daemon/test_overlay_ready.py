"""casfsd's configured overlay mount with ``wait_warm`` (daemon/casfs.toml's triton
mount): READY comes once the published namespace is on the node and linked, so a
job launched at READY on a fresh node has every file served by the kernel from the
links layer, never an open through FUSE (docs/performance.md, "Under casfsd")."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from casfs.node import guard
from casfs.view import overlay
from tests.daemon.conftest import Daemon

pytestmark = [pytest.mark.fuse, pytest.mark.slow]


def _publish(root: Path, files: dict[str, bytes], tmp: Path) -> None:
    src = tmp / "src"
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    for args in (["init", str(root)],
                 ["--root", str(root), "--state-dir", str(tmp / "seed-state"), "import",
                  str(src), "--namespace", "warm-test", "--family", "generic", "--packs"]):
        subprocess.run([sys.executable, "-m", "casfs.cli.main", *args], check=True,
                       capture_output=True, timeout=300)


def test_ready_waits_until_the_namespace_is_linked(daemons: Callable[..., Daemon],
                                                   tmp_path: Path) -> None:
    if (why := overlay.unavailable_reason()) is not None:
        pytest.fail(f"overlay mode is needed here: {why}")
    files = {f"k{i:02d}/{name}": os.urandom(700 + 97 * i)
             for i in range(12) for name in ("a.cubin", "a.json")}
    _publish(tmp_path / "root", files, tmp_path)
    d = daemons("a", [{"name": "tri", "family": "generic", "namespace": "warm-test",
                       "mode": "overlay", "wait_warm": 60}], node={"on_demand": False})
    assert d.notify is not None
    assert any(m.get("READY") == "1" for m in d.notify.messages)
    mnt = d.mount_paths[0]
    assert guard.mounts_at(mnt)[-1].fstype == "overlay"
    links = d.state / "overlay" / "warm-test" / "links"
    # At READY every file is a link to its cache object, and the overlay serves that
    # inode: the kernel reads it from the links layer, FUSE never sees the open (a
    # fresh node without wait_warm links nothing and serves all through FUSE).
    for rel, data in files.items():
        assert (links / rel).is_file(), f"{rel} not linked at READY"
        assert os.stat(mnt / rel).st_ino == os.stat(links / rel).st_ino, rel
        assert (mnt / rel).read_bytes() == data
    assert d.terminate() == 0
