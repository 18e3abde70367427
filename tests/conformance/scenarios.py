"""POSIX operation sequences, one per syscall family pjdfstest covers.

Each scenario works in its own directory ``base`` (which holds the files of
``INITIAL``: published, lower entries in a view) and returns a transcript:
per operation its result or errno name, and normalised stat fields. The same
scenario runs on a plain directory and through each view mode; the
transcripts must be equal, errno for errno. ``user`` runs part of a sequence
as the second uid (a forked child that drops to that uid).

Written for this project from the POSIX/Linux man pages; the public suite
(pjdfstest) is only run by hand (docs/reliability.md).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Transcript = list[Any]

# Files every scenario directory starts with (lower entries in a view).
INITIAL: dict[str, bytes] = {
    "lf": b"lower file\n",
    "lf2": b"another lower file\n",
    "ld/inner": b"inside a lower dir\n",
    "ld/sub/deep": b"deep\n",
    "empty_after/only": b"x",
    "N" * 255: b"a lower file with a NAME_MAX name\n",
}

# Kernel overlayfs (the ``overlay`` view mode) deviates from a plain directory in
# ways its documentation lists (Documentation/filesystems/overlayfs.rst,
# "Non-standard behavior"); with its default options:
# - merged directories report st_nlink 1;
# - rename(2) of a lower or merged directory fails with EXDEV (redirect_dir off;
#   mv(1) falls back to copying);
# - a hard link to a lower file does not share the name's st_ino (index off), and
#   renaming one of its names onto the other fails with ESTALE instead of doing nothing.
# Scenarios run for the overlay mode leave these out (on both sides);
# test_overlay_documented_deviations checks that they are exactly these.
OVERLAY = "overlay"
_dir_nlink = True


def set_mode(mode: str) -> None:
    global _dir_nlink
    _dir_nlink = mode != OVERLAY


N255 = "n" * 255
N256 = "n" * 256


@dataclass
class Ctx:
    base: str
    uid: int
    gid: int
    mode: str = "fuse"

    def p(self, rel: str) -> str:
        return os.path.join(self.base, rel)

    def user(self, fn: Callable[[], Transcript]) -> Transcript:
        """Run ``fn`` as the second uid in a forked child; its transcript comes back."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            code = 0
            try:
                os.close(r)
                os.setgroups([])
                os.setgid(self.gid)
                os.setuid(self.uid)
                os.umask(0o022)
                data = json.dumps(fn()).encode()
                with os.fdopen(w, "wb") as f:
                    f.write(data)
            except BaseException as e:  # report anything to the parent
                with os.fdopen(w, "wb") as f:
                    f.write(json.dumps([["child-crash", repr(e)]]).encode())
                code = 1
            os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            data = f.read()
        os.waitpid(pid, 0)
        return [tuple(x) if isinstance(x, list) else x for x in json.loads(data)]


def rec(out: Transcript, label: str, fn: Callable[[], Any]) -> Any:
    try:
        r = fn()
    except OSError as e:
        out.append((label, "err", errno.errorcode.get(e.errno or 0, str(e.errno))))
        return None
    out.append((label, "ok", r if isinstance(r, str | int | bool | list | tuple) else None))
    return r


def st(path: str) -> list[Any]:
    """Normalised lstat: type, mode, nlink, uid, gid, size."""
    s = os.lstat(path)
    nlink = s.st_nlink if _dir_nlink or not stat.S_ISDIR(s.st_mode) else None
    return [stat.S_IFMT(s.st_mode), oct(stat.S_IMODE(s.st_mode)), nlink, s.st_uid,
            s.st_gid, s.st_size if not stat.S_ISDIR(s.st_mode) else -1]


def same_ino(a: str, b: str) -> bool:
    return os.lstat(a).st_ino == os.lstat(b).st_ino


def ls(path: str) -> list[str]:
    return sorted(os.listdir(path))


def touch(path: str, mode: int = 0o644) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    os.close(fd)
    return 0


def openclose(path: str, flags: int, mode: int = 0o644) -> int:
    fd = os.open(path, flags, mode)
    size = os.fstat(fd).st_size
    os.close(fd)
    return size


def append(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")


# --- families ------------------------------------------------------------------
def s_open(c: Ctx) -> Transcript:
    out: Transcript = []
    excl = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    rec(out, "excl-new", lambda: openclose(c.p("new"), excl))
    rec(out, "excl-existing", lambda: openclose(c.p("new"), excl))
    rec(out, "excl-lower", lambda: openclose(c.p("lf"), excl))
    rec(out, "creat-lower", lambda: openclose(c.p("lf"), os.O_RDONLY | os.O_CREAT))
    rec(out, "trunc-lower", lambda: openclose(c.p("lf2"), os.O_WRONLY | os.O_TRUNC))
    rec(out, "dir-wronly", lambda: openclose(c.p("ld"), os.O_WRONLY))
    rec(out, "odirectory-file", lambda: openclose(c.p("lf"), os.O_RDONLY | os.O_DIRECTORY))
    rec(out, "enoent", lambda: openclose(c.p("nope/x"), os.O_RDONLY))
    rec(out, "enotdir", lambda: openclose(c.p("lf/x"), os.O_RDONLY))
    os.symlink("lf", c.p("sl"))
    rec(out, "nofollow", lambda: openclose(c.p("sl"), os.O_RDONLY | os.O_NOFOLLOW))
    rec(out, "follow", lambda: openclose(c.p("sl"), os.O_RDONLY))
    rec(out, "name255", lambda: openclose(c.p(N255), excl))
    rec(out, "name256", lambda: openclose(c.p(N256), excl))
    rec(out, "lower255", lambda: read(c.p("N" * 255)))
    rec(out, "mode0", lambda: openclose(c.p("m0"), excl, 0))
    rec(out, "mode0-st", lambda: st(c.p("m0")))
    os.mkdir(c.p("closed"), 0o755)

    def as_user() -> Transcript:
        u: Transcript = []
        rec(u, "u-read-lower", lambda: read(c.p("lf")))
        rec(u, "u-write-lower", lambda: openclose(c.p("lf"), os.O_WRONLY))
        rec(u, "u-create-closed", lambda: openclose(c.p("closed/x"), excl))
        rec(u, "u-create-open", lambda: openclose(c.p("mine"), excl, 0o600))
        rec(u, "u-st", lambda: st(c.p("mine"))[:3])
        rec(u, "u-read-m0", lambda: read(c.p("m0")))
        return u

    out += c.user(as_user)
    return out


def s_mkdir(c: Ctx) -> Transcript:
    out: Transcript = []
    rec(out, "new", lambda: os.mkdir(c.p("d"), 0o750))
    rec(out, "st", lambda: st(c.p("d")))
    rec(out, "eexist-lowerfile", lambda: os.mkdir(c.p("lf")))
    rec(out, "eexist-lowerdir", lambda: os.mkdir(c.p("ld")))
    rec(out, "enoent", lambda: os.mkdir(c.p("no/d")))
    rec(out, "enotdir", lambda: os.mkdir(c.p("lf/d")))
    rec(out, "name255", lambda: os.mkdir(c.p(N255)))
    rec(out, "name256", lambda: os.mkdir(c.p(N256)))
    rec(out, "setgid-parent", lambda: (os.chmod(c.p("d"), 0o2775), os.mkdir(c.p("d/s")),
                                       st(c.p("d/s")))[2])
    # A removed lower dir re-created is empty.
    for name in ls(c.p("empty_after")):
        os.unlink(c.p(f"empty_after/{name}"))
    rec(out, "rm-lowerdir", lambda: os.rmdir(c.p("empty_after")))
    rec(out, "re-mkdir", lambda: os.mkdir(c.p("empty_after")))
    rec(out, "re-ls", lambda: ls(c.p("empty_after")))
    # Directory link counts follow changes at once (lower subdirs included).
    rec(out, "nlink", lambda: [st(c.p("ld"))[2], (os.mkdir(c.p("ld/x")), st(c.p("ld"))[2])[1],
                               (os.unlink(c.p("ld/sub/deep")), os.rmdir(c.p("ld/sub")),
                                st(c.p("ld"))[2])[2],
                               (os.rename(c.p("ld/x"), c.p("x")), st(c.p("ld"))[2],
                                st(c.base)[2])[1:]])
    os.mkdir(c.p("closed"), 0o755)

    def as_user() -> Transcript:
        u: Transcript = []
        rec(u, "u-mkdir-closed", lambda: os.mkdir(c.p("closed/x")))
        rec(u, "u-mkdir-open", lambda: os.mkdir(c.p("ld/mine"), 0o777))
        rec(u, "u-st", lambda: st(c.p("ld/mine"))[:3])
        return u

    out += c.user(as_user)
    return out


def s_rmdir(c: Ctx) -> Transcript:
    out: Transcript = []
    rec(out, "enotempty-lower", lambda: os.rmdir(c.p("ld")))
    rec(out, "enotdir", lambda: os.rmdir(c.p("lf")))
    rec(out, "enoent", lambda: os.rmdir(c.p("nope")))
    rec(out, "dot", lambda: os.rmdir(c.p("ld/sub/.")))
    os.unlink(c.p("ld/sub/deep"))
    rec(out, "emptied-lower", lambda: os.rmdir(c.p("ld/sub")))
    rec(out, "gone", lambda: os.path.lexists(c.p("ld/sub")))
    os.mkdir(c.p(N255))
    rec(out, "name255", lambda: os.rmdir(c.p(N255)))
    os.chmod(c.p("ld"), 0o1777)
    os.mkdir(c.p("ld/rootdir"))

    def as_user() -> Transcript:
        u: Transcript = []
        rec(u, "u-sticky-other", lambda: os.rmdir(c.p("ld/rootdir")))
        os.mkdir(c.p("ld/mine"))
        rec(u, "u-sticky-own", lambda: os.rmdir(c.p("ld/mine")))
        return u

    out += c.user(as_user)
    return out


def s_unlink(c: Ctx) -> Transcript:
    out: Transcript = []
    rec(out, "lower", lambda: os.unlink(c.p("lf")))
    rec(out, "again", lambda: os.unlink(c.p("lf")))
    rec(out, "ls", lambda: ls(c.base))
    rec(out, "recreate", lambda: touch(c.p("lf")))
    rec(out, "recreated-size", lambda: st(c.p("lf")))
    rec(out, "eisdir", lambda: os.unlink(c.p("ld")))
    rec(out, "lower255", lambda: os.unlink(c.p("N" * 255)))
    rec(out, "recreate255", lambda: touch(c.p("N" * 255)))
    rec(out, "enotdir", lambda: os.unlink(c.p("lf2/x")))
    os.chmod(c.p("ld"), 0o1777)

    def as_user() -> Transcript:
        u: Transcript = []
        rec(u, "u-sticky-other", lambda: os.unlink(c.p("ld/inner")))
        touch(c.p("ld/mine"))
        rec(u, "u-sticky-own", lambda: os.unlink(c.p("ld/mine")))
        return u

    out += c.user(as_user)
    rec(out, "ls-ld", lambda: ls(c.p("ld")))
    return out


def s_rename(c: Ctx) -> Transcript:
    out: Transcript = []
    rec(out, "file-over-lower", lambda: os.rename(c.p("lf"), c.p("lf2")))
    rec(out, "content", lambda: read(c.p("lf2")))
    rec(out, "ls", lambda: ls(c.base))
    rec(out, "dir-to-file", lambda: os.rename(c.p("ld"), c.p("lf2")))
    rec(out, "file-to-dir", lambda: os.rename(c.p("lf2"), c.p("ld")))
    rec(out, "into-self", lambda: os.rename(c.p("ld"), c.p("ld/sub/x")))
    rec(out, "nonempty", lambda: (os.mkdir(c.p("e")), os.rename(c.p("e"), c.p("ld")))[1])
    os.unlink(c.p("empty_after/only"))
    if c.mode != OVERLAY:
        rec(out, "dir-onto-emptied-lower", lambda: os.rename(c.p("ld/sub"), c.p("empty_after")))
        rec(out, "moved-ls", lambda: ls(c.p("empty_after")))
        rec(out, "old-gone", lambda: os.path.lexists(c.p("ld/sub")))
    rec(out, "name255", lambda: os.rename(c.p("N" * 255), c.p(N255)))
    rec(out, "name256", lambda: os.rename(c.p(N255), c.p(N256)))
    rec(out, "enoent", lambda: os.rename(c.p("nope"), c.p("x")))
    os.link(c.p(N255), c.p("hl"))
    if c.mode != OVERLAY:
        rec(out, "same-inode-noop", lambda: os.rename(c.p("hl"), c.p(N255)))
    rec(out, "both-there", lambda: [os.path.lexists(c.p("hl")), st(c.p(N255))[2]])
    os.chmod(c.p("ld"), 0o1777)
    touch(c.p("ld/rootfile"))

    def as_user() -> Transcript:
        u: Transcript = []
        rec(u, "u-sticky-move-other", lambda: os.rename(c.p("ld/rootfile"), c.p("ld/x")))
        rec(u, "u-sticky-move-lower", lambda: os.rename(c.p("ld/inner"), c.p("ld/y")))
        touch(c.p("ld/mine"))
        rec(u, "u-sticky-over-other", lambda: os.rename(c.p("ld/mine"), c.p("ld/rootfile")))
        rec(u, "u-sticky-own", lambda: os.rename(c.p("ld/mine"), c.p("ld/mine2")))
        rec(u, "u-closed-dir", lambda: os.rename(c.p("ld/mine2"), c.p("mine3")))
        return u

    out += c.user(as_user)
    rec(out, "ls-ld", lambda: ls(c.p("ld")))
    return out


def s_link(c: Ctx) -> Transcript:
    out: Transcript = []
    touch(c.p("u"))
    rec(out, "upper", lambda: os.link(c.p("u"), c.p("u2")))
    rec(out, "same-ino", lambda: same_ino(c.p("u"), c.p("u2")))
    rec(out, "nlink", lambda: [st(c.p("u"))[2], st(c.p("u2"))[2]])
    rec(out, "lower", lambda: os.link(c.p("lf"), c.p("ld/lf-link")))
    if c.mode != OVERLAY:
        rec(out, "lower-same-ino", lambda: same_ino(c.p("lf"), c.p("ld/lf-link")))
    rec(out, "lower-nlink", lambda: st(c.p("lf"))[2])
    rec(out, "lower-content", lambda: read(c.p("ld/lf-link")))
    rec(out, "chmod-via-other", lambda: (os.chmod(c.p("lf"), 0o600), st(c.p("ld/lf-link")))[1])
    rec(out, "write-via-other", lambda: (append(c.p("ld/lf-link"), "more"),
                                         read(c.p("lf")))[1])
    rec(out, "unlink-one", lambda: (os.unlink(c.p("lf")), st(c.p("ld/lf-link"))[2])[1])
    rec(out, "eexist", lambda: os.link(c.p("u"), c.p("lf2")))
    rec(out, "dir", lambda: os.link(c.p("ld"), c.p("ldl")))
    rec(out, "enoent", lambda: os.link(c.p("nope"), c.p("x")))
    rec(out, "name255", lambda: os.link(c.p("u"), c.p(N255)))
    rec(out, "name256", lambda: os.link(c.p("u"), c.p(N256)))
    rec(out, "nlink3", lambda: st(c.p("u2"))[2])
    os.symlink("u", c.p("sym"))
    rec(out, "link-symlink", lambda: os.link(c.p("sym"), c.p("sym2"), follow_symlinks=False))
    rec(out, "symlink-st", lambda: st(c.p("sym2"))[:3])
    rec(out, "rename-linked", lambda: (os.rename(c.p("u2"), c.p("ld/u3")),
                                       same_ino(c.p("u"), c.p("ld/u3")))[1])

    def as_user() -> Transcript:
        u: Transcript = []
        rec(u, "u-link-into-lowerdir", lambda: os.link(c.p("lf2"), c.p("ld/mylink")))
        return u

    out += c.user(as_user)
    return out


def s_symlink(c: Ctx) -> Transcript:
    out: Transcript = []
    rec(out, "new", lambda: os.symlink("lf", c.p("s")))
    rec(out, "readlink", lambda: os.readlink(c.p("s")))
    rec(out, "st", lambda: st(c.p("s"))[:2])
    rec(out, "eexist-lower", lambda: os.symlink("x", c.p("lf")))
    rec(out, "dangling", lambda: os.symlink("nowhere", c.p("d")))
    rec(out, "dangling-open", lambda: read(c.p("d")))
    rec(out, "name255", lambda: os.symlink("lf", c.p(N255)))
    rec(out, "name256", lambda: os.symlink("lf", c.p(N256)))
    rec(out, "target-long", lambda: os.symlink("t" * 1000, c.p("long")))
    rec(out, "readlink-long", lambda: len(os.readlink(c.p("long"))))
    rec(out, "over-removed-lower", lambda: (os.unlink(c.p("lf2")), os.symlink("lf", c.p("lf2")),
                                            os.readlink(c.p("lf2")))[2])

    def as_user() -> Transcript:
        u: Transcript = []
        rec(u, "u-symlink", lambda: os.symlink("lf", c.p("ld/us")))
        rec(u, "u-st", lambda: st(c.p("ld/us"))[:4])
        return u

    out += c.user(as_user)
    return out


def s_chmod(c: Ctx) -> Transcript:
    out: Transcript = []
    rec(out, "lower", lambda: (os.chmod(c.p("lf"), 0o640), st(c.p("lf")))[1])
    rec(out, "lower-content", lambda: read(c.p("lf")))
    rec(out, "lowerdir", lambda: (os.chmod(c.p("ld"), 0o711), st(c.p("ld")))[1])
    rec(out, "suid", lambda: (os.chmod(c.p("lf2"), 0o4755), st(c.p("lf2")))[1])
    rec(out, "sticky-file", lambda: (os.chmod(c.p("lf2"), 0o1644), st(c.p("lf2")))[1])
    rec(out, "enoent", lambda: os.chmod(c.p("nope"), 0o644))
    os.chmod(c.p("ld"), 0o777)
    touch(c.p("ld/rootf"))

    def as_user() -> Transcript:
        u: Transcript = []
        rec(u, "u-other", lambda: os.chmod(c.p("ld/rootf"), 0o777))
        touch(c.p("ld/mine"))
        rec(u, "u-own", lambda: (os.chmod(c.p("ld/mine"), 0o600), st(c.p("ld/mine")))[1])
        # setgid on a file whose group the caller is not in is silently dropped.
        rec(u, "u-own-sgid", lambda: (os.chmod(c.p("ld/mine"), 0o2755), st(c.p("ld/mine")))[1])
        return u

    out += c.user(as_user)
    rec(out, "root-on-user-file", lambda: (os.chmod(c.p("ld/mine"), 0o4700),
                                           st(c.p("ld/mine")))[1])
    return out


def s_chown(c: Ctx) -> Transcript:
    out: Transcript = []
    rec(out, "lower", lambda: (os.chown(c.p("lf"), 1234, 5678), st(c.p("lf")))[1])
    rec(out, "lower-content", lambda: read(c.p("lf")))
    rec(out, "minus1", lambda: (os.chown(c.p("lf"), -1, 42), st(c.p("lf")))[1])
    rec(out, "dir", lambda: (os.chown(c.p("ld"), c.uid, c.gid), st(c.p("ld")))[1])
    os.symlink("lf2", c.p("s"))
    rec(out, "lchown", lambda: (os.chown(c.p("s"), 77, 77, follow_symlinks=False),
                                st(c.p("s"))[1:5], st(c.p("lf2"))[1:5]))
    rec(out, "suid-cleared", lambda: (os.chmod(c.p("lf2"), 0o6755), os.chown(c.p("lf2"), 5, 5),
                                      st(c.p("lf2")))[2])
    rec(out, "enoent", lambda: os.chown(c.p("nope"), 1, 1))
    touch(c.p("ld/rootf"))

    def as_user() -> Transcript:
        u: Transcript = []
        rec(u, "u-other", lambda: os.chown(c.p("ld/rootf"), c.uid, c.gid))
        touch(c.p("ld/mine"))
        rec(u, "u-give-away", lambda: os.chown(c.p("ld/mine"), 0, -1))
        rec(u, "u-noop", lambda: (os.chown(c.p("ld/mine"), c.uid, c.gid), st(c.p("ld/mine")))[1])
        rec(u, "u-foreign-group", lambda: os.chown(c.p("ld/mine"), -1, 0))
        return u

    out += c.user(as_user)
    return out


def s_truncate(c: Ctx) -> Transcript:
    out: Transcript = []
    rec(out, "lower-shrink", lambda: (os.truncate(c.p("lf"), 3), read(c.p("lf")))[1])
    rec(out, "lower-grow", lambda: (os.truncate(c.p("lf2"), 100), st(c.p("lf2")))[1])
    rec(out, "lower-zero", lambda: (os.truncate(c.p("ld/inner"), 0), st(c.p("ld/inner")))[1])
    rec(out, "dir", lambda: os.truncate(c.p("ld"), 0))
    rec(out, "enoent", lambda: os.truncate(c.p("nope"), 0))
    rec(out, "negative", lambda: os.truncate(c.p("lf"), -1))

    def ftrunc(flags: int, size: int) -> Any:
        fd = os.open(c.p("ld/sub/deep"), flags)
        try:
            os.ftruncate(fd, size)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    rec(out, "ftruncate-rdonly", lambda: ftrunc(os.O_RDONLY, 1))
    rec(out, "ftruncate-lower", lambda: ftrunc(os.O_RDWR, 2))
    rec(out, "ftruncate-content", lambda: read(c.p("ld/sub/deep")))

    def as_user() -> Transcript:
        u: Transcript = []
        rec(u, "u-truncate-other", lambda: os.truncate(c.p("lf2"), 0))
        return u

    out += c.user(as_user)
    return out


def s_utimensat(c: Ctx) -> Transcript:
    out: Transcript = []
    t1, t2 = 1_000_000_000_123_456_789, 1_200_000_000_987_654_321

    def times(path: str) -> list[int]:
        s = os.lstat(path)
        return [s.st_atime_ns, s.st_mtime_ns]

    rec(out, "lower", lambda: (os.utime(c.p("lf"), ns=(t1, t2)), times(c.p("lf")))[1])
    rec(out, "lower-content", lambda: read(c.p("lf")))
    rec(out, "lowerdir", lambda: (os.utime(c.p("ld"), ns=(t2, t1)), times(c.p("ld")))[1])
    os.symlink("lf2", c.p("s"))
    rec(out, "nofollow", lambda: (os.utime(c.p("s"), ns=(t1, t1), follow_symlinks=False),
                                  times(c.p("s")), times(c.p("lf2")) == [t1, t1]))
    rec(out, "enoent", lambda: os.utime(c.p("nope"), ns=(t1, t1)))
    os.chmod(c.p("ld"), 0o777)
    touch(c.p("ld/open"), 0o666)
    os.utime(c.p("ld/open"), ns=(t1, t1))
    touch(c.p("ld/closed"), 0o644)

    def as_user() -> Transcript:
        u: Transcript = []
        rec(u, "u-now-writable", lambda: (os.utime(c.p("ld/open")),
                                          times(c.p("ld/open"))[1] != t1))
        rec(u, "u-explicit-other", lambda: os.utime(c.p("ld/open"), ns=(t1, t2)))
        rec(u, "u-now-readonly", lambda: os.utime(c.p("ld/closed")))
        touch(c.p("ld/mine"))
        rec(u, "u-explicit-own", lambda: (os.utime(c.p("ld/mine"), ns=(t2, t2)),
                                          times(c.p("ld/mine")))[1])
        return u

    out += c.user(as_user)
    return out


def s_mkfifo(c: Ctx) -> Transcript:
    out: Transcript = []
    rec(out, "new", lambda: os.mkfifo(c.p("f"), 0o640))
    rec(out, "st", lambda: st(c.p("f")))
    rec(out, "eexist-lower", lambda: os.mkfifo(c.p("lf")))
    rec(out, "name255", lambda: os.mkfifo(c.p(N255)))
    rec(out, "rename", lambda: os.rename(c.p("f"), c.p("ld/f")))
    rec(out, "unlink", lambda: os.unlink(c.p("ld/f")))
    rec(out, "over-removed-lower", lambda: (os.unlink(c.p("lf2")), os.mkfifo(c.p("lf2")),
                                            st(c.p("lf2"))[0]))

    def as_user() -> Transcript:
        u: Transcript = []
        rec(u, "u-mkfifo", lambda: (os.mkfifo(c.p("ld/uf"), 0o600), st(c.p("ld/uf"))[:4])[1])
        return u

    out += c.user(as_user)
    return out


def s_mknod(c: Ctx) -> Transcript:
    out: Transcript = []
    rec(out, "reg", lambda: (os.mknod(c.p("r"), stat.S_IFREG | 0o600), st(c.p("r")))[1])
    rec(out, "fifo", lambda: (os.mknod(c.p("p"), stat.S_IFIFO | 0o600), st(c.p("p")))[1])
    rec(out, "chr", lambda: (os.mknod(c.p("c"), stat.S_IFCHR | 0o600, os.makedev(1, 2)),
                             st(c.p("c")), os.lstat(c.p("c")).st_rdev == os.makedev(1, 2))[1:])
    rec(out, "blk", lambda: (os.mknod(c.p("b"), stat.S_IFBLK | 0o600, os.makedev(3, 4)),
                             st(c.p("b")))[1])
    rec(out, "eexist-lower", lambda: os.mknod(c.p("lf"), stat.S_IFREG | 0o600))
    rec(out, "name255", lambda: os.mknod(c.p(N255), stat.S_IFIFO | 0o600))

    def as_user() -> Transcript:
        u: Transcript = []
        rec(u, "u-chr", lambda: os.mknod(c.p("ld/c"), stat.S_IFCHR | 0o600, os.makedev(1, 2)))
        rec(u, "u-fifo", lambda: os.mknod(c.p("ld/p"), stat.S_IFIFO | 0o600))
        return u

    out += c.user(as_user)
    return out


def s_bind(c: Ctx) -> Transcript:
    out: Transcript = []

    def bind(path: str) -> list[Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(path)
            return st(path)[:2]

    rec(out, "new", lambda: bind(c.p("sock")))
    rec(out, "eaddrinuse", lambda: bind(c.p("sock")))
    rec(out, "over-lower", lambda: bind(c.p("lf")))
    rec(out, "rename", lambda: os.rename(c.p("sock"), c.p("ld/sock")))
    rec(out, "unlink", lambda: os.unlink(c.p("ld/sock")))

    def connect_pair() -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
            srv.bind(c.p("live"))
            srv.listen(1)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as cli:
                cli.connect(c.p("live"))
                conn, _ = srv.accept()
                with conn:
                    cli.sendall(b"ping")
                    return conn.recv(4).decode()

    rec(out, "connect", connect_pair)
    return out


def s_pathmax(c: Ctx) -> Transcript:
    """Paths close to PATH_MAX (4096), relative to the directory: the view's own
    upper path must not count against them."""
    out: Transcript = []
    cwd = os.getcwd()
    os.chdir(c.base)
    try:
        chain = "/".join(["d" * 255] * 15)  # 3,839 bytes
        parts = chain.split("/")
        for i in range(1, len(parts) + 1):
            os.mkdir("/".join(parts[:i]))
        leaf = chain + "/" + "e" * 200  # 4,040 bytes
        rec(out, "mkdir", lambda: os.mkdir(leaf))
        f = leaf + "/" + "f" * 40  # 4,081 bytes
        rec(out, "create", lambda: touch(f))
        rec(out, "stat", lambda: st(f)[:3])
        rec(out, "chmod", lambda: (os.chmod(f, 0o600), st(f))[1])
        rec(out, "truncate", lambda: (os.truncate(f, 7), st(f))[1])
        rec(out, "utime", lambda: (os.utime(f, ns=(1, 2)), os.lstat(f).st_mtime_ns)[1])
        rec(out, "link", lambda: os.link(f, leaf + "/" + "g" * 40))
        rec(out, "symlink", lambda: os.symlink("x", leaf + "/" + "s" * 40))
        rec(out, "readlink", lambda: os.readlink(leaf + "/" + "s" * 40))
        rec(out, "rename", lambda: os.rename(f, leaf + "/" + "h" * 40))
        rec(out, "too-long", lambda: touch(leaf + "/" + "i" * 60))
        rec(out, "ls", lambda: ls(leaf))
        for name in ls(leaf):
            os.unlink(leaf + "/" + name)
        rec(out, "rmdir", lambda: os.rmdir(leaf))
    finally:
        os.chdir(cwd)
    return out


FAMILIES: dict[str, Callable[[Ctx], Transcript]] = {
    "pathmax": s_pathmax,
    "open": s_open, "mkdir": s_mkdir, "rmdir": s_rmdir, "unlink": s_unlink,
    "rename": s_rename, "link": s_link, "symlink": s_symlink, "chmod": s_chmod,
    "chown": s_chown, "truncate": s_truncate, "utimensat": s_utimensat,
    "mkfifo": s_mkfifo, "mknod": s_mknod, "bind": s_bind,
}  # fmt: skip


def listing(root: str) -> list[Any]:
    """Every entry below ``root``: path, normalised stat, and bytes of regular files."""
    rows: list[Any] = []
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            p = os.path.join(dirpath, name)
            row = [os.path.relpath(p, root), *st(p)]
            if stat.S_ISREG(os.lstat(p).st_mode):
                with open(p, "rb") as f:
                    row.append(f.read().decode(errors="replace"))
            elif stat.S_ISLNK(os.lstat(p).st_mode):
                row.append(os.readlink(p))
            rows.append(row)
    return rows
