"""casfs run with cache trees whose names are legal on Linux but unusual."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import require_fuse

pytestmark = [pytest.mark.fuse]

# Not UTF-8: Python names it with surrogate escapes ('bad\udcff\udcfe').
ODD = b"bad\xff\xfename"


def run(tmp: Path, node: str, job: str) -> subprocess.CompletedProcess[str]:
    require_fuse()
    # Each node its own mount base: node-a's mount process outlives its casfs run by
    # its lease grace, and node-b's refuses (an ERROR) to mount over another's.
    env = dict(os.environ, CASFS_ROOT=str(tmp / "root"), CASFS_STATE_DIR=str(tmp / node),
               CASFS_MOUNT_BASE=str(tmp / f"mnt-{node}"))
    return subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
                           "--namespace", "odd", "--stable-after", "0.2", "--",
                           sys.executable, "-c", job],
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def test_a_name_that_is_not_utf8_does_not_stop_publication(tmp_path: Path) -> None:
    """One file name that is not UTF-8 must not keep the whole cache from publishing.

    Was: the manifest encoder raised UnicodeEncodeError (surrogates) in the
    promotion worker, every publication of the namespace failed ("will retry",
    forever), and no file of the job reached the shared root.
    """
    write = ("import os; d = os.fsencode(os.environ['CASFS_CACHE_DIR']);"
             "open(os.path.join(d, b'good'), 'wb').write(b'good bytes');"
             f"open(os.path.join(d, {ODD!r}), 'wb').write(b'odd bytes')")
    r = run(tmp_path, "node-a", write)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 published" in r.stderr, r.stderr[-3000:]
    # A fresh node gets both files, the odd one under its own raw bytes.
    read = ("import os; d = os.fsencode(os.environ['CASFS_CACHE_DIR']);"
            "print(sorted((n, open(os.path.join(d, n), 'rb').read()) for n in os.listdir(d)))")
    r = run(tmp_path, "node-b", read)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == repr(sorted([(b"good", b"good bytes"), (ODD, b"odd bytes")]))


@pytest.mark.expect_log(r"not promoting future: its mtime \(\d+ ns\) is out of range")
def test_a_file_dated_past_2262_does_not_stop_publication(tmp_path: Path) -> None:
    """An mtime past 2262 does not fit the signed 64-bit nanoseconds of a manifest row.

    Was: the index's struct.pack raised in every promotion round ("will retry",
    forever): no file of the namespace was published. Now that file stays local
    and the others are published.
    """
    job = ("import os; d = os.environ['CASFS_CACHE_DIR'];"
           "open(d + '/good', 'w').write('good');"
           "open(d + '/future', 'w').write('future');"
           "os.utime(d + '/future', ns=(13_569_465_600 * 10**9,) * 2)")  # 2400-01-01
    r = run(tmp_path, "node-a", job)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run(tmp_path, "node-b",
            "import os; print(sorted(os.listdir(os.environ['CASFS_CACHE_DIR'])))")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "['good']"
