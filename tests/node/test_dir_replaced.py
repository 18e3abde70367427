"""Dir mode refreshes replaced paths during a run: two real `casfs run --mode dir` nodes.

Node A publishes vLLM's AOT artifact (a replaced path, newest wins); node B's job
runs while node C publishes a newer version: B's copy is swapped in place, by
rename (B's reader sees one whole version at every read), while a copy B's job
rewrote itself stays.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from casfs.store.root import SharedRoot

MODEL = "torch_compile_cache/torch_aot_compile/9a8b/rank_0_0/model"
MINE = "torch_compile_cache/torch_aot_compile/77cc/rank_0_0/model"


def _env(tmp: Path, node: str) -> dict[str, str]:
    return dict(os.environ, CASFS_ROOT=str(tmp / "root"), CASFS_STATE_DIR=str(tmp / node),
                CASFS_MOUNT_BASE=str(tmp / f"mnt-{node}"))


def _run(tmp: Path, node: str, script: str, *extra: str, wait: bool = True
         ) -> subprocess.Popen[str] | subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "casfs.cli.main", "run", "--family", "vllm", "--mode", "dir",
            "--stable-after", "0.2", *extra, "--", sys.executable, "-c",
            textwrap.dedent(script)]
    if not wait:
        return subprocess.Popen(argv, env=_env(tmp, node), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return subprocess.run(argv, env=_env(tmp, node), capture_output=True, text=True,
                          timeout=120, check=False)


WRITE = """
    import os, sys
    root = os.environ["VLLM_CACHE_ROOT"]
    for rel, data in {files!r}.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p + ".tmp", "wb") as f:
            f.write(data)
        os.replace(p + ".tmp", p)  # as torch's AOT save does
"""

READER = """
    import os, sys, time
    root = os.environ["VLLM_CACHE_ROOT"]
    model, mine = os.path.join(root, {model!r}), os.path.join(root, {mine!r})
    assert open(model, "rb").read() == b"v1 " * 1000
    with open(mine, "r+b") as f:  # this job's own rewrite of a published copy
        f.write(b"M")
    held = open(model, "rb")
    open({ready!r}, "w").close()
    deadline = time.monotonic() + 90
    seen = set()
    while time.monotonic() < deadline:
        data = open(model, "rb").read()
        seen.add(data[:2].decode())
        assert data in (b"v1 " * 1000, b"v2 " * 2000), "a mix of versions"
        if data.startswith(b"v2"):
            break
        time.sleep(0.05)
    print("seen", sorted(seen))
    assert held.read() == b"v1 " * 1000  # opened before the swap: the old version, whole
    print("mine", open(mine, "rb").read()[:3].decode())
"""


@pytest.mark.fuse
def test_dir_mode_swaps_newer_versions_of_replaced_paths_during_a_run(tmp_path: Path) -> None:
    r = _run(tmp_path, "a", WRITE.format(files={MODEL: b"v1 " * 1000, MINE: b"a1 " * 10}))
    assert isinstance(r, subprocess.CompletedProcess) and r.returncode == 0, r.stderr

    ready = tmp_path / "b-ready"
    b = _run(tmp_path, "b", READER.format(model=MODEL, mine=MINE, ready=str(ready)),
             "--refresh-interval", "0.3", "--publish-interval", "3600", wait=False)
    assert isinstance(b, subprocess.Popen)
    try:
        deadline = time.monotonic() + 90
        while not ready.exists():
            assert b.poll() is None, b.communicate()
            assert time.monotonic() < deadline, "node b's job did not start"
            time.sleep(0.1)
        r = _run(tmp_path, "c", WRITE.format(files={MODEL: b"v2 " * 2000, MINE: b"c2 " * 10}))
        assert isinstance(r, subprocess.CompletedProcess) and r.returncode == 0, r.stderr
        out, err = b.communicate(timeout=120)
    finally:
        if b.poll() is None:
            b.kill()
            b.wait()
    assert b.returncode == 0, err
    assert "seen ['v1', 'v2']" in out, out  # the job saw v1, then v2, never a mix
    assert "mine M1 " in out, out  # the job's rewrite was not replaced under it
    root = SharedRoot.open(tmp_path / "root")
    gens = root.generations()
    ns = gens.namespaces()[0]
    objects = root.objects  # knows the packs the rows read below name
    snap = gens.entries(ns).entries
    assert objects.get_bytes(snap[MODEL].digest) == b"v2 " * 2000
    # B published its own rewrite at the end: the newest generation wins.
    assert objects.get_bytes(snap[MINE].digest)[:3] == b"M1 "

    # Node A's directory still holds its own published v1: the next run starts with v2.
    check = """
        import os
        p = os.path.join(os.environ["VLLM_CACHE_ROOT"], {model!r})
        assert open(p, "rb").read() == b"v2 " * 2000, open(p, "rb").read()[:9]
    """
    r = _run(tmp_path, "a", check.format(model=MODEL))
    assert isinstance(r, subprocess.CompletedProcess) and r.returncode == 0, r.stderr
