"""A rewrite that keeps the size and puts the old mtime back is published as rewritten.

``cp -p``, ``rsync -t`` and ``touch -r`` set a file's mtime; a job rewriting a promoted
file in place with the same size and its old mtime had the promotion take it for the
file already promoted (size and mtime matched its record), in every mode, and the
older bytes were published for every fresh node (a review, 2026-12-06). The ctime,
which no one can set back, tells now. Real casfs run, real job.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .jobrun import published, run_job

pytestmark = pytest.mark.fuse

JOB = """
import os, time
path = os.path.join(os.environ["CASFS_CACHE_DIR"], "cfg.json")
with open(path, "wb") as f:
    f.write(b"version-1 " * 100)
st = os.stat(path)
time.sleep(2.5)  # stable_after passes: promoted (not published: the interval is long)
with open(path, "r+b") as f:
    f.write(b"version-2 " * 100)
os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # as cp -p would
"""


@pytest.mark.parametrize("mode", ["fuse", "dir", "overlay"])
def test_a_rewrite_with_its_mtime_put_back_is_published(tmp_path: Path, mode: str) -> None:
    err = run_job(tmp_path, mode, JOB)
    assert published(tmp_path, "cfg.json") == {"cfg.json": b"version-2 " * 100}, err[-2000:]


COPIED = """
import os, time
path = os.path.join(os.environ["CASFS_CACHE_DIR"], "copied.bin")
with open(path, "wb") as f:
    f.write(b"copied " * 100)
os.utime(path, ns=(1_000_000_000, 1_000_000_000))  # its mtime kept, as cp -p keeps it
time.sleep(12)  # overlay mode walks its upper every 5 s
"""


def test_a_file_whose_mtime_was_set_is_hashed_once_not_at_every_walk(tmp_path: Path) -> None:
    """Its ctime is past its mtime for good: hashed once, then known as it is."""
    err = run_job(tmp_path, "overlay", COPIED)
    assert ", 1 promoted," in err, err[-2000:]
