"""One file casfs cannot promote (an input it does not handle, a bug) must not keep the
rest of its namespace from being published: real casfs run, real promotion worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from casfs.store.root import SharedRoot

pytestmark = pytest.mark.fuse

JOB = """
import os
d = os.environ["CASFS_CACHE_DIR"]
for i in range(40):
    os.makedirs(f"{d}/k{i:02d}", exist_ok=True)
    name = "poison.bin" if i == 17 else "kernel.bin"
    with open(f"{d}/k{i:02d}/{name}", "wb") as f:
        f.write(b"%d" % i * 100)
"""


@pytest.mark.expect_log(
    r"cannot promote k\d+/poison.bin \(injected fault at promote-file",
    r"promote of \S+ failed \[RuntimeError: injected fault at promote-file",
)
def test_one_unpromotable_file_stays_local_and_the_rest_is_published(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"),
               CASFS_STATE_DIR=str(tmp_path / "a"), CASFS_MOUNT_BASE=str(tmp_path / "mnt"),
               CASFS_SOCKET=str(tmp_path / "no-daemon.sock"),
               CASFS_FAULT="promote-file", CASFS_FAULT_MATCH="poison")
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
                        "--python", sys.executable, "--", sys.executable, str(script)],
                       env=env, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    gens = SharedRoot.open(tmp_path / "root").generations()
    (ns,) = gens.namespaces()
    published = set(gens.snapshot(gens.latest(ns)).entries)
    assert published == {f"k{i:02d}/kernel.bin" for i in range(40) if i != 17}, r.stderr[-3000:]
    log = (tmp_path / "a" / "log" / "host.log").read_text()
    assert "cannot promote k17/poison.bin (injected fault at promote-file" in log
    assert log.count("cannot promote") == 1  # only it: the rest went through
