"""Real FUSE mounts for tests: start a mount in a subprocess, wait for it, always clean up.

Reusable by any test package (tests/ is on sys.path when pytest collects a
test module in a subpackage of tests/):

    from fusehelpers import MountedView, require_fuse

    view = MountedView(lower_dir, upper_dir, mountpoint).start()
    try: ...
    finally: view.stop()

A mount never outlives its test: ``stop`` sends SIGTERM, waits, lazy-unmounts
whatever is left (fusermount3 -u -z, then umount -l) and kills the process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def fuse_available() -> bool:
    return os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


def require_fuse() -> None:
    """Fail (not skip) without FUSE, unless CASFS_ALLOW_NO_FUSE=1 says skipping is fine."""
    if fuse_available():
        return
    if os.environ.get("CASFS_ALLOW_NO_FUSE") == "1":
        pytest.skip("FUSE unavailable and CASFS_ALLOW_NO_FUSE=1")
    pytest.fail("FUSE unavailable (no /dev/fuse or fusermount3); CASFS_ALLOW_NO_FUSE=1 skips")


def mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point, read from mountinfo (never stats the mount)."""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp == target:
                return True
    return False


def lazy_unmount(path: Path) -> None:
    for cmd in (["fusermount3", "-u", "-z"], ["umount", "-l"]):
        if not mounted(path):
            return
        if shutil.which(cmd[0]):
            subprocess.run([*cmd, str(path)], capture_output=True, timeout=30, check=False)


class MountedView:
    """``python -m casfs.view.testserve`` over a plain lower directory, in a subprocess."""

    def __init__(
        self,
        lower_dir: Path,
        upper: Path,
        mountpoint: Path,
        *,
        log: Path | None = None,
        allow_other: bool = False,
    ) -> None:
        self.allow_other = allow_other
        self.lower_dir = Path(lower_dir)
        self.upper = Path(upper)
        self.mountpoint = Path(mountpoint)
        self.events_file = self.mountpoint.parent / f"{self.mountpoint.name}.events.jsonl"
        self.log_file = log or self.mountpoint.parent / f"{self.mountpoint.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> MountedView:
        require_fuse()
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.upper.mkdir(parents=True, exist_ok=True)
        self.events_file.unlink(missing_ok=True)
        env = dict(os.environ, PYTHONPATH=str(REPO))
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "casfs.view.testserve",
                    "--lower-dir", str(self.lower_dir), "--upper", str(self.upper),
                    "--mount", str(self.mountpoint), "--events", str(self.events_file),
                    *(["--allow-other"] if self.allow_other else []),
                ],
                stdout=log, stderr=log, env=env, cwd=str(REPO),
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not mounted(self.mountpoint):
            if self.proc.poll() is not None:
                raise RuntimeError(f"mount process died (rc={self.proc.returncode}):\n{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"mount did not come up in {timeout}s:\n{self.log()}")
            time.sleep(0.05)
        os.stat(self.mountpoint)  # waits for the FUSE loop to answer
        return self

    def log(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        proc = self.proc
        try:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=timeout)
        finally:
            lazy_unmount(self.mountpoint)
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            self.proc = None

    def events(self) -> list[dict[str, Any]]:
        """Tracker events, counters and pins the server dumped at shutdown (call after stop)."""
        if not self.events_file.exists():
            return []
        return [json.loads(line) for line in self.events_file.read_text().splitlines()]

    def __enter__(self) -> MountedView:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def root_objects(root: Path, ns: str = "testns") -> Any:
    """The object store of ``root`` after reading ``ns``'s newest generation, so it knows
    where the packed objects it names live (promotion packs small files)."""
    from casfs.store.root import SharedRoot

    r = SharedRoot.open(root)
    gens = r.generations()
    if gens.latest(ns) is not None:
        gens.entries(ns)
    return r.objects


def corrupt_pack_member(root: Path | str, ns: str, rel: str) -> None:
    """Flip the last byte of the pack member that holds ``rel``'s newest published bytes
    (the pack keeps its name: what a damaged disk or a lying server gives a reader)."""
    from casfs.store.packs import pack_key
    from casfs.store.root import SharedRoot
    from casfs.util import atomic

    r = SharedRoot.open(root)
    pack, off, length = r.generations().entries(ns).entries[rel].extras["pack"]  # type: ignore[index]
    with r.backend.open(pack_key(pack)) as f:
        raw = bytearray(f.read())
    raw[off + length - 1] ^= 0xFF
    with atomic.staged_file(r.backend.staging_dir, "bad-", 0o444, sync=False) as (f, tmp):
        f.write(bytes(raw))
    r.backend.replace(pack_key(pack), tmp)
