"""casfsd as a subprocess: config files, a real NOTIFY_SOCKET listener, guaranteed cleanup.

A daemon never outlives its test: teardown SIGTERMs it, SIGKILLs any worker
still alive, and lazy-unmounts every configured mount path.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fusehelpers import lazy_unmount, mounted
from waiting import wait_until

VENV_BIN = Path(sys.executable).parent


class NotifyListener:
    """A unix datagram socket standing in for systemd's NOTIFY_SOCKET."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        bind = "\0" + address[1:] if address.startswith("@") else address
        self.sock.bind(bind)
        self.sock.settimeout(0.2)
        self.messages: list[dict[str, str]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._recv, daemon=True)
        self._thread.start()

    def _recv(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append(fields)

    def has(self, key: str, value: str | None = None) -> bool:
        return any(key in m and (value is None or m[key] == value) for m in self.messages)

    def wait_for(self, key: str, value: str, proc: subprocess.Popen[bytes] | None = None,
                 ) -> dict[str, str]:
        wait_until(lambda: self.has(key, value), f"{key}={value} on NOTIFY_SOCKET", proc=proc)
        return next(m for m in self.messages if m.get(key) == value)

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.sock.close()
        if not self.address.startswith("@"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.address)


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str | Path):
        return json.dumps(str(v))
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(v)


def write_config(path: Path, *, root: Path, state: Path, mounts: list[dict[str, Any]],
                 defaults: dict[str, Any] | None = None, metrics: str | None = None,
                 extra: str = "", node: dict[str, Any] | None = None) -> Path:
    lines = ["[store]", f"root = {toml_value(root)}", "[node]",
             f"state_dir = {toml_value(state)}"]
    lines += [f"{k} = {toml_value(v)}" for k, v in (node or {}).items()]
    lines += ["[log]", 'level = "debug"']
    if metrics:
        lines += ["[metrics]", f"listen = {toml_value(metrics)}"]
    if defaults:
        lines.append("[defaults]")
        lines += [f"{k} = {toml_value(v)}" for k, v in defaults.items()]
    for m in mounts:
        lines.append("[[mounts]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in m.items()]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


class Daemon:
    """One casfsd subprocess over one config file."""

    def __init__(self, config: Path, state: Path, root: Path, mount_paths: list[Path],
                 log: Path, notify: NotifyListener | None = None) -> None:
        self.config = config
        self.state = state
        self.root = root
        self.mount_paths = mount_paths
        self.log_path = log
        self.notify = notify
        self.proc: subprocess.Popen[bytes] | None = None
        self.worker_pids: set[int] = set()
        self.casfsd = VENV_BIN / "casfsd"  # another release's, to test upgrades

    def env(self) -> dict[str, str]:
        env = dict(os.environ, CASFS_ROOT=str(self.root), CASFS_STATE_DIR=str(self.state),
                   CASFS_MOUNT_BASE=str(self.state.parent / "mnt-base"))
        env.pop("NOTIFY_SOCKET", None)
        env.pop("JOURNAL_STREAM", None)
        if self.notify is not None:
            env["NOTIFY_SOCKET"] = self.notify.address
        return env

    def start(self, wait_ready: bool = True) -> Daemon:
        if self.notify is not None:
            self.notify.messages.clear()  # a restart must send its own READY
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(self.casfsd), "--config", str(self.config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env(),
                start_new_session=True,
            )
        if wait_ready:
            assert self.notify is not None
            self.notify.wait_for("READY", "1", proc=self.proc)
            self.worker_pids |= {int(m["pid"]) for m in self.status()}
        return self

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([str(VENV_BIN / "casfs"), *args], capture_output=True, text=True,
                           env=self.env(), timeout=120)
        if check:
            assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r

    def status(self) -> list[dict[str, Any]]:
        r = self.cli("status", "--json", check=False)
        if r.returncode != 0:  # say which mount did not answer, and why, first
            try:
                lost = [(m.get("name"), m.get("pid"), m.get("error"))
                        for m in json.loads(r.stdout) if m.get("unreachable")]
            except ValueError:
                lost = []
            raise AssertionError(f"casfs status exited {r.returncode}: unreachable {lost};"
                                 f" {r.stderr[-2000:]}")
        return list(json.loads(r.stdout))

    def published(self, namespace: str) -> set[str]:
        """Paths in the newest generation of ``namespace`` (empty if it has none)."""
        r = self.cli("ls", "-r", namespace, "--json", check=False)
        if r.returncode != 0:
            return set()
        return {e["path"] for e in json.loads(r.stdout) if e.get("type") != "dir"}

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def terminate(self, timeout: float = 120) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def cleanup(self) -> None:
        proc = self.proc
        with contextlib.suppress(Exception):
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(json.JSONDecodeError, AssertionError):
                    self.worker_pids |= {int(m["pid"]) for m in self.status()}
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(90)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(30)
        for pid in self.worker_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # the configured mounts, and the node's on-demand mount (FUSE over its guard)
        for mp in [*self.mount_paths, self.state.parent / "mnt-base" / "ns"]:
            lazy_unmount(mp)


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Factory: ``daemons(name, mounts, root=..., defaults=...)`` -> a started Daemon."""
    made: list[Daemon] = []
    listeners: list[NotifyListener] = []

    def make(name: str, mounts: list[dict[str, Any]], *, root: Path | None = None,
             defaults: dict[str, Any] | None = None, metrics: str | None = None,
             start: bool = True, notify_address: str | None = None,
             node: dict[str, Any] | None = None, extra: str = "") -> Daemon:
        from fusehelpers import require_fuse

        require_fuse()
        base = tmp_path / name
        base.mkdir(exist_ok=True)
        root = root or tmp_path / "root"
        state = base / "state"
        for m in mounts:
            m.setdefault("path", str(base / "mnt" / m["name"]))
        cfg = write_config(base / "casfs.toml", root=root, state=state, mounts=mounts,
                           defaults=defaults, metrics=metrics, node=node, extra=extra)
        listener = NotifyListener(notify_address or str(base / "notify.sock"))
        listeners.append(listener)
        d = Daemon(cfg, state, root, [Path(m["path"]) for m in mounts], base / "casfsd.log",
                   listener)
        made.append(d)
        if start:
            d.start()
        return d

    try:
        yield make
    finally:
        for d in made:
            d.cleanup()
        for listener in listeners:
            listener.close()
        leftover = [str(mp) for d in made for mp in d.mount_paths if mounted(mp)]
        assert not leftover, f"mounts left behind: {leftover}"
