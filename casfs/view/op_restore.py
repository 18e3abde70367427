"""What a view keeps so that a process adopting its crashed connection reads it the same way.

The kernel holds node ids and file handles of the dead process
(casfs.view.adopt). ``keep_state`` journals both beside each other
(``<run>/<name>.<pid>.inodes``: casfs.view.inodejournal;
``<run>/<name>.<pid>.handles``: casfs.view.handleslots), named by pid so a
process handing over and its successor never share one; with ``dead`` it
starts from what that crashed process left. A handle the dead process gave
out is opened again on its first use (``_reopen``, from the handlers'
wrappers on ``Unopened``): the inode's current path, opened read-only or
read-write as before; a directory handle lists its directory again (a listing
the kernel is in the middle of may then skip or repeat a name that changed
meanwhile). A handle whose file
is gone since (unlinked, or its lower object unreadable) answers ESTALE: its
bytes are not there to serve. A namespace of the node's mount process keeps
only its inodes here (``journal_inodes``): the multiplexer's handle table
names the inode of each handle, and it reopens them through ``reopen``.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from casfs.errors import CasfsError
from casfs.view.handleslots import DIR, FILE_RW, HandleSlots
from casfs.view.inodejournal import InodeJournal
from casfs.view.inodes import InodeTable
from casfs.view.op_base import Miss, err, fuse_errors
from casfs.view.op_files import FileOps

log = logging.getLogger(__name__)


def state_paths(run_dir: Path, name: str, pid: int) -> tuple[Path, Path]:
    """The inode journal and the handle table of mount ``name``'s process ``pid``."""
    base = f"{name}.{pid}"
    return run_dir / f"{base}.inodes", run_dir / f"{base}.handles"


class RestoreOps(FileOps):
    def keep_state(self, run_dir: Path, name: str, dead: int | None = None) -> None:
        """Journal this view's inodes and handles in ``run_dir`` (root-only), under this
        process's pid; ``dead``: start from what that crashed process of ``name`` left
        (its files are removed once read)."""
        inodes, handles = state_paths(run_dir, name, os.getpid())
        root = self.inodes.root
        self.slots.close()
        if dead is not None:
            old = state_paths(run_dir, name, dead)
            try:
                self.inodes = InodeTable.restore(old[0], root, to=inodes)
                self.slots = HandleSlots(handles, restore_from=old[1])
            except (OSError, ValueError, LookupError, TypeError) as e:  # the mount starts again
                raise CasfsError(f"{name}: cannot read what pid {dead} left: {e}") from None
            for p in old:
                p.unlink(missing_ok=True)
            log.info("restored %d inode numbers and %d open handles of pid %d", len(self.inodes),
                     len(self.slots.held), dead)
            return
        inodes.unlink(missing_ok=True)  # a reused pid's
        self.inodes = InodeTable(root, journal=InodeJournal(inodes))
        self.slots = HandleSlots(handles)

    def journal_inodes(self, path: Path, dead: Path | None = None) -> None:
        """Journal this view's inodes to ``path`` (a hosted namespace, casfs.view.mux);
        ``dead``: start from that crashed process's journal (removed once read)."""
        root = self.inodes.root
        if dead is not None:
            self.inodes = InodeTable.restore(dead, root, to=path)
            dead.unlink(missing_ok=True)
            return
        path.unlink(missing_ok=True)  # a reused pid's
        self.inodes = InodeTable(root, journal=InodeJournal(path))

    def close_state(self) -> None:
        self.slots.close()
        if self.inodes.journal is not None:
            self.inodes.journal.close()

    async def _reopen(self, fh: int) -> None:
        """Open handle ``fh`` of the crashed process again (it is in ``slots.held``)."""
        if fh in self._handles or fh in self._dirs:
            return  # a concurrent request opened it meanwhile
        ino, kind = self.slots.held[fh]
        new = await self.reopen(ino, kind)
        if fh in self._handles or fh in self._dirs:  # opened meanwhile: ours goes
            await (self.releasedir(new) if kind == DIR else self.release(new))
            return
        if kind == DIR:
            self._dirs[fh] = self._dirs.pop(new)
        else:
            self._handles[fh] = self._handles.pop(new)
        self.slots.free(new)
        del self.slots.held[fh]

    @fuse_errors
    async def reopen(self, ino: int, kind: int) -> int:
        """A new handle of inode ``ino`` opened as a crashed process had it (``kind``:
        FILE_RO, FILE_RW or DIR); ESTALE if its path or its bytes are gone. Also the
        multiplexer's (casfs.view.mux), whose handle table names the inode."""
        path = self.inodes.path(ino)
        if path is None:
            raise err(errno.ESTALE)
        node = self.layers.resolve(path)
        if node is None or node.is_dir != (kind == DIR):
            raise err(errno.ESTALE)
        if kind == DIR:
            fh = self.slots.alloc(ino, DIR)
            self._dirs[fh] = (node.path, [name for name, _ in self.layers.children(node)])
            return fh
        try:
            fi = await self._open_node(node, ino, os.O_RDWR if kind == FILE_RW else os.O_RDONLY)
        except Miss:
            raise err(errno.ESTALE) from None
        return int(fi.fh)
