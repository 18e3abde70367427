"""Who still uses a namespace directory: job processes (leases) and open files.

A lease is a job's process. It holds while the process lives (checked by pid
and its start time, so a reused pid does not keep a lease alive). After the
process is gone, the namespace is still in use while any process on the node
has a file open, a file mapped (a dlopen'ed ``.so`` stays mapped after its fd
is closed) or its working directory under the namespace's path. Everything is
read from /proc as path strings: nothing here touches the mount itself (the
mount process must never do that: it would wait on its own FUSE loop).

A path string is what the process's own mount namespace shows: another user,
in a user and mount namespace of her own, can put a directory of hers at the
text of another tenant's namespace path and keep it served for ever (its
tenant's namespaces bound, its torn files never removed). Where the caller says
which files are a namespace's (``owns``), a hit by text counts only if the file
itself is one: its device and inode, read without asking any FUSE server
(``statx(AT_STATX_DONT_SYNC)`` through /proc's link, the maps line's own).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterable, Iterator

from casfs.util import statx

# /proc could not be read now (this process out of file descriptors or memory): the
# answer is unknown, never "gone". Another tenant holding the shared mount process
# at its open-file limit made every lease's holder look dead, and their namespaces
# went from under running jobs.
UNKNOWN = ""
_SHORT = (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EAGAIN)


class ScanIncomplete(OSError):
    """``users`` could not look at every process: the answer is unknown."""


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat); None if gone,
    ``UNKNOWN`` if /proc cannot be read now (EMFILE, ENOMEM ...).

    A zombie is gone: it has exited, only nobody reaped it yet (a job orphaned by a
    killed ``casfs run`` under a container init that never reaps would otherwise
    hold its caches forever).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError as e:
        return UNKNOWN if e.errno in _SHORT else None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = data[data.rfind(b")") + 2:].split()
    if len(rest) <= 19 or rest[0] in (b"Z", b"X"):  # field 3: the state
        return None
    return rest[19].decode()


def alive(pid: int, started: str | None) -> bool:
    """``pid`` is the same process that took the lease (not a reused pid); True while
    that cannot be told (``UNKNOWN``): the next check asks again."""
    now = start_time(pid)
    return now is not None and (not now or not started or now == started)


def _unless_short(e: OSError) -> None:
    """Raise ScanIncomplete if ``e`` says this process is short of descriptors or
    memory (the file was not looked at), rather than that the process went away."""
    if e.errno in _SHORT:
        raise ScanIncomplete(e.errno, f"cannot scan /proc: {e.strerror}") from e


def _under(path: str, prefixes: tuple[str, ...]) -> str | None:
    for p in prefixes:
        if path == p or path.startswith(p + "/"):
            return p
    return None


Owns = Callable[[str, int, int], bool]  # (prefix, st_dev, st_ino): a file of its namespace


def users(dirs: Iterable[str], skip_pids: Iterable[int] = (),
          owns: Owns | None = None, deadline: float | None = None) -> dict[str, set[int]]:
    """For each of ``dirs``, the pids with an fd, a mapping or their cwd under it (with
    ``owns``: that really is a file of it, not only its path's text). ScanIncomplete
    if a process could not be looked at for want of descriptors or memory, or the scan
    ran past ``deadline`` (time.monotonic()): its cost grows with every descriptor
    open on the node, which any user can hold by the hundred thousand."""
    prefixes = tuple(os.path.normpath(d) for d in dirs)
    found: dict[str, set[int]] = {}
    if not prefixes:
        return found
    skip = {os.getpid(), *skip_pids}
    try:
        procs = list(os.scandir("/proc"))
    except OSError as e:
        raise ScanIncomplete(e.errno, f"cannot scan /proc: {e.strerror}") from e
    for n, entry in enumerate(procs):
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        pid = int(entry.name)
        for i, (path, ident) in enumerate(_paths_of(pid)):
            if deadline is not None and not i % 1024 and time.monotonic() > deadline:
                raise ScanIncomplete(errno.ETIMEDOUT, "the scan of who uses them ran out of"
                                     f" time ({len(procs) - n} of {len(procs)} processes left)")
            hit = _under(path, prefixes)
            if hit is not None and (owns is None or _owned(hit, ident, owns)):
                found.setdefault(hit, set()).add(pid)
                break
    return found


def _owned(prefix: str, ident: Callable[[], tuple[int, int]], owns: Owns) -> bool:
    try:
        dev, ino = ident()
    except OSError as e:  # gone meanwhile
        _unless_short(e)
        return False
    return owns(prefix, dev, ino)


def _link_ident(link: str) -> Callable[[], tuple[int, int]]:
    def get() -> tuple[int, int]:
        st = statx.ident(statx.AT_FDCWD, link, follow=True)  # the file, never its server
        return st.dev, st.ino
    return get


def _paths_of(pid: int) -> Iterator[tuple[str, Callable[[], tuple[int, int]]]]:
    """(path text, how to read that file's (dev, ino)) of ``pid``'s cwd, fds, mappings."""
    base = f"/proc/{pid}"
    try:
        cwd = os.readlink(f"{base}/cwd")
    except OSError as e:
        _unless_short(e)
    else:
        yield cwd, _link_ident(f"{base}/cwd")
    try:
        fds = os.listdir(f"{base}/fd")
    except OSError as e:
        _unless_short(e)
        fds = []
    for fd in fds:
        try:
            target = os.readlink(f"{base}/fd/{fd}")
        except OSError:
            continue  # (a readlink takes no descriptor: closed meanwhile)
        yield target.removesuffix(" (deleted)"), _link_ident(f"{base}/fd/{fd}")
    try:
        with open(f"{base}/maps", "rb") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith(b"/"):
                    yield (os.fsdecode(parts[5].rstrip(b"\n")).removesuffix(" (deleted)"),
                           _map_ident(parts[3], parts[4]))
    except OSError as e:
        _unless_short(e)


def _map_ident(dev: bytes, ino: bytes) -> Callable[[], tuple[int, int]]:
    def get() -> tuple[int, int]:  # maps: "MM:mm" in hex, then the inode
        try:
            major, minor = dev.split(b":")
            return os.makedev(int(major, 16), int(minor, 16)), int(ino)
        except ValueError:
            raise OSError("unreadable maps line") from None
    return get
