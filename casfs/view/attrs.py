"""Entry attributes the view hands the kernel: upper from lstat, lower synthesized.

Lower attributes are built from the manifest entry alone (no stat of the
object cache), so a lookup of a lower path never touches shared storage.
"""

from __future__ import annotations

import os
import stat

import pyfuse3

from casfs.store.entry import Entry
from casfs.view.lower import DIR, LowerNode


def upper_attrs(st: os.stat_result, ino: int, timeout: float) -> pyfuse3.EntryAttributes:
    a = pyfuse3.EntryAttributes()
    a.st_ino = ino
    a.generation = 0
    a.entry_timeout = timeout
    a.attr_timeout = timeout
    a.st_mode = st.st_mode
    a.st_nlink = st.st_nlink
    a.st_uid = st.st_uid
    a.st_gid = st.st_gid
    a.st_rdev = st.st_rdev
    a.st_size = st.st_size
    a.st_blksize = st.st_blksize
    a.st_blocks = st.st_blocks
    a.st_atime_ns = st.st_atime_ns
    a.st_mtime_ns = st.st_mtime_ns
    a.st_ctime_ns = st.st_ctime_ns
    return a


def lower_attrs(
    node: LowerNode,
    ino: int,
    timeout: float,
    *,
    owner: tuple[int, int],
    dir_mode: int,
    dir_time_ns: int,
) -> pyfuse3.EntryAttributes:
    a = pyfuse3.EntryAttributes()
    a.st_ino = ino
    a.generation = 0
    a.entry_timeout = timeout
    a.attr_timeout = timeout
    a.st_uid, a.st_gid = owner
    a.st_blksize = 4096
    if node is DIR:
        a.st_mode = stat.S_IFDIR | dir_mode
        a.st_nlink = 2
        a.st_size = 4096
        a.st_blocks = 8
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = dir_time_ns
    else:
        assert isinstance(node, Entry)
        a.st_mode = stat.S_IFREG | (node.mode & 0o777)  # never setuid/setgid from a manifest
        a.st_nlink = 1
        a.st_size = node.size
        a.st_blocks = (node.size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = node.mtime_ns
    return a
