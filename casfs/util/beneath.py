"""The one way casfs touches files inside a directory a tenant can write.

casfsd runs as root. A tenant who can write a directory can swap any component
of a path inside it for a symlink between casfs's check and its use, so a path
string there (``upper/a/b``) may name ``/etc/shadow`` by the time it is opened.
Every path here is relative to a directory fd and resolved beneath it with no
symlink followed anywhere: ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)``,
or, where the kernel lacks openat2 (before 5.6), one component at a time with
``O_NOFOLLOW | O_DIRECTORY``. Operations on an entry act on its safely resolved
parent directory fd and the leaf name (``*at`` calls that never follow the
leaf). A symlink met or an escape refused raises OSError (ELOOP, EXDEV or
ENOTDIR): callers treat it as a refusal, never retry by path.

No mount point beneath the base is crossed either (``RESOLVE_NO_XDEV``; EXDEV):
a tenant's own FUSE mount inside her directory (``user_allow_other``) would
send root's calls to a server she runs, which may never answer
(casfs.util.statx).

``as_tenant(uid, gid)`` makes the calling thread act with a tenant's file-system
credentials, so the kernel's permission checks apply to what root does for it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import stat
from collections.abc import Iterator

from casfs.util import statx
from casfs.util.libc import libc

_SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64
_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}.get(platform.machine())
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV
DIR_FLAGS = os.O_PATH | os.O_DIRECTORY  # parents: used as dir fds only (search permission)
REFUSED = (errno.ELOOP, errno.EXDEV, errno.ENOTDIR)  # a symlink or an escape on the way


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


use_openat2 = platform.machine() in ("x86_64", "aarch64")  # False after ENOSYS (or in tests)


def open_base(path: str | os.PathLike[str], fuse: bool = False) -> int:
    """An O_PATH fd of a tenant directory itself, the base of the calls here. Its last
    component is not followed; its ancestors are casfs's own (the mount-base checks).
    EXDEV if it is on another user's FUSE file system (hers, stacked on a directory
    she owns) unless ``fuse`` (a destination an operator chose)."""
    fd = os.open(path, DIR_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not fuse:
        try:
            statx.refuse_user_fuse(fd, os.fspath(path))
        except BaseException:
            os.close(fd)
            raise
    return fd


def parts(rel: str) -> list[str]:
    """``rel``'s components; refused (EINVAL) unless a plain relative path."""
    comps = rel.split("/")
    if "\0" in rel or rel.startswith("/") or any(c in ("", ".", "..") for c in comps):
        raise OSError(errno.EINVAL, "not a plain relative path", rel)
    return comps


def _openat2(base: int, rel: str, flags: int, mode: int) -> int | None:
    """openat2's fd, or None where the kernel lacks it."""
    global use_openat2
    creates = flags & os.O_CREAT or flags & os.O_TMPFILE == os.O_TMPFILE  # (has O_DIRECTORY)
    how = _OpenHow(flags, mode if creates else 0, RESOLVE)  # a mode otherwise: EINVAL
    path = os.fsencode(rel)
    sys = libc().syscall
    for _ in range(16):  # EAGAIN: a rename elsewhere on the fs raced the lookup
        fd = sys(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(base), ctypes.c_char_p(path),
                 ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err == errno.ENOSYS:
            use_openat2 = False
            return None
        if err != errno.EAGAIN:
            raise OSError(err, os.strerror(err), rel)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), rel)


def _step(dirfd: int, name: str) -> int:
    """One directory component beneath ``dirfd``, never a symlink nor a mount point
    (fallback path: a mount made between the check and the open is still crossed)."""
    try:
        statx.refuse_mount(dirfd, name)
        return os.open(name, DIR_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
    except NotADirectoryError:
        if stat.S_ISLNK(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from None
        raise


def open(base: int, rel: str, flags: int, mode: int = 0o600) -> int:
    """``rel`` beneath ``base`` opened with ``flags`` (O_NOFOLLOW and O_CLOEXEC added)."""
    comps = parts(rel)
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    fd = _openat2(base, rel, flags, mode) if use_openat2 else None
    if fd is None:
        parent = base
        try:
            for c in comps[:-1]:
                nxt = _step(parent, c)
                if parent != base:
                    os.close(parent)
                parent = nxt
            with contextlib.suppress(FileNotFoundError):  # (O_CREAT makes it)
                statx.refuse_mount(parent, comps[-1])
            fd = os.open(comps[-1], flags, mode, dir_fd=parent)
        except OSError as e:
            raise OSError(e.errno, e.strerror, rel) from None  # the whole path, as openat2's
        finally:
            if parent != base:
                os.close(parent)
    if flags & os.O_PATH and stat.S_ISLNK(os.fstat(fd).st_mode):  # O_PATH|O_NOFOLLOW: the link
        os.close(fd)
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), rel)
    return fd


def open_read(base: int, rel: str, flags: int = 0) -> int:
    """For reading; O_NONBLOCK so a FIFO never hangs (the caller checks S_ISREG), and
    O_NOATIME where allowed (a job's atimes stay its own, casfs.util.noatime)."""
    flags |= os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY
    try:
        return open(base, rel, flags | os.O_NOATIME)
    except PermissionError as e:
        if e.errno != errno.EPERM:
            raise
        return open(base, rel, flags)


MAX_LINKS = 40  # symlinks one named path may pass through (the kernel's own bound)


def open_named(path: str) -> int:
    """An O_PATH fd of ``path``, an absolute path an operator named as root (``casfs
    umount PATH``), walked one component at a time through fds, mounts crossed.

    A symlink is followed only if it is root's, in a directory of root's that others
    cannot write (``/var/run -> /run``): any other (a tenant's ``/tmp/casfs-<uid>``
    swapped for a link to casfsd's own mount base) is refused with ELOOP, and no
    component can be swapped between a check and its use."""
    if not path.startswith("/"):
        raise OSError(errno.EINVAL, "not an absolute path", path)
    todo = [c for c in path.split("/") if c and c != "."]
    fd = os.open("/", DIR_FLAGS | os.O_CLOEXEC)
    links = 0
    try:
        while todo:
            name = todo.pop(0)
            nxt = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            st = statx.ident(nxt, "")  # (never a request to a FUSE server: hers may hang)
            if stat.S_ISLNK(st.mode):
                os.close(nxt)
                d = statx.ident(fd, "")
                links += 1
                open_dir = d.mode & 0o022 and not d.mode & stat.S_ISVTX  # (/tmp: sticky)
                if st.uid != 0 or d.uid != 0 or open_dir or links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "a symlink another user could have made or"
                                  " swapped: not followed", name)
                target = os.readlink(name, dir_fd=fd)
                todo = [c for c in target.split("/") if c and c != "."] + todo
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", DIR_FLAGS | os.O_CLOEXEC)
                continue
            if todo and not stat.S_ISDIR(st.mode):
                os.close(nxt)
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), name)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def walk(base: int, rel: str) -> Iterator[str]:
    """The relative path of everything but directories under the directory ``rel``,
    each directory opened beneath ``base`` (a symlink is listed, never descended)."""
    stack = [rel]
    while stack:
        d = stack.pop()
        try:
            fd = open_read(base, d, os.O_DIRECTORY)
        except OSError:
            continue
        try:
            with os.scandir(fd) as it:
                entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        except OSError:
            continue
        finally:
            os.close(fd)
        for name, is_dir in entries:
            if is_dir:
                stack.append(f"{d}/{name}")
            else:
                yield f"{d}/{name}"


def names(base: int, rel: str) -> list[str]:
    """The names in the directory ``rel`` beneath ``base`` ("" for ``base`` itself)."""
    fd = (open_read(base, rel, os.O_DIRECTORY) if rel else
          os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=base))
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def create(base: int, rel: str, mode: int = 0o600) -> int:
    """A new file, for writing; EEXIST if anything is there (a symlink included)."""
    return open(base, rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)


def open_write(base: int, rel: str) -> int:
    """An existing regular file, for writing (not truncated)."""
    return open(base, rel, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)


def open_dir(base: int, rel: str) -> int:
    """A directory beneath ``base``, as an O_PATH fd (a base for further calls)."""
    return open(base, rel, DIR_FLAGS)


@contextlib.contextmanager
def parent(base: int, rel: str) -> Iterator[tuple[int, str]]:
    """(fd of ``rel``'s parent, its leaf name); the fd is closed on exit."""
    comps = parts(rel)
    fd = open_dir(base, "/".join(comps[:-1])) if len(comps) > 1 else os.dup(base)
    try:
        yield fd, comps[-1]
    finally:
        os.close(fd)


def mkdirs(base: int, rel: str, mode: int = 0o777, exact: bool = False) -> int:
    """``mkdir -p rel`` beneath ``base``, a component at a time, following nothing;
    returns an O_PATH fd of the directory (the caller closes it). ``exact``: each
    directory made gets ``mode`` as it is (setgid included), not less the umask."""
    fd = os.dup(base)
    try:
        for c in parts(rel):
            try:
                os.mkdir(c, mode, dir_fd=fd)  # mkdirat: never follows a link at c
                if exact:
                    _chmod_made(fd, c, mode)
            except FileExistsError:
                pass
            nxt = open_dir(fd, c)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _chmod_made(fd: int, name: str, mode: int) -> None:
    """fchmod of the directory just made as ``name`` in ``fd`` (opened without following:
    one swapped in meanwhile is ELOOP, or someone else's and refused)."""
    d = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    try:
        os.fchmod(d, mode)
    finally:
        os.close(d)


def lstat(base: int, rel: str) -> os.stat_result:
    """``rel``'s lstat; EXDEV for a mount point (an fstatat by name would cross it):
    the leaf opened as O_PATH (a symlink itself, never followed), then fstat."""
    parts(rel)
    fd = (_openat2(base, rel, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, 0)
          if use_openat2 else None)
    if fd is None:
        with parent(base, rel) as (pfd, leaf):
            statx.refuse_mount(pfd, leaf)
            return os.stat(leaf, dir_fd=pfd, follow_symlinks=False)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def lexists(base: int, rel: str) -> bool:
    """Whether anything is at ``rel``; False when absent, raises a refusal as OSError."""
    try:
        lstat(base, rel)
    except FileNotFoundError:
        return False
    return True


def rename(base: int, src: str, dst: str) -> None:
    """renameat within ``base``: replaces ``dst`` (a symlink at the leaf is replaced, never
    followed)."""
    with parent(base, src) as (sfd, sleaf), parent(base, dst) as (dfd, dleaf):
        os.rename(sleaf, dleaf, src_dir_fd=sfd, dst_dir_fd=dfd)


def link(src: str | os.PathLike[str], base: int, rel: str, *,
         src_dir_fd: int | None = None) -> None:
    """Hard link ``src`` at ``rel`` beneath ``base`` (EEXIST if anything is there).

    ``src``: a path casfs trusts (outside tenant directories), or one relative to
    ``src_dir_fd``, a directory the tenant may write (then resolved like ``rel``)."""
    with parent(base, rel) as (dfd, leaf):
        if src_dir_fd is None:
            os.link(src, leaf, dst_dir_fd=dfd, follow_symlinks=False)
            return
        with parent(src_dir_fd, os.fspath(src)) as (sfd, sleaf):
            os.link(sleaf, leaf, src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)


def create_unnamed(dirfd: int, mode: int = 0o600) -> int | None:
    """An unnamed file (O_TMPFILE) in the directory ``dirfd`` (an fd from here), open
    for writing; None where the file system has none (the caller names a temp file)."""
    try:
        return os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, mode, dir_fd=dirfd)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return None
        raise


def link_unnamed(fd: int, dirfd: int, leaf: str) -> None:
    """Name the unnamed file ``fd`` ``leaf`` in the directory ``dirfd``: EEXIST if
    anything is there (linkat never follows nor replaces its new name)."""
    if "/" in leaf or leaf in ("", ".", ".."):
        raise OSError(errno.EINVAL, "not a plain name", leaf)
    os.link(_proc(fd), leaf, dst_dir_fd=dirfd, follow_symlinks=True)


def unlink(base: int, rel: str) -> None:
    with parent(base, rel) as (fd, leaf):
        os.unlink(leaf, dir_fd=fd)


def rmdir(base: int, rel: str) -> None:
    with parent(base, rel) as (fd, leaf):
        os.rmdir(leaf, dir_fd=fd)


def rmtree(base: int, rel: str) -> None:
    """``rm -rf rel`` beneath ``base``, best effort: nothing followed, no mount point
    entered (what lies under one stays, with the directories above it), no recursion
    (a tree as deep as a path may be). shutil.rmtree lstat()s each name, which a
    tenant's FUSE mount there answers, or never does."""
    stack = [(rel, False)]
    while stack:
        d, listed = stack.pop()
        if listed:
            with contextlib.suppress(OSError):
                rmdir(base, d)
            continue
        try:
            fd = open_read(base, d, os.O_DIRECTORY)
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP):  # a file or a symlink: unlinked
                with contextlib.suppress(OSError):
                    unlink(base, d)
            continue  # (EXDEV: a mount point, left)
        try:
            with os.scandir(fd) as it:
                entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        except OSError:
            entries = []
        finally:
            os.close(fd)
        stack.append((d, True))
        for name, is_dir in entries:
            if is_dir:
                stack.append((f"{d}/{name}", False))
            else:
                with contextlib.suppress(OSError):
                    unlink(base, f"{d}/{name}")


def _proc(fd: int) -> str:
    # Linux has no fchmodat(AT_SYMLINK_NOFOLLOW) before 6.6, and fchmod refuses O_PATH
    # fds: the fd's /proc entry names exactly the inode opened (never a symlink: refused).
    return f"/proc/self/fd/{fd}"


def chmod(base: int, rel: str, mode: int) -> None:
    fd = open(base, rel, os.O_PATH)
    try:
        os.chmod(_proc(fd), mode)
    finally:
        os.close(fd)


def chown(base: int, rel: str, uid: int, gid: int) -> None:
    fd = open(base, rel, os.O_PATH)
    try:
        os.chown(_proc(fd), uid, gid)
    finally:
        os.close(fd)


def utime(base: int, rel: str, ns: tuple[int, int]) -> None:
    fd = open(base, rel, os.O_PATH)
    try:
        os.utime(_proc(fd), ns=ns)
    finally:
        os.close(fd)


# --- acting as the tenant --------------------------------------------------------
def _fsid(call: str, value: int) -> int:
    """setfsuid/setfsgid: per thread (glibc does not broadcast them to other threads,
    as it does setuid's); returns the previous id. -1 changes nothing: a query."""
    fn = getattr(libc(), call)
    return int(fn(ctypes.c_uint(value & 0xFFFFFFFF)))


def _setgroups(groups: list[int]) -> None:
    """The raw setgroups syscall: this thread only (glibc's os.setgroups would set
    every thread's, the whole daemon's)."""
    if _SYS_SETGROUPS is None:
        raise OSError(errno.ENOSYS, "setgroups: unknown syscall number on this machine")
    arr = (ctypes.c_uint * max(1, len(groups)))(*groups)
    if libc().syscall(ctypes.c_long(_SYS_SETGROUPS), ctypes.c_size_t(len(groups)), arr) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), "setgroups")


@contextlib.contextmanager
def as_tenant(uid: int | None, gid: int | None = None) -> Iterator[None]:
    """Within the block, this thread's file operations are checked as ``uid``/``gid``
    (its fs ids; supplementary groups just ``gid``: root's own groups must not
    apply). A no-op when casfs is not root or ``uid`` is None or 0. A thread started
    inside the block inherits them: start none there."""
    if uid is None or uid == 0 or os.geteuid() != 0:
        yield
        return
    g = gid if gid is not None else uid
    groups = os.getgroups()
    _setgroups([g])
    old_gid = _fsid("setfsgid", g)
    old_uid = _fsid("setfsuid", uid)
    try:
        if _fsid("setfsuid", -1) != uid or _fsid("setfsgid", -1) != g:
            raise OSError(errno.EPERM, "setfsuid/setfsgid did not take", str(uid))
        yield
    finally:
        _fsid("setfsuid", old_uid)
        _fsid("setfsgid", old_gid)
        _setgroups(groups)
