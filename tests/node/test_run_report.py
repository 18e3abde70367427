"""casfs run: the per-job report, and the one-line hint when nothing was restored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from casfs.fingerprint import Fingerprint, fingerprint, job_env
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot

from .conftest import require_fuse

pytestmark = [pytest.mark.fuse]


def run(tmp: Path, node: str, *args: str, fams: str = "triton"
        ) -> subprocess.CompletedProcess[str]:
    require_fuse()
    env = dict(os.environ, CASFS_ROOT=str(tmp / "root"), CASFS_STATE_DIR=str(tmp / node),
               CASFS_MOUNT_BASE=str(tmp / "mnt"))
    env.pop("TRITON_CACHE_DIR", None)
    return subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", fams,
                           "--stable-after", "0.2", *args], env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_report_and_miss_hint(tmp_path: Path) -> None:
    job_fp = job_env(python=sys.executable)
    mine = fingerprint("triton", job_fp)
    other = Fingerprint("triton", {**mine.ingredients, "torch": "9.9.9"})
    root = SharedRoot.open(tmp_path / "root", create=True)
    put = root.objects.put_bytes(b"kernel")
    root.generations().publish(other.namespace, [Entry("K/k.cubin", put.digest, put.size,
                                                       0o644, 1)],
                               node="elsewhere", fingerprint=other.ingredients)
    # Inductor's cache is related too, but this job never looks in it: no hint (its line
    # says "not used by this job"), and nothing of it read after the job.
    ind = fingerprint("inductor", job_fp)
    ind_other = Fingerprint("inductor", {**ind.ingredients, "torch": "9.9.9"})
    root.generations().publish(ind_other.namespace, [Entry("fxgraph/x", put.digest, put.size,
                                                           0o644, 1)],
                               node="elsewhere", fingerprint=ind_other.ingredients)
    report = tmp_path / "out" / "report.json"
    report.parent.mkdir()
    job = ("import os, pathlib; d = pathlib.Path(os.environ['TRITON_CACHE_DIR']);"
           " (d / 'KEY').mkdir(); (d / 'KEY' / 'k.json').write_text('{}')")
    r = run(tmp_path, "node-a", "--report", str(report), "--", sys.executable, "-c", job,
            fams="triton,inductor")
    assert r.returncode == 0, r.stderr[-3000:]
    hint = [ln for ln in r.stderr.splitlines() if "nothing restored" in ln]
    assert len(hint) == 1 and other.namespace in hint[0] and "torch" in hint[0], r.stderr
    assert "not used by this job: inductor" in r.stderr
    doc = json.loads(report.read_text())
    assert doc["exit_status"] == 0 and doc["command"][-2] == "-c"
    fam = doc["families"][0]
    assert fam["family"] == "triton" and fam["namespace"] == mine.namespace, doc["families"]
    assert fam["restored_entries"] == 0 and fam["promoted"] == 1 and fam["published"] == 1
    assert set(doc["timings"]) == {"setup_s", "job_s", "publish_s"}
    # A fresh node: restored from the first, no hint; hits counted.
    r = run(tmp_path, "node-b", "--report", str(report), "--", sys.executable, "-c",
            "import os; open(os.environ['TRITON_CACHE_DIR'] + '/KEY/k.json').read()")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "nothing restored" not in r.stderr
    fam = json.loads(report.read_text())["families"][0]
    assert fam["restored_entries"] == 1 and fam["hits"] >= 1 and fam["errors"] == 0
    assert fam["fetched_objects"] == 1 and fam["fetched_bytes"] == 2


def test_every_family_by_default_never_overriding_the_job(tmp_path: Path) -> None:
    from casfs import families

    require_fuse()
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"),
               CASFS_STATE_DIR=str(tmp_path / "node"), CASFS_MOUNT_BASE=str(tmp_path / "mnt"),
               TRITON_CACHE_DIR="/the/jobs/own")
    show = "import json, os; print(json.dumps(dict(os.environ)))"
    for companions in ((), ("--companions",)):
        r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", *companions, "--",
                            sys.executable, "-c", show], env=env, capture_output=True,
                           text=True, timeout=300, check=False)
        assert r.returncode == 0, r.stderr[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["TRITON_CACHE_DIR"] == "/the/jobs/own"  # never overridden
        for name in families.names():
            for var in families.get(name).env_vars:
                if var != "TRITON_CACHE_DIR":
                    assert got[var].startswith(str(tmp_path / "mnt")), var
        flag = got.get("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED")
        assert flag == ("1" if companions else None)
        assert "not used by this job:" in r.stderr and "cutedsl" in r.stderr
