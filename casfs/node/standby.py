"""A pre-started mount process, waiting: a restart after a crash skips Python's start.

When a mount process dies, the gap until the next one serves is mostly the new
interpreter importing casfs, trio, pyfuse3 and lmdb (1.4-1.7 s measured on a
busy node). casfsd keeps one standby process that has done all of that and
waits on a pipe; a restart hands it the mount's arguments and it becomes the
mount process (``casfs.node.worker`` or ``casfs.node.hoststart`` main), reporting
READY on a pipe made when it was started. Then a new standby is started in the
background. A standby that is not needed exits when its pipe closes.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from casfs.util.child import CHILD_CWD, child_env, python_module

WORKER = "casfs.node.worker"
HOST = "casfs.node.hoststart"  # the node's mount process (casfs.node.host)


class Standby:
    """The parent's handle: the process, its go pipe, its ready pipe, its lifeline."""

    def __init__(self, proc: subprocess.Popen[bytes], go: int, ready: int,
                 lifeline: int | None, log_opts: list[str]) -> None:
        self.proc = proc
        self.go = go
        self.ready = ready
        self.lifeline = lifeline
        self.log_opts = log_opts

    def alive(self) -> bool:
        return self.proc.poll() is None

    def activate(self, module: str, argv: list[str]) -> None:
        """Become ``module``'s main with ``argv`` (ready/lifeline fds are the standby's)."""
        line = json.dumps({"module": module, "argv": [*argv, *self.log_opts]}) + "\n"
        os.write(self.go, line.encode())
        os.close(self.go)
        self.go = -1

    def discard(self) -> None:
        for fd in (self.go, self.ready, self.lifeline):
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start(*, log_format: str | None = None, log_level: str | None = None,
          die_with_parent: bool = True, adopt_grace: float = 0.0) -> Standby:
    """Start a standby process that logs to this process's stderr."""
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    life_r = life_w = None
    fds = [go_r, ready_w]
    cmd = [*python_module("casfs.node.standby"), "--go-fd", str(go_r),
           "--ready-fd", str(ready_w)]
    if die_with_parent:
        life_r, life_w = os.pipe()
        fds.append(life_r)
        cmd += ["--lifeline-fd", str(life_r)]
    log_opts = []
    if log_format:
        log_opts += ["--log-format", log_format]
    if log_level:
        log_opts += ["--log-level", log_level]
    if die_with_parent and adopt_grace > 0:
        log_opts += ["--adopt-grace", f"{adopt_grace:g}"]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, pass_fds=fds,
                                start_new_session=True, cwd=CHILD_CWD, env=child_env())
    finally:
        for fd in fds:
            os.close(fd)
    return Standby(proc, go_w, ready_r, life_w, log_opts)


def spawn_with(sb: Standby, cfg: Any, *, ready_timeout: float = 60.0) -> Any:
    """Make the standby ``cfg``'s mount process; a casfs.node.worker.Worker once it serves."""
    from casfs.errors import CasfsError
    from casfs.node import worker
    from casfs.node.host import HostConfig

    stats_out: Path = cfg.run_dir / f"{cfg.name}.final-stats"
    stats_out.unlink(missing_ok=True)
    if isinstance(cfg, HostConfig):
        module, text = HOST, cfg.to_json()
    else:
        module, text = WORKER, worker.config_to_json(cfg)
    sb.activate(module, ["--config-json", text, "--stats-out", str(stats_out)])
    try:
        line = worker._read_line(sb.ready, ready_timeout, sb.proc)
    finally:
        os.close(sb.ready)
        sb.ready = -1
    if line != "READY":
        sb.discard()
        raise CasfsError(f"mount {cfg.name} at {cfg.mountpoint} failed (standby): "
                         f"{line or 'it exited without saying why'}")
    return worker.Worker(cfg, sb.proc, stats_out, None, sb.lifeline)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="casfs-standby")
    ap.add_argument("--go-fd", type=int, required=True)
    ap.add_argument("--ready-fd", type=int, required=True)
    ap.add_argument("--lifeline-fd", type=int)
    args = ap.parse_args(argv)
    # Everything a mount process imports, now, while nothing waits for it.
    import lmdb  # noqa: F401
    import trio  # noqa: F401

    from casfs.node import host, hoststart, mount, worker  # noqa: F401

    with contextlib.suppress(ImportError):  # pyfuse3 is the 'fuse' extra: dir mode needs none
        import pyfuse3  # noqa: F401

        from casfs.view import mux, ops  # noqa: F401

    with os.fdopen(args.go_fd, "rb") as go:
        line = go.readline()
    if not line:
        return 0  # not needed: the parent closed the pipe
    order: dict[str, Any] = json.loads(line)
    module = {WORKER: worker, HOST: hoststart}[order["module"]]
    rest = [*order["argv"], "--ready-fd", str(args.ready_fd)]
    if args.lifeline_fd is not None:
        rest += ["--lifeline-fd", str(args.lifeline_fd)]
    sys.argv[0] = {WORKER: "casfs-worker", HOST: "casfs-host"}[order["module"]]
    return int(module.main(rest))


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["HOST", "WORKER", "Path", "Standby", "start"]
