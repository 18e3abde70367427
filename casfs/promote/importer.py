"""Import a plain cache directory as one new generation (``casfs import``).

The same rules as promotion apply: scratch names are skipped, empty
directories are not published, and a Triton group file is published only
together with every child it names (a group whose children are missing would
be a wrong hit, so it is skipped instead).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from casfs.errors import CasfsError, UsageError
from casfs.families import CacheRules, walk_files
from casfs.store.entry import Entry, mtime_storable
from casfs.store.generations import RELOCATE, PublishResult
from casfs.store.objects import digest_bytes, max_object_bytes, read_regular
from casfs.store.packs import SMALL_OBJECT, PackWriter, parse_location, read_pack
from casfs.store.root import SharedRoot
from casfs.util import beneath
from casfs.util.paths import is_valid_relpath

log = logging.getLogger(__name__)


@dataclass
class ImportReport:
    files: int = 0
    bytes: int = 0
    new_objects: int = 0
    packs: int = 0  # pack objects written (small files go into packs)
    skipped_scratch: int = 0
    skipped_other: list[str] = field(default_factory=list)
    publish: PublishResult | None = None


def _storable(rel: str, st: os.stat_result) -> bool:
    # Over the object size limit, or an mtime no manifest holds: every reader would refuse it.
    return (is_valid_relpath(rel) and stat.S_ISREG(st.st_mode)
            and st.st_size <= max_object_bytes() and mtime_storable(st.st_mtime_ns))


def scan_tree(src: Path, rules: CacheRules, report: ImportReport,
              base: int | None = None) -> list[tuple[str, Path]]:
    """(relpath, path) of every regular, non-scratch file under ``src``; ``base``: an
    fd of ``src`` every file is looked at beneath (casfs.util.beneath)."""
    out: list[tuple[str, Path]] = []
    for rel, full, scratch in walk_files(src, rules, base):
        if scratch:
            report.skipped_scratch += 1
            continue
        try:
            st = os.lstat(full) if base is None else beneath.lstat(base, rel)
        except OSError:  # gone, or a symlink or mount on its way: not imported
            report.skipped_other.append(rel)
            continue
        if not _storable(rel, st):
            report.skipped_other.append(rel)
        else:
            out.append((rel, Path(full)))
    return sorted(out)


def _read(base: int, rel: str) -> bytes:
    fd = beneath.open_read(base, rel)
    try:
        return read_regular(fd, max_object_bytes())
    finally:
        os.close(fd)


def complete_groups(
    files: dict[str, Entry], read: Callable[[str], bytes], report: ImportReport,
    rules: CacheRules,
) -> dict[str, Entry]:
    """Drop commit records (Triton group files) whose children are not all present."""
    for rel in [r for r in files if rules.is_commit_record(r)]:
        children = rules.record_children(rel, read(rel))
        if children is None or any(c not in files for c in children):
            del files[rel]
            report.skipped_other.append(rel)
            log.warning("skipping incomplete commit record %s", rel)
    return files


def import_tree(
    root: SharedRoot,
    src: Path,
    namespace: str,
    *,
    rules: CacheRules,
    node: str,
    fingerprint: dict[str, Any] | None = None,
    max_bytes: int | None = None,
    progress: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
    threads: int = 4,
    packs: bool | None = None,
) -> ImportReport:
    """``packs``: files up to SMALL_OBJECT bytes go into pack objects (casfs.store.packs);
    None: on an object store (one request per small object is what packs save), not on
    a POSIX root."""
    if packs is None:
        packs = not root.is_local
    if not src.is_dir():
        raise UsageError(f"{src} is not a directory")
    # Every file is read beneath the source's directory, no symlink followed and no
    # mount point crossed: root importing a user's tree must never be made to read
    # a file of its own (a parent swapped for a symlink to /root after the scan).
    try:
        base = beneath.open_base(src)
    except OSError as e:
        raise UsageError(f"{src}: {e.strerror or e}") from None
    try:
        return _import(root, src, base, namespace, rules=rules, node=node,
                       fingerprint=fingerprint, max_bytes=max_bytes, progress=progress,
                       on_total=on_total, threads=threads, packs=packs)
    finally:
        os.close(base)


def _import(root: SharedRoot, src: Path, base: int, namespace: str, *, rules: CacheRules,
            node: str, fingerprint: dict[str, Any] | None, max_bytes: int | None,
            progress: Callable[[int], None] | None, on_total: Callable[[int], None] | None,
            threads: int, packs: bool) -> ImportReport:
    report = ImportReport()
    found = scan_tree(src, rules, report, base)
    if on_total:
        on_total(len(found))
    packer = PackWriter(root.objects) if packs else None
    known = _stored_digests(root, namespace) if packs else {}
    sound = _SoundPacks(root)

    def put(item: tuple[str, Path]) -> tuple[Entry | None, bool]:
        rel, _ = item
        try:
            fd = beneath.open_read(base, rel)
        except OSError:  # gone, or a symlink or mount on its way since the scan
            report.skipped_other.append(rel)
            return None, False
        with os.fdopen(fd, "rb") as f:
            return put_open(rel, f)

    def put_open(rel: str, f: BinaryIO) -> tuple[Entry | None, bool]:
        fd = f.fileno()
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            report.skipped_other.append(rel)
            return None, False
        bearer = rules.path_bearer(rel)
        data = f.read() if bearer is not None else None
        stored = bearer.to_pathfree(rel, data) if bearer is not None and data is not None else None
        count = bearer.count(rel, stored) if bearer is not None and stored is not None else None
        # Stored path-free (casfs.families), served at any path; packed like any small
        # file, as promotion does (a Triton group file loose per kernel was a GET each).
        pathfree = stored if count and data is not None else None
        base: dict[str, Any] = {RELOCATE: count} if pathfree is not None else {}
        if packer is not None and (st.st_size if pathfree is None
                                   else len(pathfree)) <= SMALL_OBJECT:
            if data is None:
                data = f.read()
            blob = data if pathfree is None else pathfree
            digest = digest_bytes(blob)
            if os.fstat(fd).st_mtime_ns != st.st_mtime_ns or len(data) != st.st_size:
                report.skipped_other.append(rel)  # changed while being read: not stable
                return None, False
            if digest in known:  # already stored (loose or packed): name it as it is
                loc = known[digest]
                created = False
                if loc is None or not sound.holds(loc[0], digest):
                    # Damaged (or gone): write it loose, which repairs a loose object and
                    # serves rows naming a damaged pack (ObjectStore reads its loose copy).
                    created = root.objects.put_bytes(blob).created
                ex = {**base, "pack": loc} if loc is not None else base or None
                return Entry(rel, digest, len(blob), st.st_mode & 0o7777, st.st_mtime_ns, ex), \
                    created
            packer.add(blob)
            return Entry(rel, digest, len(blob), st.st_mode & 0o7777, st.st_mtime_ns,
                         {**base, "pack": None}), True
        if pathfree is not None and data is not None:
            res = root.objects.put_bytes(pathfree)
            read = len(data)
        else:
            res = root.objects.put_file(fd)  # (from its start: the Source an fd)
            read = res.size
        if os.fstat(fd).st_mtime_ns != st.st_mtime_ns or read != st.st_size:
            report.skipped_other.append(rel)  # changed while being read: not stable
            return None, False
        return (Entry(rel, res.digest, res.size, st.st_mode & 0o7777, st.st_mtime_ns,
                      base or None),
                res.created)

    entries: dict[str, Entry] = {}
    with ThreadPoolExecutor(threads) as pool:  # blake3 and zstd release the GIL
        for entry, created in pool.map(put, found):
            if entry is not None:
                entries[entry.path] = entry
                report.new_objects += created
            if progress:
                progress(1)
    if packer is not None:
        locations = packer.flush()
        for rel, e in list(entries.items()):
            if e.extras is not None and e.extras.get("pack", 0) is None:
                loc = locations.get(e.digest)  # None: its pack failed, it was stored loose
                rest = {k: v for k, v in e.extras.items() if k != "pack"}
                extras = {**rest, "pack": list(loc)} if loc is not None else rest or None
                entries[rel] = replace(e, extras=extras)
        report.packs = packer.packs_written
    complete_groups(entries, lambda rel: _read(base, rel), report, rules)
    report.files = len(entries)
    report.bytes = sum(e.size for e in entries.values())
    report.publish = root.generations().publish(
        namespace, entries.values(), node=node, fingerprint=fingerprint, max_bytes=max_bytes
    )
    return report


class _SoundPacks:
    """Which packs are intact, each read and hashed once (an import is the repair tool:
    it must not name a member of a damaged pack as stored, as it re-verifies loose objects)."""

    def __init__(self, root: SharedRoot) -> None:
        self.root = root
        self.members: dict[str, frozenset[str]] = {}
        self.lock = threading.Lock()

    def holds(self, pack: str, digest: str) -> bool:
        with self.lock:  # one reader per pack; imports hash files in a few threads
            if pack not in self.members:
                try:
                    _, info = read_pack(self.root.objects, pack)
                    self.members[pack] = frozenset(info.members)
                except (CasfsError, OSError) as e:
                    log.warning("pack %s is damaged or unreadable (%s): its members are"
                                " written loose", pack, e)
                    self.members[pack] = frozenset()
            return digest in self.members[pack]


def _stored_digests(root: SharedRoot, namespace: str) -> dict[str, list[Any] | None]:
    """digest -> pack location (None: a loose object) of the namespace's newest generation.

    Files already stored are named as they are instead of being packed again.
    """
    gens = root.generations()
    try:
        if gens.latest(namespace) is None:
            return {}
        snap = gens.entries(namespace)
    except CasfsError:
        return {}  # unreadable: pack everything again (publication reports the damage)
    out: dict[str, list[Any] | None] = {}
    for e in snap.entries.values():
        loc = parse_location(e.extras.get("pack")) if e.extras else None
        out[e.digest] = list(loc) if loc is not None else None
    return out
