"""A file written through a shared mapping is published whole, never half-written.

A job maps a file MAP_SHARED, closes its fd, writes half of it, and later the other
half. No fd shows the writer in /proc and the mapping's writes raise no event; in dir
and overlay modes another process's open and close of the file for writing ended its
"written" state, and the half-written file was promoted and published (first writer
wins: every fresh node read 32 KiB of zeros for good; a review, 2026-12-06). A
process's shared writable mappings count as a writer now. Real casfs run, real job.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .jobrun import published, run_job

pytestmark = pytest.mark.fuse

SIZE = 65536

# The writer: the mapping made with libc (Python's mmap keeps a dup of the fd, which
# /proc would show), its fd closed before any write.
JOB = f"""
import ctypes, os, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
path = os.path.join(os.environ["CASFS_CACHE_DIR"], "k.bin")
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.ftruncate(fd, {SIZE})
p = libc.mmap(None, {SIZE}, 3, 1, fd, 0)  # PROT_READ|PROT_WRITE, MAP_SHARED
assert p not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
os.close(fd)
ctypes.memset(p, ord("A"), {SIZE // 2})
time.sleep(1)
subprocess.run(["touch", path], check=True)  # another writer opens and closes it
time.sleep(4)  # stable_after passes, promotion rounds run: the file is half written
ctypes.memset(p + {SIZE // 2}, ord("B"), {SIZE // 2})
libc.msync(ctypes.c_void_p(p), {SIZE}, 4)  # MS_SYNC
libc.munmap(ctypes.c_void_p(p), {SIZE})
"""


@pytest.mark.parametrize("mode", ["dir", "overlay"])
def test_a_file_written_through_a_shared_mapping_is_published_whole(
        tmp_path: Path, mode: str) -> None:
    err = run_job(tmp_path, mode, JOB, publish_interval="0.5")
    data = published(tmp_path, "k.bin")["k.bin"]
    # (before: A x 32768 then 32768 zeros, published first and kept)
    assert data == b"A" * (SIZE // 2) + b"B" * (SIZE // 2), (data[SIZE // 2:SIZE // 2 + 8],
                                                            err[-2000:])
    assert "conflicted" not in err, err[-2000:]
