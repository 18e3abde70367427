"""The FUSE view: a writable overlay of the served generation (lower) and a local upper dir.

Lower entries are immutable: they get long kernel entry/attr timeouts and
``keep_cache``; their bytes come from the ObjectFetcher, in a worker thread.
Upper entries are plain files served by fd pass-through with short timeouts.
Deletions of lower entries are whiteouts in upper (casfs.view.whiteout).

Concurrency: every handler runs on the trio thread, so code between two
``await``s is atomic; only fetching, copying and fsync go to worker threads.
A copy-up is staged off-thread and linked into place on the trio thread after
re-checking the path, so a racing create/unlink is never clobbered.

A lower object that fails to fetch or verify makes its path absent for the
rest of the mount (ENOENT, a cache miss): never EIO, never wrong bytes.

Refresh grows the served LowerTree in place. Published paths never change
bytes (first writer wins), and readdir is not cached (no FOPEN_CACHE_DIR), so
only names that were absent change. Misses are cached by the kernel (an
entry of inode 0 with ``negative_timeout``: compilers probe many names that do
not exist), and the view remembers each one by (parent inode, name):
``lower_added`` invalidates those on the way to the paths a refresh added,
before the refresh returns. Names made through the mount (create, mkdir,
mknod, symlink, link, rename) turn the kernel's dentry positive by
themselves; a failed lower object (retried later) is an uncached miss; a
namespace detached from the mux takes its dentries with it (its directory
entry is invalidated) and a re-attached one starts with new inode numbers.
Except replaced paths (declared by the cache family): they get
short timeouts and no ``keep_cache``, and when a newer version is ingested
``replaced_changed`` makes the kernel forget the old attributes, pages and
dentry. A reader that opened the old version keeps reading it whole (its
handle holds that object).

The handlers are split by concern, one mixin each (the way S3QL keeps its
operations readable): op_base (shared state and helpers), op_attrs (lookup and
attributes), op_files (file I/O), op_dirs (directory changes), op_copyup
(copy-up, fetches and whiteout decisions), op_restore (what a process adopting a
crashed one's connection needs). ``OverlayOperations`` is the one
class the rest of casfs imports; one instance serves one namespace.
"""

from __future__ import annotations

from casfs.view.op_attrs import AttrOps
from casfs.view.op_dirs import DirOps
from casfs.view.op_restore import RestoreOps

__all__ = ["OverlayOperations"]


class OverlayOperations(AttrOps, RestoreOps, DirOps):
    """The writable overlay of one namespace (constructor: casfs.view.op_base.OpsBase)."""
