"""Killed jobs never publish torn files, in any mode, across a restart (issue 21).

- dir mode (``casfs run --mode dir``): casfs run tells the dir-mode process its job
  was killed; what the job changed just before is held, never published, and
  removed from the directory when the last job leaves. Before: dir mode never
  heard of a killed job and published what it had half-written.
- a restart before the release: the held files are written down
  (``<state>/run/torn-<namespace>.json``); the next process of the namespace removes
  them before it serves or promotes anything. Before: the hold lived in memory, and
  a host killed after the decision left the files to be promoted and published by
  the next one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from casfs.node import control
from casfs.node.host import spawn_host
from casfs.store.root import SharedRoot

from .test_host import host_cfg

pytestmark = [pytest.mark.expect_log(
    r"a job was killed: \d+ files it may have been writing are not published")]


def published(root: Path) -> dict[str, Any]:
    gens = SharedRoot.open(root).generations()
    out: dict[str, Any] = {}
    for ns in gens.namespaces():
        if gens.latest(ns) is not None:
            out.update({f"{ns}/{p}": e for p, e in gens.entries(ns).entries.items()})
    return out


def test_a_killed_job_in_dir_mode_publishes_nothing_it_half_wrote(tmp_path: Path) -> None:
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"),
               CASFS_STATE_DIR=str(tmp_path / "state"), CASFS_MOUNT_BASE=str(tmp_path / "mnt"))
    job = ('mkdir -p "$CASFS_CACHE_DIR/k" && echo good > "$CASFS_CACHE_DIR/k/done.json" &&'
           ' sleep 4 && printf half > "$CASFS_CACHE_DIR/k/torn.so" && kill -9 $$')
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--mode", "dir",
                        "--family", "generic", "--namespace", "ns", "--stable-after", "1",
                        "--", "/bin/sh", "-c", job],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 128 + signal.SIGKILL, r.stderr
    names = {k.rsplit("/", 1)[-1] for k in published(tmp_path / "root")}
    assert "done.json" in names, r.stderr  # what it finished long before is published
    assert "torn.so" not in names, r.stderr
    cache = next((tmp_path / "mnt").rglob("k"))
    assert not (cache / "torn.so").exists()  # and gone: the next job misses, recompiles


@pytest.mark.fuse
def test_held_files_survive_a_crash_of_the_mount_process(
        node: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # stable_after: the file stays unpromoted until the hold, however slow this machine is.
    cfg = host_cfg(node, grace=3600.0, exit_when_idle=False, stable_after=30.0)
    # The release that follows a killed job's hold stalls (it would remove the file and
    # the record at once): the process dies between the hold and the release.
    monkeypatch.setenv("CASFS_PAUSEPOINT", "host-release")
    monkeypatch.setenv("CASFS_PAUSEPOINT_FILE", str(node["tmp"] / "never"))
    w = spawn_host(cfg, log_to_stderr=True)
    monkeypatch.delenv("CASFS_PAUSEPOINT")
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    alpha = [{"family": "generic", "namespace": "alpha"}]
    try:
        r = control.request(w.cfg.socket_path, "lease", pid=job.pid, caches=alpha, run=True)
        path = Path(r["caches"][0]["path"])
        (path / "k").mkdir()
        (path / "k" / "torn.so").write_bytes(b"half of a linker's output")
        job.kill()
        job.wait()
        torn = node["state"] / "run"
        wait_until(lambda: Path(f"{node['tmp'] / 'never'}.reached").exists(),
                   "the release, stalled", proc=w.proc)
        assert any(torn.glob("torn-*alpha.json"))  # the hold, written down
        w.proc.kill()  # the node's mount process dies before it released alpha
        w.proc.wait()
    finally:
        job.kill()
        job.wait()
        subprocess.run(["fusermount3", "-u", "-z", str(cfg.base)], capture_output=True)
    w = spawn_host(cfg, log_to_stderr=True)
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        r = control.request(w.cfg.socket_path, "lease", pid=job.pid, caches=alpha)
        assert r["ok"], r
        assert not (Path(r["caches"][0]["path"]) / "k" / "torn.so").exists()
        assert not any(torn.glob("torn-*alpha.json"))
        assert control.request(w.cfg.socket_path, "release", lease=r["lease"], wait=True)["ok"]
    finally:
        job.kill()
        job.wait()
        w.stop()
    assert not any(k.endswith("/torn.so") for k in published(node["root"]))
