"""A file with two names rewritten through one: both names are published rewritten.

A review (2026-12-06): a job wrote ``a``, linked ``b`` to it and, once both were
promoted (not yet published), rewrote the file in place through one name. The job
and its node read the new bytes under both names; the published generation had the
other name's old bytes, in fuse mode (only the name written through was marked) and
dir mode (inotify names only that one). Real casfs run, real job.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .jobrun import published, run_job

pytestmark = pytest.mark.fuse

JOB = """
import os, sys, time
d = os.environ["CASFS_CACHE_DIR"]
with open(os.path.join(d, "a"), "wb") as f:
    f.write(b"old-bytes")
os.link(os.path.join(d, "a"), os.path.join(d, "b"))
time.sleep(2.5)  # stable_after passes: both promoted (the interval is long)
with open(os.path.join(d, sys.argv[1]), "r+b") as f:
    f.write(b"NEW-BYTES")
time.sleep(1)
"""


@pytest.mark.parametrize("mode,through", [("fuse", "a"), ("fuse", "b"), ("dir", "a"),
                                          ("dir", "b"), ("overlay", "b")])
def test_a_rewrite_through_one_name_is_published_under_both(
        tmp_path: Path, mode: str, through: str) -> None:
    err = run_job(tmp_path, mode, JOB, through)
    got = published(tmp_path, "a", "b")
    assert got == {"a": b"NEW-BYTES", "b": b"NEW-BYTES"}, (got, err[-2000:])
