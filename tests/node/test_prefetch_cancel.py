"""A short job on a fresh node does not wait at its release for the whole-namespace
prefetch: the wave in flight is cancelled in the fetch worker (casfs.node.fetchproc
"cancel"), and what it left out is fetched by the next job, with the right bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from casfs.store.entry import Entry
from casfs.store.root import SharedRoot

from .conftest import require_fuse

pytestmark = [pytest.mark.fuse]

FILES = 3000  # installing them takes ~1.5 s here: far longer than the job below

READ_ALL = r"""
import hashlib, json, os
d = os.environ["TRITON_CACHE_DIR"]
out = {}
for top, _, names in os.walk(d):
    for n in names:
        p = os.path.join(top, n)
        out[os.path.relpath(p, d)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
print(json.dumps(out))
"""


def _run(tmp: Path, report: Path, *job: str) -> subprocess.CompletedProcess[str]:
    require_fuse()
    env = dict(os.environ, CASFS_ROOT=str(tmp / "root"), CASFS_STATE_DIR=str(tmp / "node"),
               CASFS_MOUNT_BASE=str(tmp / "mnt"))
    env.pop("TRITON_CACHE_DIR", None)
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "triton",
                        "--namespace", "big", "--report", str(report), "--", *job],
                       env=env, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_a_short_jobs_release_cancels_the_prefetch(tmp_path: Path) -> None:
    import hashlib

    root = SharedRoot.open(tmp_path / "root", create=True)
    entries, want = [], {}
    for i in range(FILES):
        data = b"kernel %d " % i * (1 + i % 7)
        put = root.objects.put_bytes(data)
        path = f"K{i // 8:04d}/f{i % 8}.bin"
        entries.append(Entry(path, put.digest, put.size, 0o644, 1_700_000_000_000_000_000))
        want[path] = hashlib.sha256(data).hexdigest()
    root.generations().publish("big", entries, node="elsewhere")
    report = tmp_path / "report.json"

    _run(tmp_path, report, "sleep", "0.5")  # the wave starts meanwhile
    fam = json.loads(report.read_text())["families"][0]
    assert fam["restored_entries"] == FILES and fam["errors"] == 0
    # Released before the wave was installed: it was cancelled, not waited for.
    assert (fam["prefetched_files"] or 0) < FILES, fam

    r = _run(tmp_path, report, sys.executable, "-c", READ_ALL)
    assert json.loads(r.stdout.strip().splitlines()[-1]) == want
    assert json.loads(report.read_text())["families"][0]["errors"] == 0
