"""Materialise a generation as a plain directory (``casfs export``).

Every path was validated when the manifest was read; the destination must be
new or empty, and casfs creates every directory itself. Someone else who can
write the destination (root exporting into a tenant's directory) could still
swap a directory casfs made, or the destination, for a symlink meanwhile: the
destination is opened once (a symlink refused) and everything is made beneath
that fd, no symlink followed (casfs.util.beneath); a swapped path fails and is
reported. Each file is written to a temp name beside its target, verified
while streaming, then renamed: a corrupt object leaves no file behind and is
reported.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from casfs.errors import CasfsError, UsageError
from casfs.store.entry import Entry
from casfs.store.record import Record
from casfs.store.root import SharedRoot
from casfs.util import beneath
from casfs.util.atomic import temp_name
from casfs.util.paths import parent_dirs


@dataclass
class ExportReport:
    files: int = 0
    bytes: int = 0
    failed: list[str] = field(default_factory=list)


def export_tree(
    root: SharedRoot,
    record: Record,
    dest: Path,
    *,
    progress: Callable[[int], None] | None = None,
    threads: int = 4,
    present: Callable[[Entry, bytes], bytes | None] | None = None,
) -> ExportReport:
    """``present(entry, stored)``: other bytes to write for a file stored path-free (a
    family's path-bearing file, presented for ``dest``), or None to write it as stored."""
    dest = dest.absolute()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"export destination {dest} exists and is not an empty directory")
    snap = root.generations().snapshot(record)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        base = beneath.open_base(dest, fuse=True)
    except OSError as e:
        raise UsageError(f"export destination {dest} cannot be opened as a directory (a"
                         f" symbolic link is refused): {e.strerror}") from None
    try:
        return _export(root, snap.entries, base, progress, threads, present)
    finally:
        os.close(base)


def _export(root: SharedRoot, entries: dict[str, Entry], base: int,
            progress: Callable[[int], None] | None, threads: int,
            present: Callable[[Entry, bytes], bytes | None] | None) -> ExportReport:
    dirs = sorted({d for p in entries for d in parent_dirs(p)})
    for d in dirs:
        with contextlib.suppress(OSError):  # a file beneath it fails, and is reported
            os.close(beneath.mkdirs(base, d))
    report = ExportReport()

    def one(e: Entry) -> tuple[Entry, str | None]:
        tmp = str(temp_name(os.path.dirname(e.path), "exp-"))
        try:
            shown = None
            if present is not None and e.extras and "relocate" in e.extras:
                shown = present(e, root.objects.get_bytes(e.digest, e.size))
            with os.fdopen(beneath.create(base, tmp, 0o600), "wb") as f:
                if shown is not None:
                    f.write(shown)
                else:
                    root.objects.get_into(e.digest, e.size, f)
                f.flush()  # before the times are set: a later write would change them
                # Permission bits only: a manifest (written by any node) must not be
                # able to make an export run as root produce setuid/setgid files.
                os.chmod(f.fileno(), e.mode & 0o777)
                os.utime(f.fileno(), ns=(e.mtime_ns, e.mtime_ns))
            beneath.rename(base, tmp, e.path)
            return e, None
        except (CasfsError, OSError) as err:
            with contextlib.suppress(OSError):
                beneath.unlink(base, tmp)
            return e, f"{e.path}: {err}"

    with ThreadPoolExecutor(threads) as pool:
        for e, err in pool.map(one, entries.values()):
            if err:
                report.failed.append(err)
            else:
                report.files += 1
                report.bytes += e.size
            if progress:
                progress(1)
    return report
