"""One FUSE session serving many namespaces: ``<base>/<tenant>/<namespace>/``.

pyfuse3 allows one session per process, and a process per namespace would
make a job with nine cache families nine processes. The multiplexer is the
session's Operations: it owns the two synthetic levels (the base and one
directory per tenant) and routes every other request to the per-namespace
``OverlayOperations`` that owns the inode or handle, unchanged.

Inode numbers are partitioned: namespace slot ``k`` owns ``k << SLOT_BITS``
up to the next slot (its root is ``(k << SLOT_BITS) | 1``); slot 0 holds the
synthetic directories. Each namespace's InodeTable hands out numbers in its own
range, so its kernel invalidations already carry the right numbers. Slots are
never reused within a session, so a stale kernel inode of a detached namespace
can never reach a newer one (it gets ENOENT).

Handles are translated: the mux hands the kernel its own numbers and keeps
(operations, inner handle), so namespaces may number handles as they like and
a handle opened before a detach still releases on the right operations. Its
numbers come from a HandleSlots table (casfs.view.handleslots) naming each
handle's inode and kind; kept in a file (``keep_handles``), a process adopting
the connection after a crash reopens each handle on first use through the
namespace's ``reopen`` (casfs.view.op_restore). ``layout()`` is what else such
a process needs: which slot is which namespace, and the tenants' inodes.

Attach and detach happen at run time, on the trio thread (no remount).

An open file handle may hold a file descriptor of this process (an upper
file, a cold object), and the process's RLIMIT_NOFILE is shared by every
tenant: one tenant's jobs may hold at most ``handles_per_tenant`` (a quarter
of that limit) such handles here at once; past it its own opens get EMFILE,
and the other tenants' opens, the leases' checks of /proc and the control
socket keep their descriptors (docs/security.md).
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyfuse3

from casfs.view.handleslots import DIR, FILE_RO, FILE_RW, HandleSlots
from casfs.view.inodes import InodeTable

log = logging.getLogger(__name__)

SLOT_BITS = 40
MAX_SLOTS = (1 << (64 - SLOT_BITS)) - 1
ROOT = pyfuse3.ROOT_INODE
LAYOUT_VERSION = 1  # docs/format.md "Node state dir", host-served.json "mux"
SYNTH_TIMEOUT = 1.0  # synthetic directories change (namespaces come and go)

HANDLE_SHARE = 4  # one tenant's open handles: at most the open-file limit / this
HANDLE_WARN_S = 60.0  # a tenant at its bound is logged at most this often


def handles_per_tenant() -> int:
    """The most handles one tenant may hold open here: a quarter of RLIMIT_NOFILE."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(64, soft // HANDLE_SHARE)


# uid, gid, permission bits of a tenant's directory
Owner = Callable[[str], tuple[int, int, int]]


def ns_root_inode(slot: int) -> int:
    return (slot << SLOT_BITS) | ROOT


def slot_of(ino: int) -> int:
    return ino >> SLOT_BITS


def _default_owner(tenant: str) -> tuple[int, int, int]:
    return os.geteuid(), os.getegid(), 0o755


def _err(code: int) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(code)


def _kind(flags: int) -> int:
    """How a reopen after a crash opens it (as casfs.view.op_files counts writable)."""
    return FILE_RW if flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC else FILE_RO


@dataclass
class _Slot:
    tenant: str
    name: str
    ops: Any  # OverlayOperations (or anything with the same handlers)


class MuxOperations(pyfuse3.Operations):
    # As the namespaces' OverlayOperations (casfs.view.op_base): the kernel
    # batches small writes; the flag is read from the session's Operations.
    enable_writeback_cache = True

    def __init__(self, *, owner: Owner = _default_owner, statfs_path: Path | None = None) -> None:
        super().__init__()
        self._owner = owner
        self._statfs_path = statfs_path
        self._mounted = False
        self._start_ns = time.time_ns()
        self._tenant_ino: dict[str, int] = {}
        self._tenant_of: dict[int, str] = {}
        self._next_synth = ROOT + 1
        self._ns: dict[tuple[str, str], int] = {}  # (tenant, namespace) -> slot
        self._slots: dict[int, _Slot] = {}
        self._next_slot = 1
        self._fh: dict[int, tuple[Any, int]] = {}  # mux file handle -> (ops, inner fh)
        self._dh: dict[int, tuple[Any, Any]] = {}  # mux dir handle -> (ops | None, inner)
        self.handles = HandleSlots()  # the numbers of both (in memory until keep_handles)
        self.handles_per_tenant = handles_per_tenant()
        self._open_by: dict[str, int] = {}  # tenant -> handles it holds open
        self._holder: dict[int, str] = {}  # mux handle -> its tenant
        self._warned: dict[str, float] = {}  # tenant -> when its bound was last logged
        self.handles_refused = 0

    # --- what a process adopting the connection needs (casfs.view.adopt) -----------
    def keep_handles(self, path: Path, restore_from: Path | None = None) -> None:
        """Handle numbers kept in ``path`` (root-only run dir); ``restore_from``: those
        a crashed process gave out, each reopened on first use."""
        self.handles.close()
        self.handles = HandleSlots(path, restore_from=restore_from)

    def layout(self) -> dict[str, Any]:
        """The inode numbers the kernel knows the synthetic levels and slots by."""
        return {"v": LAYOUT_VERSION, "tenants": dict(self._tenant_ino),
                "next_synth": self._next_synth,
                "next_slot": self._next_slot,
                "slots": {str(k): [s.tenant, s.name] for k, s in self._slots.items()}}

    def restore_layout(self, layout: dict[str, Any]) -> list[tuple[int, str, str]]:
        """Number as ``layout`` (a crashed process's) did; its (slot, tenant, namespace),
        for the caller to attach each at its slot. ValueError if malformed."""
        if layout.get("v") != LAYOUT_VERSION:  # a newer release's: not read as ours
            raise ValueError(f"layout format {layout.get('v')}; this release reads"
                             f" {LAYOUT_VERSION}")
        tenants = {str(t): int(i) for t, i in dict(layout["tenants"]).items()}
        for t, i in tenants.items():
            if slot_of(i) or i <= ROOT:
                raise ValueError(f"bad tenant inode {i}")
            self._tenant_ino[t] = i
            self._tenant_of[i] = t
        self._next_synth = max(int(layout["next_synth"]), max(tenants.values(), default=ROOT) + 1)
        slots = [(int(k), str(v[0]), str(v[1])) for k, v in dict(layout["slots"]).items()]
        self._next_slot = max(int(layout["next_slot"]), max((k for k, _, _ in slots),
                                                            default=0) + 1)
        return sorted(slots)

    # --- attach / detach ----------------------------------------------------
    def attach(self, tenant: str, name: str, ops: Any, slot: int | None = None) -> int:
        """Serve ``ops`` at ``<tenant>/<name>``; returns its slot. ValueError if taken.
        ``slot``: the one a crashed process served it in (``restore_layout``)."""
        for part in (tenant, name):
            if not part or "/" in part or part in (".", "..") or "\0" in part:
                raise ValueError(f"bad directory name {part!r}")
        if (tenant, name) in self._ns:
            raise ValueError(f"{tenant}/{name} is already served")
        if slot is not None:
            if not 0 < slot < self._next_slot or slot in self._slots:
                raise ValueError(f"slot {slot} is not free")
        elif self._next_slot > MAX_SLOTS:
            raise ValueError("out of namespace slots for this session")
        else:
            slot = self._next_slot
            self._next_slot += 1
        # The namespace's inode numbers live in its slot's range (see module doc).
        ops.inodes = InodeTable(root=ns_root_inode(slot))
        self._tenant(tenant)
        self._slots[slot] = _Slot(tenant, name, ops)
        self._ns[(tenant, name)] = slot
        if self._mounted:
            ops.init()
        return slot

    def detach(self, tenant: str, name: str) -> Any | None:
        """Stop routing to ``<tenant>/<name>``; returns its operations (None if unknown).

        Open handles keep working until released; any other request for one of
        its inodes gets ENOENT. The kernel is told to drop the directory entry.
        """
        slot = self._ns.pop((tenant, name), None)
        if slot is None:
            return None
        s = self._slots.pop(slot)
        if self._mounted:
            pyfuse3.invalidate_entry_async(self._tenant_ino[tenant], os.fsencode(name),
                                           ignore_enoent=True)
        return s.ops

    def served(self) -> list[tuple[str, str]]:
        return sorted(self._ns)

    def slot(self, tenant: str, name: str) -> int | None:
        return self._ns.get((tenant, name))

    def ops_of(self, tenant: str, name: str) -> Any | None:
        slot = self._ns.get((tenant, name))
        return self._slots[slot].ops if slot is not None else None

    def _tenant(self, tenant: str) -> int:
        ino = self._tenant_ino.get(tenant)
        if ino is None:
            ino = self._next_synth
            self._next_synth += 1
            self._tenant_ino[tenant] = ino
            self._tenant_of[ino] = tenant
        return ino

    # --- routing ----------------------------------------------------------------
    def _ops(self, ino: int) -> Any:
        s = self._slots.get(slot_of(ino))
        if s is None:
            raise _err(errno.ENOENT)  # a detached namespace, or a synthetic directory
        return s.ops

    def _same_ops(self, a: int, b: int) -> Any:
        if slot_of(a) != slot_of(b):
            raise _err(errno.EXDEV if slot_of(a) and slot_of(b) else errno.EACCES)
        return self._ops(a)

    def _writable(self, parent: int) -> Any:
        """Operations for a change under ``parent``; the synthetic levels are read-only."""
        if slot_of(parent) == 0:
            raise _err(errno.EACCES)
        return self._ops(parent)

    def _new_fh(self, ops: Any, inner: Any, table: dict[int, Any], ino: int, kind: int,
                tenant: str | None = None) -> int:
        fh = self.handles.alloc(ino, kind)
        table[fh] = (ops, inner)
        if tenant is not None:
            self._holder[fh] = tenant
            self._open_by[tenant] = self._open_by.get(tenant, 0) + 1
        return fh

    @staticmethod
    def _fd_of(ops: Any, inner: int, tenant: str) -> str | None:
        """``tenant`` if the handle holds a descriptor of its own (counted), else None. (A
        warm object's shared descriptor, a directory's snapshot: nothing per handle; and
        the kernel sends RELEASE in the background, after the close, so a job opening
        many files in turn may hold more handles here than it has files open.)"""
        owns = getattr(ops, "owns_fd", None)
        return tenant if owns is None or owns(inner) else None

    def _admit(self, inode: int) -> str:
        """The tenant of ``inode``'s namespace, if it may open one more handle; EMFILE
        for it (one warning a minute) once it holds ``handles_per_tenant``."""
        s = self._slots.get(slot_of(inode))
        if s is None:
            raise _err(errno.ENOENT)
        held = self._open_by.get(s.tenant, 0)
        if held >= self.handles_per_tenant:
            self.handles_refused += 1
            now = time.monotonic()
            if now - self._warned.get(s.tenant, -HANDLE_WARN_S) >= HANDLE_WARN_S:
                self._warned[s.tenant] = now
                log.warning("tenant %s holds %d open files on this node's mount, the most"
                            " one tenant may (a quarter of the process's open-file limit):"
                            " its further opens get EMFILE", s.tenant, held)
            raise _err(errno.EMFILE)
        return s.tenant

    def _let_go(self, fh: int) -> None:
        tenant = self._holder.pop(fh, None)
        if tenant is not None:
            n = self._open_by[tenant] - 1
            if n > 0:
                self._open_by[tenant] = n
            else:
                del self._open_by[tenant]

    async def _held(self, fh: int, table: dict[int, Any]) -> Any:
        """``table``'s entry for a handle of the crashed process (reopened now); EBADF
        for a number nobody gave out. (Callers try the table first: no coroutine per
        request on the hot path.)"""
        if fh not in self.handles.held:
            raise _err(errno.EBADF)
        await self._reopen(fh)
        return table[fh]

    async def _reopen(self, fh: int) -> None:
        """Open handle ``fh`` of the crashed process again (in ``handles.held``): a
        synthetic directory lists again; a namespace's reopens its inode."""
        ino, kind = self.handles.held[fh]
        ops: Any = None
        if kind == DIR and slot_of(ino) == 0:
            inner: Any = (ino, self._synth_children(ino))
        else:
            s = self._slots.get(slot_of(ino))
            if s is None:  # detached before the crash, or not served again
                raise _err(errno.ESTALE)
            ops = s.ops
            inner = await ops.reopen(ino, kind)
        if fh not in self.handles.held:  # reopened (or released) meanwhile: ours goes
            if ops is not None:
                await (ops.releasedir(inner) if kind == DIR else ops.release(inner))
            if fh not in self._fh and fh not in self._dh:
                raise _err(errno.EBADF)
            return
        del self.handles.held[fh]
        (self._dh if kind == DIR else self._fh)[fh] = (ops, inner)

    # --- synthetic directories ---------------------------------------------------
    def _synth_attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        if ino == ROOT:
            uid, gid, mode = os.geteuid(), os.getegid(), 0o755
        else:
            uid, gid, mode = self._owner(self._tenant_of[ino])
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = stat.S_IFDIR | mode
        a.st_nlink = 2
        a.st_uid, a.st_gid = uid, gid
        a.st_size = 0
        a.st_blksize = 4096
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self._start_ns
        a.entry_timeout = a.attr_timeout = SYNTH_TIMEOUT
        a.generation = 0
        return a

    async def _ns_root_attrs(self, slot: int, ctx: pyfuse3.RequestContext
                             ) -> pyfuse3.EntryAttributes:
        attrs = await self._slots[slot].ops.getattr(ns_root_inode(slot), ctx)
        attrs.entry_timeout = SYNTH_TIMEOUT  # the namespace may be detached
        return attrs

    def _synth_children(self, ino: int) -> list[tuple[str, int]]:
        """(name, inode) under a synthetic directory; a namespace's inode is its root."""
        if ino == ROOT:
            return sorted(self._tenant_ino.items())
        tenant = self._tenant_of.get(ino)
        if tenant is None:
            raise _err(errno.ENOENT)
        return sorted((n, ns_root_inode(s)) for (t, n), s in self._ns.items() if t == tenant)

    # --- lifecycle ----------------------------------------------------------------
    def init(self) -> None:
        self._mounted = True
        for s in self._slots.values():
            s.ops.init()

    # --- names --------------------------------------------------------------------
    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
                     ) -> pyfuse3.EntryAttributes:
        if slot_of(parent_inode):
            return await self._ops(parent_inode).lookup(parent_inode, name, ctx)
        sname = os.fsdecode(name)
        if sname == ".":
            return self._synth_attrs(parent_inode)
        if sname == "..":
            return self._synth_attrs(ROOT)
        for child, ino in self._synth_children(parent_inode):
            if child == sname:
                if slot_of(ino):
                    return await self._ns_root_attrs(slot_of(ino), ctx)
                return self._synth_attrs(ino)
        raise _err(errno.ENOENT)

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        by_slot: dict[int, list[tuple[int, int]]] = {}
        for ino, n in inode_list:
            if slot_of(ino):
                by_slot.setdefault(slot_of(ino), []).append((ino, n))
        for slot, items in by_slot.items():
            s = self._slots.get(slot)
            if s is not None:
                await s.ops.forget(items)

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if slot_of(inode) == 0:
            if inode != ROOT and inode not in self._tenant_of:
                raise _err(errno.ENOENT)
            return self._synth_attrs(inode)
        return await self._ops(inode).getattr(inode, ctx)

    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes,
                      fields: pyfuse3.SetattrFields, fh: int | None,
                      ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        ops = self._writable(inode)
        inner = None  # a crashed process's handle (not reopened): by inode, as without
        if fh is not None and fh in self._fh:
            inner = self._fh[fh][1]
        return await ops.setattr(inode, attr, fields, inner, ctx)

    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        return await self._ops(inode).readlink(inode, ctx)

    async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return await self._writable(parent_inode).mkdir(parent_inode, name, mode, ctx)

    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return await self._writable(parent_inode).mknod(parent_inode, name, mode, rdev, ctx)

    async def symlink(self, parent_inode: int, name: bytes, target: bytes,
                      ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return await self._writable(parent_inode).symlink(parent_inode, name, target, ctx)

    async def link(self, inode: int, new_parent_inode: int, new_name: bytes,
                   ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self._writable(new_parent_inode)
        ops = self._same_ops(inode, new_parent_inode)
        return await ops.link(inode, new_parent_inode, new_name, ctx)

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self._writable(parent_inode).unlink(parent_inode, name, ctx)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self._writable(parent_inode).rmdir(parent_inode, name, ctx)

    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int,
                     name_new: bytes, flags: int, ctx: pyfuse3.RequestContext) -> None:
        self._writable(parent_inode_old)
        self._writable(parent_inode_new)
        ops = self._same_ops(parent_inode_old, parent_inode_new)
        await ops.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx)

    # --- files ----------------------------------------------------------------------
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext
                   ) -> pyfuse3.FileInfo:
        if slot_of(inode) == 0:
            raise _err(errno.EISDIR)
        ops = self._ops(inode)
        tenant = self._admit(inode)
        fi = await ops.open(inode, flags, ctx)
        fi.fh = self._new_fh(ops, fi.fh, self._fh, inode, _kind(flags), self._fd_of(
            ops, fi.fh, tenant))
        return fi

    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext
                     ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        ops = self._writable(parent_inode)
        tenant = self._admit(parent_inode)
        fi, attrs = await ops.create(parent_inode, name, mode, flags, ctx)
        fi.fh = self._new_fh(ops, fi.fh, self._fh, attrs.st_ino, _kind(flags),
                             self._fd_of(ops, fi.fh, tenant))
        return fi, attrs

    async def read(self, fh: int, off: int, size: int) -> bytes:
        ops, inner = self._fh.get(fh) or await self._held(fh, self._fh)
        return await ops.read(inner, off, size)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        ops, inner = self._fh.get(fh) or await self._held(fh, self._fh)
        return await ops.write(inner, off, buf)

    async def flush(self, fh: int) -> None:
        ops, inner = self._fh.get(fh) or await self._held(fh, self._fh)
        await ops.flush(inner)

    async def fsync(self, fh: int, datasync: bool) -> None:
        ops, inner = self._fh.get(fh) or await self._held(fh, self._fh)
        await ops.fsync(inner, datasync)

    async def release(self, fh: int) -> None:
        entry = self._fh.pop(fh, None)
        self._let_go(fh)
        if entry is not None or fh in self.handles.held:
            self.handles.free(fh)
        if entry is not None:
            await entry[0].release(entry[1])

    # --- directories ------------------------------------------------------------------
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        if slot_of(inode) == 0:
            # Snapshot at opendir, like the namespaces do: offsets stay meaningful.
            return self._new_fh(None, (inode, self._synth_children(inode)), self._dh, inode,
                                DIR)
        ops = self._ops(inode)
        self._admit(inode)
        return self._new_fh(ops, await ops.opendir(inode, ctx), self._dh, inode, DIR)

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        ops, inner = self._dh.get(fh) or await self._held(fh, self._dh)
        if ops is not None:
            await ops.readdir(inner, start_id, token)
            return
        _ino, children = inner
        ctx = pyfuse3.RequestContext()
        for i in range(start_id, len(children)):
            name, ino = children[i]
            if slot_of(ino):
                if slot_of(ino) not in self._slots:
                    continue  # detached since opendir
                attrs = await self._ns_root_attrs(slot_of(ino), ctx)
            else:
                attrs = self._synth_attrs(ino)
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attrs, i + 1):
                return

    async def releasedir(self, fh: int) -> None:
        entry = self._dh.pop(fh, None)
        self._let_go(fh)
        if entry is not None or fh in self.handles.held:
            self.handles.free(fh)
        if entry is not None and entry[0] is not None:
            await entry[0].releasedir(entry[1])

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        entry = self._dh.get(fh)
        if entry is not None and entry[0] is not None:
            await entry[0].fsyncdir(entry[1], datasync)

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        s = os.statvfs(self._statfs_path or "/")
        d = pyfuse3.StatvfsData()
        for f in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                  "f_ffree", "f_favail", "f_namemax"):
            setattr(d, f, getattr(s, f))
        return d
