"""casfs mounts for benchmarks: a fresh node (its own state dir) serving one namespace.

Mounts are started the way ``casfs mount`` starts them (casfs.node.worker.spawn: a
child process that reports READY over a pipe) and always torn down in ``finally``,
with a lazy unmount as the last resort, so no benchmark leaves a mount behind.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import proc_cpu
from casfs.node import control, worker
from casfs.node.config import MountConfig


@dataclass
class Mount:
    cfg: MountConfig
    w: worker.Worker
    ready_seconds: float  # spawn to READY

    @property
    def path(self) -> Path:
        return self.cfg.mountpoint

    @property
    def pid(self) -> int:
        return int(self.w.proc.pid)

    def cpu(self) -> float:
        return proc_cpu(self.pid)

    def ask(self, cmd: str, timeout: float = 600) -> dict[str, Any]:
        return control.request(self.cfg.socket_path, cmd, timeout=timeout)


def config(root: Path, state_dir: Path, mountpoint: Path, namespace: str, *,
           family: str = "generic", stable_after: float = 3600.0,
           publish_interval: float = 3600.0, mode: str = "fuse",
           wait_warm: float = 0.0) -> MountConfig:
    """A mount that promotes/publishes only when told (or on unmount), unless overridden."""
    return MountConfig(name="bench", family=family, namespace=namespace,
                       mountpoint=mountpoint, root=root, state_dir=state_dir,
                       stable_after=stable_after, publish_interval=publish_interval,
                       refresh_interval=3600.0, shutdown_timeout=600.0, mode=mode,
                       wait_warm=wait_warm)


@contextlib.contextmanager
def mounted(cfg: MountConfig) -> Iterator[Mount]:
    t0 = time.perf_counter()
    w = worker.spawn(cfg)
    m = Mount(cfg, w, time.perf_counter() - t0)
    try:
        yield m
    finally:
        try:
            w.stop(timeout=cfg.shutdown_timeout + 30)
        finally:
            from casfs.view.session import is_mountpoint, lazy_unmount

            if is_mountpoint(cfg.mountpoint):
                lazy_unmount(cfg.mountpoint)


@dataclass
class FloorMount:
    path: Path
    pid: int

    def cpu(self) -> float:
        return proc_cpu(self.pid)


@contextlib.contextmanager
def floor_mounted(src: Path, mountpoint: Path, timeout: float = 120, *,
                  writable: bool = False, tasks: tuple[int, int] | None = None,
                  program: Path | None = None) -> Iterator[FloorMount]:
    """The in-memory pyfuse3 floor (bench.floorfs) serving ``src`` at ``mountpoint``;
    ``writable``: the write floor (bench.floorwfs, a passthrough of ``src``), with
    ``tasks`` as pyfuse3.main's (min_tasks, max_tasks); ``program``: a built
    bench/floorwc.c (the same passthrough on libfuse's C loop) instead."""
    import subprocess
    import sys

    mountpoint.mkdir(parents=True, exist_ok=True)
    if program is not None:
        cmd = [str(program)]
    else:
        cmd = [sys.executable, "-m", "bench.floorwfs" if writable else "bench.floorfs"]
    if tasks is not None:
        assert writable and program is None
        cmd += ["--tasks", f"{tasks[0]},{tasks[1]}"]
    p = subprocess.Popen([*cmd, str(src), str(mountpoint)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()  # READY, or "" if it died
        if line.strip() != "READY":
            raise RuntimeError(f"{cmd[-1]} did not start (rc {p.poll()})")
        yield FloorMount(mountpoint, p.pid)
    finally:
        p.terminate()
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        from casfs.view.session import is_mountpoint, lazy_unmount

        if is_mountpoint(mountpoint):
            lazy_unmount(mountpoint)


def build_c_floor(dest: Path) -> Path | None:
    """bench/floorwc.c built at ``dest`` (None where cc or the fuse3 headers are missing)."""
    import shutil
    import subprocess

    src = Path(__file__).with_name("floorwc.c")
    cc = shutil.which("cc")
    if cc is None or shutil.which("pkg-config") is None:
        return None
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True,
                           text=True, check=False)
    if flags.returncode != 0:
        return None
    r = subprocess.run([cc, "-O2", "-o", str(dest), str(src), *flags.stdout.split()],
                       capture_output=True, check=False)
    return dest if r.returncode == 0 else None
