"""casfs.view.dirmode.restore: a directory at a time, each file whole before it has a name.

The restore lists each directory once, opens its sources as root, then writes
as the tenant: an unnamed file (O_TMPFILE) filled, given its mode and mtime,
then linked into place, so no temp name is ever left and a file the job made
meanwhile wins. Real files on this machine's file systems; the tenant is a real
user (tests.users).
"""

from __future__ import annotations

import errno
import logging
import os
import random
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import blake3
import pytest

from bench.common import loop_fs
from casfs.errors import CasfsError
from casfs.index.objcache import install_file, object_path
from casfs.store.entry import Entry
from casfs.util import beneath
from casfs.util.counters import Counters
from casfs.view import dirmode
from tests.users import open_tmp, real_users

MTIME = 1_700_000_000_123_456_789


class Fetcher:
    """The local object cache's fetch/unpin, counting both; ``on_fetch`` runs first."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self.fetched: list[str] = []
        self.pins = 0
        self.on_fetch = lambda e: None
        self.missing: set[str] = set()

    def fetch(self, e: Entry) -> str:
        self.on_fetch(e)
        if e.digest in self.missing:
            raise CasfsError(f"object {e.digest}: not found")
        self.fetched.append(e.path)
        self.pins += 1
        return object_path(str(self.cache), e.digest)

    def unpin(self, digest: str) -> None:
        self.pins -= 1


def tree(cache: Path, layout: dict[str, int]) -> tuple[list[Entry], dict[str, bytes]]:
    """Entries (in walk order) for ``layout`` (directory -> files), objects installed."""
    rnd = random.Random(7)
    entries: list[Entry] = []
    data: dict[str, bytes] = {}
    cache.mkdir(exist_ok=True)
    for d, n in layout.items():
        for i in range(n):
            rel = f"{d}/f{i:03d}" if d else f"top{i}"
            body = rnd.randbytes(rnd.randint(1, 70_000))
            digest = blake3.blake3(body).hexdigest()
            install_file(str(cache), digest, body)
            entries.append(Entry(rel, digest, len(body), 0o640 if i % 2 else 0o755,
                                 MTIME + i))
            data[rel] = body
    return entries, data


def check(top: Path, entries: list[Entry], data: dict[str, bytes], uid: int = 0) -> None:
    for e in entries:
        st = os.lstat(top / e.path)
        assert (top / e.path).read_bytes() == data[e.path], e.path
        assert (st.st_mode & 0o777, st.st_mtime_ns, st.st_uid) == (e.mode, e.mtime_ns, uid)
    leftovers = [p for p in top.rglob("*") if p.name.startswith(".tmp-")]
    assert leftovers == []


@pytest.fixture(params=["unnamed", "named"])
def how(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a file is made: O_TMPFILE, and a named temp file where a file system
    has no unnamed files."""
    if request.param == "named":
        monkeypatch.setattr(beneath, "create_unnamed", lambda dirfd, mode=0o600: None)
    return str(request.param)


def test_a_tree_is_restored_whole_with_modes_and_mtimes(how: str, tmp_path: Path) -> None:
    # More files in one directory than a batch: listed once, written in batches.
    layout = {"": 3, "k1": 8, "k2/sub": dirmode.RESTORE_BATCH * 2 + 5, "k3": 1}
    entries, data = tree(tmp_path / "cache", layout)
    top = tmp_path / "top"
    top.mkdir()
    stamps = dirmode.RestoreStamps(None)
    counters = Counters()
    f = Fetcher(tmp_path / "cache")
    written = dirmode.restore(top, entries, f, counters, stamps)
    assert written == entries
    check(top, entries, data)
    assert f.pins == 0 and counters.get("restored_files") == len(entries)
    for e in entries:  # stamped as written: promotion never re-hashes them
        assert stamps.unchanged(e.path, os.lstat(top / e.path))


def test_present_files_are_left_alone_and_never_fetched(how: str, tmp_path: Path) -> None:
    entries, data = tree(tmp_path / "cache", {"k1": 5, "k2": 70})
    top = tmp_path / "top"
    (top / "k1").mkdir(parents=True)
    (top / "k1/f001").write_bytes(b"the job's own")
    (top / "k2").mkdir()
    os.symlink("/etc/passwd", top / "k2/f069")  # a name taken by anything stays taken
    f = Fetcher(tmp_path / "cache")
    written = dirmode.restore(top, entries, f, Counters())
    assert {e.path for e in entries} - {e.path for e in written} == {"k1/f001", "k2/f069"}
    assert "k1/f001" not in f.fetched and "k2/f069" not in f.fetched
    assert (top / "k1/f001").read_bytes() == b"the job's own"
    assert os.readlink(top / "k2/f069") == "/etc/passwd"
    check(top, written, data)


def test_a_file_the_job_makes_meanwhile_wins(how: str, tmp_path: Path) -> None:
    entries, data = tree(tmp_path / "cache", {"k": 4})
    top = tmp_path / "top"
    top.mkdir()
    f = Fetcher(tmp_path / "cache")

    def job_writes(e: Entry) -> None:  # after the listing, before the link
        if e.path == "k/f002":
            (top / "k").mkdir(exist_ok=True)
            (top / "k/f002").write_bytes(b"compiled here")

    f.on_fetch = job_writes
    written = dirmode.restore(top, entries, f, Counters())
    assert [e.path for e in written] == ["k/f000", "k/f001", "k/f003"]
    assert (top / "k/f002").read_bytes() == b"compiled here"
    check(top, written, data)
    assert f.pins == 0


@pytest.mark.expect_log(r"not restoring k/f00[14]: object .*: not found")
def test_a_failed_fetch_is_a_miss_and_the_rest_are_restored(tmp_path: Path) -> None:
    entries, data = tree(tmp_path / "cache", {"k": 6})
    top = tmp_path / "top"
    top.mkdir()
    f = Fetcher(tmp_path / "cache")
    f.missing = {entries[1].digest, entries[4].digest}
    counters = Counters()
    written = dirmode.restore(top, entries, f, counters)
    assert [e.path for e in written] == ["k/f000", "k/f002", "k/f003", "k/f005"]
    assert not (top / "k/f001").exists() and not (top / "k/f004").exists()
    assert counters.get("fetch_errors") == 2
    check(top, written, data)


def test_generated_bytes_are_written_as_given(how: str, tmp_path: Path) -> None:
    entries, _ = tree(tmp_path / "cache", {"k": 3})
    top = tmp_path / "top"
    top.mkdir()
    made = {e.path: f"generated {e.path}".encode() for e in entries[:2]}
    written = dirmode.restore(top, entries, Fetcher(tmp_path / "cache"), Counters(),
                              present=lambda e, src: made.get(e.path))
    assert written == entries
    for e in entries[:2]:
        assert (top / e.path).read_bytes() == made[e.path]


@pytest.mark.expect_log(r"not restoring k2/f00[01]: \[Errno 13\] Permission denied")
def test_a_tenants_files_are_hers_and_her_permissions_apply(how: str) -> None:
    with open_tmp() as d, real_users(1, d) as users:
        user = users[0]
        entries, data = tree(d / "cache", {"k1": 3, "k2": 2})
        os.chmod(d / "cache", 0o700)  # root's, as the node's object cache
        top = d / "top"
        top.mkdir()
        os.chown(top, user.uid, user.uid)
        (top / "k2").mkdir(mode=0o555)  # hers? no: root's, and not writable to her
        counters = Counters()
        written = dirmode.restore(top, entries, Fetcher(d / "cache"), counters,
                                  owner=(user.uid, user.uid))
        assert [e.path for e in written] == ["k1/f000", "k1/f001", "k1/f002"]
        check(top, written, data, uid=user.uid)
        assert (top / "k1").stat().st_uid == user.uid
        assert os.listdir(top / "k2") == []
        assert counters.get("restore_errors") == 2


@pytest.mark.expect_log(r"not restoring k/f00[012]: a symlink or a file in its path")
def test_a_directory_that_is_a_symlink_is_refused_once_for_the_batch(
        how: str, tmp_path: Path) -> None:
    entries, data = tree(tmp_path / "cache", {"k": 3, "m": 2})
    top = tmp_path / "top"
    top.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, top / "k")
    counters = Counters()
    refused: set[str] = set()
    written = dirmode.restore(top, entries, Fetcher(tmp_path / "cache"), counters,
                              refused=refused)
    assert [e.path for e in written] == ["m/f000", "m/f001"]
    assert os.listdir(outside) == []
    assert counters.get("restore_refused") == 3 and refused == {"k/f000", "k/f001", "k/f002"}
    check(top, written, data)


@pytest.fixture
def dirfd(tmp_path: Path) -> Iterator[int]:
    fd = beneath.open_base(tmp_path)
    try:
        yield fd
    finally:
        os.close(fd)


def test_an_unnamed_file_never_takes_an_existing_name(tmp_path: Path, dirfd: int) -> None:
    os.symlink(tmp_path / "elsewhere", tmp_path / "planted")  # dangling: never followed
    fd = beneath.create_unnamed(dirfd)
    assert fd is not None
    try:
        os.write(fd, b"x")
        with pytest.raises(FileExistsError):
            beneath.link_unnamed(fd, dirfd, "planted")
        for bad in ("a/b", "..", ".", ""):
            with pytest.raises(OSError):
                beneath.link_unnamed(fd, dirfd, bad)
        beneath.link_unnamed(fd, dirfd, "named")
    finally:
        os.close(fd)
    assert not (tmp_path / "elsewhere").exists()
    assert (tmp_path / "named").read_bytes() == b"x"
    assert sorted(beneath.names(dirfd, "")) == ["named", "planted"]


def _shared_extents(path: Path) -> bool:
    """Whether ``path``'s data shares its extents with another file (FIEMAP's
    FIEMAP_EXTENT_SHARED, as ``filefrag -v`` shows it)."""
    out = subprocess.run(["filefrag", "-v", str(path)], check=True, capture_output=True,
                         text=True).stdout
    return "shared" in out


@pytest.fixture
def xfs(tmp_path: Path) -> Iterator[Path]:
    """A fresh XFS (reflinks on, mkfs.xfs's default), loop-mounted for the test."""
    if shutil.which("mkfs.xfs") is None:
        pytest.fail("mkfs.xfs is missing: apt-get install xfsprogs (scripts/bootstrap.sh)")
    with loop_fs(tmp_path, ["mkfs.xfs", "-q", "-f"], 512 << 20) as mnt:
        yield mnt


def test_on_xfs_a_restored_file_shares_the_cached_objects_blocks(xfs: Path) -> None:
    entries, data = tree(xfs / "cache", {"k": 3})
    top = xfs / "top"
    top.mkdir()
    written = dirmode.restore(top, entries, Fetcher(xfs / "cache"), Counters())
    assert written == entries
    check(top, entries, data)
    big = max(entries, key=lambda e: e.size)  # (one of a few blocks at least)
    assert big.size > 8192
    assert _shared_extents(top / big.path)
    assert _shared_extents(Path(object_path(str(xfs / "cache"), big.digest)))
    # Copy on write: the job rewriting its copy in place leaves the object whole.
    with open(top / big.path, "r+b") as f:
        f.write(b"rewritten by the linker")
    obj = Path(object_path(str(xfs / "cache"), big.digest))
    assert blake3.blake3(obj.read_bytes()).hexdigest() == big.digest


def _cannot(*args: object) -> int:
    raise OSError(errno.EXDEV, "Invalid cross-device link")


@pytest.mark.parametrize("kernel", [
    {"_copy_range": _cannot},
    {"_copy_range": _cannot, "_sendfile": _cannot},
    {"_copy_range": lambda src, dst, off, count: 0},  # no error, nothing copied
])
def test_where_the_kernel_cannot_copy_the_bytes_go_another_way(
        kernel: dict[str, Callable[..., int]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name, fn in kernel.items():
        monkeypatch.setattr(dirmode, name, fn)
    entries, data = tree(tmp_path / "cache", {"k": 5})
    top = tmp_path / "top"
    top.mkdir()
    assert dirmode.restore(top, entries, Fetcher(tmp_path / "cache"), Counters()) == entries
    check(top, entries, data)


def test_a_restore_into_a_watched_directory_leaves_the_tracker_no_phantom_path(
        tmp_path: Path) -> None:
    """A refresh restores while the directory is watched: its files are named temp files
    then (an unnamed file's events come as ``#<inode>``, never removed): the tracker
    ends with the restored paths only, nothing pending under another name."""
    from casfs.promote.tracker import WriteTracker
    from tests.view.test_inowatch import wait_idle

    entries, data = tree(tmp_path / "cache", {"k": 6})
    top = tmp_path / "top"
    top.mkdir()
    tracker = WriteTracker()
    w = dirmode.watch(top, tracker, on_open=lambda rels: None)
    try:
        written = dirmode.restore(top, entries, Fetcher(tmp_path / "cache"), Counters(),
                                  unnamed=False)
        assert written == entries
        wait_idle(w)  # type: ignore[arg-type]
        assert set(tracker.quiet(0.0)) == {"k"} | {e.path for e in entries}  # (and its dir)
        assert not tracker.writing()
    finally:
        w.stop()
        w.join(5)
    check(top, entries, data)


def test_a_failing_presenter_unpins_what_it_was_given(tmp_path: Path) -> None:
    entries, _ = tree(tmp_path / "cache", {"k": 3})
    top = tmp_path / "top"
    top.mkdir()
    f = Fetcher(tmp_path / "cache")

    def present(e: Entry, src: str) -> bytes | None:
        if e.path == "k/f001":
            raise RuntimeError("a family's bug")
        return None

    with pytest.raises(RuntimeError):
        dirmode.restore(top, entries, f, Counters(), present=present)
    assert f.pins == 0


@pytest.mark.expect_log(r"not restoring k/f00[0-3]: \[Errno 1\] setgroups refused")
def test_credentials_not_taken_are_misses_not_a_failed_restore(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    entries, data = tree(tmp_path / "cache", {"k": 4, "m": 2})
    top = tmp_path / "top"
    top.mkdir()
    real = beneath.as_tenant

    @contextlib.contextmanager
    def as_tenant(uid: int | None, gid: int | None = None) -> Iterator[None]:
        if uid == 4242:  # (a user namespace refusing setgroups)
            raise PermissionError(errno.EPERM, "setgroups refused")
        with real(None, None):
            yield

    monkeypatch.setattr(beneath, "as_tenant", as_tenant)
    counters = Counters()
    f = Fetcher(tmp_path / "cache")
    assert dirmode.restore(top, entries[:4], f, counters, owner=(4242, 4242)) == []
    assert counters.get("restore_errors") == 4 and f.pins == 0
    assert dirmode.restore(top, entries[4:], f, counters) == entries[4:]
    check(top, entries[4:], data)


def test_each_directory_is_listed_once_however_the_walk_comes_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _ = tree(tmp_path / "cache", {})
    cache = tmp_path / "cache"
    rows = []
    for rel in ("a/0", "a/b/x", "a/c", "a/d/y", "a/e", "z"):  # a's files between subdirs
        body = rel.encode()
        digest = blake3.blake3(body).hexdigest()
        install_file(str(cache), digest, body)
        rows.append(Entry(rel, digest, len(body), 0o644, MTIME))
    listed: list[str] = []
    real = beneath.names

    def names(base: int, rel: str) -> list[str]:
        listed.append(rel)
        return real(base, rel)

    monkeypatch.setattr(beneath, "names", names)
    top = tmp_path / "top"
    top.mkdir()
    assert dirmode.restore(top, rows, Fetcher(cache), Counters()) == rows
    assert sorted(listed) == ["", "a", "a/b", "a/d"]
    assert (top / "a/d/y").read_bytes() == b"a/d/y"


@pytest.mark.expect_log(r"not restoring \d+ more files into .*: No space left on device "
                        r"\(the disk or the tenant's quota is full\)")
def test_a_full_directory_is_one_line_and_no_partial_file(
        how: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    entries, data = tree(tmp_path / "cache", {"k": 40, "m": 20})  # ~2 MB
    top = tmp_path / "top"
    top.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(top)], check=True)
    try:
        counters = Counters()
        with caplog.at_level(logging.WARNING):
            written = dirmode.restore(top, entries, Fetcher(tmp_path / "cache"), counters)
        assert 0 < len(written) < len(entries)
        check(top, written, data)  # every name there is whole; no temp name left
        present = {str(p.relative_to(top)) for p in top.rglob("*") if p.is_file()}
        assert present == {e.path for e in written}
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warned) == 1, [r.getMessage() for r in warned]
        assert f"not restoring {len(entries) - len(written)} more files" in warned[0].getMessage()
        assert counters.get("restore_full") == 1 and counters.get("restore_errors") == 0
    finally:
        subprocess.run(["umount", str(top)], check=False)


@pytest.mark.expect_log(r"not restoring ro/f000: \[Errno 13\] Permission denied")
def test_a_group_domains_directory_is_written_as_a_member_would(how: str) -> None:
    """A group domain's directory is root's (2770, the domain's group): dir mode acted
    in it as uid 0, which as_tenant leaves with all of root's power, so a directory a
    member made read-only still got files, and the directories it made were root's
    0755: every member's job then got EACCES writing its new kernels there (found by a
    review on 2026-12-05). Now it acts as MEMBER_UID with the group: the group's bits
    decide, what it makes is the group's to write (2770, files g+w)."""
    from casfs.node.modes.base import ViewParts
    from casfs.tenants import MEMBER_UID, Domain, TenantPolicy
    from tests.users import group_gid

    with open_tmp() as d, real_users(1, d, in_group=[0]) as (member,):
        gid = group_gid([member])
        tenant = TenantPolicy(domains=(Domain("ml", gids=frozenset({gid})),)).tenant("ml")
        parts = ViewParts.__new__(ViewParts)  # only its tenant is read here
        parts.tenant = tenant
        assert parts.tenant_owner == (0, gid)  # the directory's owner stays root
        assert parts.tenant_acting == (MEMBER_UID, gid) and parts.tenant_shared
        entries, data = tree(d / "cache", {"k": 2, "ro": 1})
        os.chmod(d / "cache", 0o700)
        top = d / "top"
        top.mkdir()
        os.chown(top, 0, gid)
        os.chmod(top, tenant.dir_mode)
        assert member.sh(f"mkdir {top}/ro && chmod 0555 {top}/ro").returncode == 0
        written = dirmode.restore(top, entries, Fetcher(d / "cache"), Counters(),
                                  owner=parts.tenant_acting, shared=parts.tenant_shared)
        assert [e.path for e in written] == ["k/f000", "k/f001"]  # her 0555 honoured
        st = os.lstat(top / "k")
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (MEMBER_UID, gid, 0o2770)
        for e in written:
            st = os.lstat(top / e.path)
            assert (top / e.path).read_bytes() == data[e.path]
            assert (st.st_uid, st.st_gid) == (MEMBER_UID, gid)
            assert st.st_mode & 0o777 == e.mode | (e.mode & 0o700) >> 3  # g+w like u
        # the member's job writes new kernels beside them, and rewrites a restored one
        r = member.sh(f"echo new > {top}/k/new.json && echo again > {top}/k/f001")
        assert r.returncode == 0, r.stderr
