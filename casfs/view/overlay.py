"""The ``overlay`` view mode: the kernel's overlayfs, so warm reads and writes run natively.

Layers, top to bottom (all on node-local disk except where said)::

    upper   <state>/upper/<ns>              the job's writes (overlayfs upperdir)
    links   <state>/overlay/<ns>/links      one hard link into the local object cache
                                            per lower entry whose object was on the
                                            node at mount time
    fuse    <state>/overlay/<ns>/fuse       the read-only casfs FUSE view of the
                                            served generation: everything else,
                                            fetched lazily on first open
    work    <state>/overlay/<ns>/work       overlayfs workdir (same fs as upper)

A mount process that replaces another under running jobs (casfs.node.handover)
has layers of its own, ``links@<pid>``, ``fuse@<pid>`` and ``work@<pid>`` ("@" is
never in a namespace's name: the loopfs work directories of all namespaces share a parent): the
old overlay keeps its layers for as long as jobs hold files on it, over the
same upper (mounted ``index=off``: overlayfs allows two overlays on one upper
then, with a warning; the old one only serves what jobs already hold). A
dead process's layers are removed by the next start (``clean_stale``).

A file whose object is local is served by the kernel from ``links`` without a
FUSE round trip; overlayfs copies it up before any write, so a job (the linker
rewriting a ``.so`` in place) can never modify a shared cache object. Files a
family presents differently from their stored bytes (``PathBearing``: Triton
group files name absolute paths) are generated into ``links`` as copies of the
presented bytes, never linked. A linked file shows the cache object's inode
(mode 0444, owner of the daemon, mtime of the fetch): contents are what
compilers check, not these.

Whiteouts and opaque directories are overlayfs's own (casfs.view.whiteout uses
the same format in every mode), and the upper is swept at each activation.

Refresh under a mounted overlay: the kernel calls changes to a lower layer of a
mounted overlay undefined. casfs changes only the FUSE layer, and only by
adding entries (published paths never change bytes); ``links`` is fixed for
the life of the mount. An added entry is visible through the overlay at a name
the overlay has not looked up yet (tested), except under a directory that
was wholly local at mount time (sealed: see ``build_links``), where it shows
at the next mount; a name it already looked up and
found absent may stay absent (a cached negative dentry) until the kernel
drops it or the next mount. That is a cache miss, never wrong bytes: the job
recompiles. Jobs that must see every new entry remount between jobs.

Needs CAP_SYS_ADMIN (mount(2)); without it, callers fall back to ``fuse``.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from casfs.store.entry import Entry
from casfs.util.libc import libc
from casfs.view import whiteout

log = logging.getLogger(__name__)

CAP_SYS_ADMIN = 21
MNT_DETACH = 2


def unavailable_reason() -> str | None:
    """Why an overlay cannot be mounted here (one line), or None if it can."""
    try:
        with open("/proc/self/status") as f:
            caps = next((ln.split()[1] for ln in f if ln.startswith("CapEff:")), "0")
        if not int(caps, 16) >> CAP_SYS_ADMIN & 1:
            return "overlay mode needs CAP_SYS_ADMIN to mount overlayfs"
        with open("/proc/filesystems") as f:
            if not any(ln.split()[-1:] == ["overlay"] for ln in f):
                return "the kernel has no overlayfs (modprobe overlay)"
    except (OSError, ValueError) as e:
        return f"cannot check for overlayfs: {e}"
    return None


@dataclass(frozen=True)
class OverlayPaths:
    upper: Path
    base: Path  # <state>/overlay/<ns>
    # overlayfs's workdir, on the upper's filesystem: <base>/work unless the upper lives
    # on the tenant's own filesystem (casfs.node.quota, mechanism "loopfs")
    work_dir: Path | None = None
    suffix: str = ""  # "@<pid>": a successor's own layers (the module's docstring)

    @property
    def links(self) -> Path:
        return self.base / f"links{self.suffix}"

    @property
    def fuse(self) -> Path:
        return self.base / f"fuse{self.suffix}"

    @property
    def fuse_upper(self) -> Path:
        """The FUSE layer's upper: always empty (the layer is mounted read-only)."""
        return self.base / "fuse-upper"

    @property
    def work(self) -> Path:
        if self.work_dir is None:
            return self.base / f"work{self.suffix}"
        return self.work_dir.with_name(self.work_dir.name + self.suffix)

    def own(self, pid: int) -> OverlayPaths:
        """The layers of a successor with process id ``pid``."""
        return dataclasses.replace(self, suffix=f"@{pid}")


LAYERS = ("links", "fuse", "work")


def clean_stale(paths: OverlayPaths, alive: Callable[[int], bool]) -> int:
    """Remove the per-process layers (``<layer>@<pid>``) of processes no longer alive:
    left by a successor that was stopped or died. A dead FUSE layer's mount goes
    first (lazily). The number of directories removed."""
    import shutil

    n = 0
    places = [(paths.base, layer) for layer in LAYERS]
    if paths.work_dir is not None:
        places.append((paths.work_dir.parent, paths.work_dir.name))
    for parent, layer in places:
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            head, _, pid = name.rpartition("@")
            if head != layer or not pid.isdigit() or alive(int(pid)):
                continue
            path = parent / name
            if layer == "fuse":  # a dead process's FUSE mount, if any (EINVAL: none)
                libc().umount2(os.fsencode(path), MNT_DETACH)
            shutil.rmtree(path, ignore_errors=True)
            n += 1
    return n


def links_of(options: str) -> Path | None:
    """The links layer of an overlay mounted by ``mount``, from its mount options."""
    for opt in options.split(","):
        if opt.startswith("lowerdir="):
            return Path(opt[len("lowerdir="):].split(":", 1)[0])
    return None


# Tasks building a links dir at once (build_links): 4 measured best on 2 cores (the
# syscalls wait on the disk, not the CPU).
LINK_THREADS = 4


@dataclass
class LinkReport:
    linked: int = 0
    generated: int = 0
    absent: int = 0  # object not on the node: served by the FUSE layer
    sealed_dirs: int = 0  # directories wholly local: marked opaque over the FUSE layer


def build_links(
    links: Path,
    entries: Iterable[Entry],
    local_path: Callable[[Entry], str | None],
    present: Callable[[Entry, str], bytes | None] | None = None,
    *,
    dir_mode: int = 0o777,
    owner: tuple[int, int] | None = None,
    early: EarlyLinks | None = None,
) -> LinkReport:
    """Fill ``links`` (emptied first, unless ``early`` began it: what that made counts
    as made here, untouched) with the entries whose objects are local.

    ``local_path(entry)`` is the cached object's path or None; ``present(entry,
    path)`` returns bytes to write instead of a link (a family rewrites the
    file for this mount) or None to link the object as is.

    A directory (other than the top) whose every entry is linked is *sealed*:
    marked opaque, so overlayfs does not merge it with the FUSE layer at all
    (no FUSE lookup, opendir or readdir under it; measured: a merged directory
    costs reads ~3x). The price: an entry a refresh adds under a sealed
    directory shows only at the next mount.

    Directories get ``owner`` (uid, gid) and ``dir_mode``: the tenant's, as the
    merged view shows them and as overlayfs copies them up when a job writes in
    one. Never wider: a 0777 directory here became a world-writable key directory
    in the tenant's cache (issue 21).
    """
    from concurrent.futures import ThreadPoolExecutor

    rep = LinkReport()
    made: set[str] = set()
    done = early.done if early is not None else {}
    if early is None:
        _reset(links, dir_mode, owner)
    else:  # what it made is made (its directories too): only counted here
        made |= early.made
    # One task per top-level directory (a Triton or Inductor key dir), a few at once:
    # a fresh node makes thousands of inodes here right after its fetch, and each is a
    # syscall that waits on the disk's metadata (0.1-0.9 ms on ext4 here) with the
    # GIL released. No two tasks touch one directory: the top's own files are a task.
    groups: dict[str, list[Entry]] = {}
    for e in entries:  # read here: the index's read transaction is this thread's
        generated = done.get(e.path)
        if generated is None:
            groups.setdefault(e.path.split("/", 1)[0] if "/" in e.path else "", []).append(e)
        elif generated:
            rep.generated += 1
        else:
            rep.linked += 1

    def link_group(group: list[Entry]) -> tuple[LinkReport, set[str], set[str]]:
        made: set[str] = {""}
        partial: set[str] = set()  # directories with an entry served by FUSE
        rep = LinkReport()

        def absent(path: str) -> None:
            rep.absent += 1
            d = os.path.dirname(path)
            while d and d not in partial:
                partial.add(d)
                d = os.path.dirname(d)

        for e in group:
            src = local_path(e)
            if src is None:
                absent(e.path)
                continue
            parent = os.path.dirname(e.path)
            if parent not in made:
                _mkdirs(links, parent, made, dir_mode, owner)
            try:
                if _link_one(links, e, src, present):
                    rep.generated += 1
                else:
                    rep.linked += 1
            except OSError as err:  # EXDEV, EMLINK, a vanished object: FUSE serves it
                log.debug("not linking %s: %s", e.path, err)
                absent(e.path)
        return rep, made, partial

    partial: set[str] = set()
    with ThreadPoolExecutor(LINK_THREADS, thread_name_prefix="links") as pool:
        for r, m, p in pool.map(link_group, groups.values()):
            rep.linked += r.linked
            rep.generated += r.generated
            rep.absent += r.absent
            made |= m
            partial |= p
    for d in made - partial - {""}:
        try:
            whiteout.make_opaque(str(links / d))
            rep.sealed_dirs += 1
        except OSError as err:  # no xattrs here: the directory stays merged
            log.debug("not sealing %s: %s", d, err)
    return rep


def _reset(links: Path, dir_mode: int, owner: tuple[int, int] | None) -> None:
    import shutil

    shutil.rmtree(links, ignore_errors=True)
    links.mkdir(parents=True)
    _own(links, dir_mode, owner)


def _link_one(links: Path | str, e: Entry, src: str,
              present: Callable[[Entry, str], bytes | None] | None) -> bool:
    """Put ``e`` into ``links``: its presented bytes written (True) or its object
    linked (False). A file begun and not finished is removed: a name in ``links``
    is served as it is, above the FUSE layer. (Paths as strings: a fresh node
    links thousands of files here, and pathlib's joins were a third of that.)"""
    target = f"{links}/{e.path}"
    data = present(e, src) if present is not None else None
    if data is None:
        os.link(src, target)
        return False
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, e.mode & 0o777)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.utime(target, ns=(e.mtime_ns, e.mtime_ns))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(target)
        raise
    return True


class EarlyLinks:
    """A links dir begun while a fresh node's prefetch installs the namespace (overlay
    mode's warm wait): each object the prefetch installs is linked (or its file
    generated) at once, in a thread, so the final ``build_links(early=...)`` after the
    wait finds most of the tree made and only seals it and adds the rest.

    Measured on a fresh node (4,800 files, local root): the links layer took 0.46 s
    after warm-ready, one inode or link at a time on the disk; made beside the
    prefetch's installs it overlaps them. Nothing here decides what is served: an
    entry that fails or never arrives is left to the final pass."""

    def __init__(self, links: Path, entries: Iterable[Entry],
                 local_path: Callable[[Entry], str | None],
                 present: Callable[[Entry, str], bytes | None] | None = None, *,
                 dir_mode: int = 0o777, owner: tuple[int, int] | None = None) -> None:
        import queue
        import threading

        _reset(links, dir_mode, owner)
        self.links = links
        self._links = str(links)
        self._local_path = local_path
        self._present = present
        self._dir_mode, self._owner = dir_mode, owner
        self._made: set[str] = {""}
        self.done: dict[str, bool] = {}  # path -> generated (else linked), once made
        self._queue: queue.SimpleQueue[list[str] | None] = queue.SimpleQueue()
        # ``entries`` is read in the thread (an index walk's read transaction is the
        # thread's that iterates it), while the prefetch starts.
        self._thread = threading.Thread(target=self._run, args=(entries,),
                                        name="links-early", daemon=True)
        self._thread.start()

    def installed(self, digests: list[str]) -> None:
        """Objects now local and verified (LocalObjectCache's install hook)."""
        self._queue.put(digests)

    def stop(self) -> None:
        """No more announcements: the thread links what it was told, then ends."""
        self._queue.put(None)

    def join(self) -> None:
        """Wait for that (before the final pass runs)."""
        self._thread.join()

    @property
    def made(self) -> set[str]:
        """The directories made (relative; "" the top), once joined."""
        return self._made

    def _run(self, entries: Iterable[Entry]) -> None:
        by_digest: dict[str, list[Entry]] = {}
        try:
            for e in entries:
                by_digest.setdefault(e.digest, []).append(e)
        except Exception as err:  # the final pass reads the tree itself, and says why
            log.debug("links not begun early: %s", err)
        while (batch := self._queue.get()) is not None:
            for digest in batch:
                for e in by_digest.pop(digest, ()):
                    try:
                        self._one(e)
                    except Exception as err:  # the final pass tries it again
                        log.debug("not linking %s early: %s", e.path, err)

    def _one(self, e: Entry) -> None:
        src = self._local_path(e)
        if src is None:
            return
        parent = os.path.dirname(e.path)
        if parent not in self._made:
            _mkdirs(self._links, parent, self._made, self._dir_mode, self._owner)
        self.done[e.path] = _link_one(self._links, e, src, self._present)


def _own(p: Path | str, dir_mode: int, owner: tuple[int, int] | None) -> None:
    if owner is not None and os.geteuid() == 0:
        os.chown(p, *owner)
    os.chmod(p, dir_mode)  # after chown, which clears setgid; not narrowed by the umask


def _mkdirs(links: Path | str, rel: str, made: set[str], dir_mode: int,
            owner: tuple[int, int] | None) -> None:
    parent = os.path.dirname(rel)
    if parent not in made:
        _mkdirs(links, parent, made, dir_mode, owner)
    p = f"{links}/{rel}"
    with contextlib.suppress(FileExistsError):
        os.mkdir(p)
        _own(p, dir_mode, owner)  # the tenant may add entries, nobody else
    made.add(rel)


def prewarm(links: Path, mountpoint: Path, stop: threading.Event | None = None) -> int:
    """Look up every linked file through the overlay once (lstat): a launcher's step
    between warm-ready and the job's start, from the job's side, never the mount
    process's (it does not touch its own mount). A new overlay mount builds its
    dentries and inodes on each name's first lookup (~4.6 us a file here, a third
    of a warm read); done here, the job's first touch runs at warm speed. Linked
    directories are sealed (opaque), so these lookups never reach the FUSE layer.
    Returns the number of files looked up; errors (a file deleted meanwhile) skip.
    ``stop`` set: no further directory is looked at."""
    n = 0
    top = str(links)
    for dirpath, _, names in os.walk(top):
        if stop is not None and stop.is_set():
            break
        rel = os.path.relpath(dirpath, top)
        base = str(mountpoint) if rel == "." else os.path.join(mountpoint, rel)
        # Listed too: a directory merged with the FUSE layer (the root, a partly local
        # one) is listed there on its first listing through a mount (the FUSE
        # layer's kept nodes and listing, the kernel's FUSE dentries), so the job's
        # first listing finds them made. A sealed one costs a kernel readdir.
        with contextlib.suppress(OSError):
            os.listdir(base)
        for name in names:
            with contextlib.suppress(OSError):
                os.lstat(os.path.join(base, name))
                n += 1
    return n


def _check_path(p: Path) -> str:
    s = str(p)
    if any(c in s for c in ",:\\\n"):
        raise OSError(errno.EINVAL, f"overlay layer path may not contain , : or \\: {s}")
    return s


_MS_NOSUID, _MS_NODEV = 2, 4  # <sys/mount.h>


def mount(mountpoint: Path, paths: OverlayPaths) -> None:
    """Mount the overlay at ``mountpoint``. Call from a thread other than the one
    serving the FUSE layer: the kernel looks up the FUSE root while mounting."""
    paths.work.mkdir(parents=True, exist_ok=True)
    # index=off: a successor's overlay shares the upper (the module's docstring)
    opts = (f"lowerdir={_check_path(paths.links)}:{_check_path(paths.fuse)},"
            f"upperdir={_check_path(paths.upper)},workdir={_check_path(paths.work)},"
            "index=off")
    # nosuid, nodev: as the FUSE layers (casfs.view.session.mount_options)
    rc = libc().mount(b"casfs-overlay", os.fsencode(mountpoint), b"overlay",
                      _MS_NOSUID | _MS_NODEV, opts.encode())
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount overlay at {mountpoint}: {os.strerror(e)}")


def unmount(mountpoint: Path) -> None:
    """Detach the overlay now (lazily: open files keep working until closed)."""
    if libc().umount2(os.fsencode(mountpoint), MNT_DETACH) != 0:
        e = ctypes.get_errno()
        if e not in (errno.EINVAL, errno.ENOENT):  # EINVAL: not mounted
            log.warning("unmount overlay %s: %s", mountpoint, os.strerror(e))
