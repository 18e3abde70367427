"""casfsd's reload (SIGHUP, ``systemctl reload``) and systemd watchdog, without systemd.

The fast tests drive the pieces in this process: the supervisor's reconfigure with
fake mount processes (which mounts stop, start, or keep serving), the daemon's
reload (what it refuses, in one line, keeping the running configuration; the log
level at once), the notifier's watchdog variables and the liveness the watchdog
pings on. The slow ones run a real casfsd with real FUSE mounts and a real
NOTIFY_SOCKET listener: a SIGHUP that adds, changes and removes mounts while the
untouched one keeps serving (same worker), a bad file refused while casfsd serves
on, and WATCHDOG=1 that stops while casfsd is stopped (SIGSTOP) and comes back
after. tests/system/test_systemd.py does the same under a real systemd.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fusehelpers import mounted
from waiting import wait_until

from casfs.daemon import config as dconfig
from casfs.daemon import main as dmain
from casfs.daemon.notify import Notifier
from casfs.daemon.supervisor import Supervisor

from .conftest import Daemon, write_config

# --- fakes ------------------------------------------------------------------------------


class FakeProc:
    _next = 40000

    def __init__(self) -> None:
        FakeProc._next += 1
        self.pid = FakeProc._next
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


class FakeWorker:
    def __init__(self, cfg: Any, log: list[tuple[str, str]]) -> None:
        self.cfg = cfg
        self.proc = FakeProc()
        self._log = log

    def stop(self, timeout: float | None = None) -> dict[str, Any] | None:
        self._log.append(("stop", self.cfg.name))
        self.proc.returncode = 0
        return {"last_publish": {"message": "nothing to publish"}}

    def release(self) -> None:
        pass


@pytest.fixture
def calls() -> list[tuple[str, str]]:
    return []


@pytest.fixture
def fake_spawn(calls: list[tuple[str, str]]) -> Callable[..., FakeWorker]:
    def spawn(cfg: Any, **kw: Any) -> FakeWorker:
        if getattr(cfg, "namespace", "") == "fails-to-start":
            from casfs.errors import CasfsError

            raise CasfsError(f"mount {cfg.name}: cannot serve")
        calls.append(("start", cfg.name))
        return FakeWorker(cfg, calls)

    return spawn


def mount(name: str, tmp: Path, **kw: Any) -> dict[str, Any]:
    return {"name": name, "family": "generic", "namespace": f"{name}-ns",
            "path": str(tmp / "mnt" / name), **kw}


def config(tmp: Path, mounts: list[dict[str, Any]], *, name: str = "casfs.toml",
           node: dict[str, Any] | None = None, level: str = "debug",
           extra: str = "") -> dconfig.DaemonConfig:
    path = write_config(tmp / name, root=tmp / "root", state=tmp / "state", mounts=mounts,
                        node={"on_demand": False, **(node or {})}, extra=extra)
    if level != "debug":
        path.write_text(path.read_text().replace('level = "debug"', f'level = "{level}"'))
    return dconfig.load(path)


# --- the supervisor's reconfigure -----------------------------------------------------------


def test_reconfigure_stops_removed_restarts_changed_starts_new_keeps_the_rest(
        tmp_path: Path, calls: list[tuple[str, str]], fake_spawn: Callable[..., FakeWorker],
) -> None:
    old = config(tmp_path, [mount("keep", tmp_path), mount("change", tmp_path),
                            mount("drop", tmp_path)])
    sup = Supervisor(old, fake_spawn)
    sup.start()
    keep_pid = sup.slots[0].pid
    assert sorted(calls) == [("start", "change"), ("start", "drop"), ("start", "keep")]
    calls.clear()

    new = config(tmp_path, [mount("keep", tmp_path), mount("change", tmp_path,
                                                           publish_interval=99.0),
                            mount("add", tmp_path)], name="new.toml")
    changes = sup.reconfigure(new)

    assert changes == ["drop removed", "change changed", "add added"]
    # both stops come before any start (a removed mount's path may be a new one's)
    assert sorted(calls[:2]) == [("stop", "change"), ("stop", "drop")]
    assert sorted(calls[2:]) == [("start", "add"), ("start", "change")]
    assert [s.cfg.name for s in sup.slots] == ["keep", "change", "add"]
    assert sup.slots[0].pid == keep_pid  # untouched: the same worker serves on
    assert sup.slots[1].cfg.publish_interval == 99.0
    assert all(s.state == "up" for s in sup.slots)
    assert sup.cfg is new
    assert "3/3 mounts up" in sup.summary()

    calls.clear()
    assert sup.reconfigure(new) == []  # the same file again: nothing stops or starts
    assert calls == []


def test_reconfigure_node_defaults_restart_the_mounts_that_take_them(
        tmp_path: Path, calls: list[tuple[str, str]], fake_spawn: Callable[..., FakeWorker],
) -> None:
    """[defaults] reach every mount without its own value, and the on-demand mount
    process: each of them restarts; a mount that sets its own keeps serving."""
    mounts = [mount("own", tmp_path, stable_after=5.0), mount("inherits", tmp_path)]
    old = config(tmp_path, mounts, node={"on_demand": True})
    sup = Supervisor(old, fake_spawn)
    sup.start()
    assert {s.cfg.name for s in sup.slots} == {"own", "inherits", "host"}
    calls.clear()
    new = config(tmp_path, mounts, node={"on_demand": True}, name="new.toml",
                 extra="[defaults]\nstable_after = 9.0\n")
    assert sup.reconfigure(new) == ["inherits changed", "host changed"]
    assert sorted(calls) == [("start", "host"), ("start", "inherits"),
                             ("stop", "host"), ("stop", "inherits")]


@pytest.mark.expect_log(r"add: start failed: mount add: cannot serve; next try in 0s")
def test_reconfigure_a_mount_that_fails_to_start_is_retried_like_a_dead_worker(
        tmp_path: Path, calls: list[tuple[str, str]], fake_spawn: Callable[..., FakeWorker],
) -> None:
    old = config(tmp_path, [mount("keep", tmp_path)])
    sup = Supervisor(old, fake_spawn)
    sup.start()
    new = config(tmp_path, [mount("keep", tmp_path),
                            mount("add", tmp_path, namespace="fails-to-start")],
                 name="new.toml")
    assert sup.reconfigure(new) == ["add added"]
    add = sup.slots[1]
    assert add.state == "restarting" and add.worker is None
    assert add.last_exit == "mount add: cannot serve"
    assert "add RESTARTING" in sup.summary()
    assert sup.slots[0].state == "up"


@pytest.mark.expect_log(r"bad: start failed: mount bad: cannot serve; next try in 0s \(the"
                        r" other mounts serve\)")
def test_a_mount_that_fails_at_start_is_retried_while_the_others_serve(
        tmp_path: Path, calls: list[tuple[str, str]], fake_spawn: Callable[..., FakeWorker],
) -> None:
    """One mount failing at casfsd's start (a tenant's own mount on its path, found by a
    review on 2026-12-06) stopped every mount; now it is retried like a dead worker."""
    cfg = config(tmp_path, [mount("good", tmp_path),
                            mount("bad", tmp_path, namespace="fails-to-start")])
    sup = Supervisor(cfg, fake_spawn)
    sup.start()
    good, bad = sup.slots
    assert good.state == "up" and good.worker is not None
    assert bad.state == "restarting" and bad.worker is None
    assert bad.last_exit == "mount bad: cannot serve"
    assert ("stop", "good") not in calls


def test_every_mount_failing_at_start_stops_the_start(
        tmp_path: Path, calls: list[tuple[str, str]], fake_spawn: Callable[..., FakeWorker],
) -> None:
    from casfs.errors import CasfsError

    cfg = config(tmp_path, [mount("bad", tmp_path, namespace="fails-to-start")])
    with pytest.raises(CasfsError, match="mount bad: cannot serve"):
        Supervisor(cfg, fake_spawn).start()


# --- the daemon's reload -------------------------------------------------------------------


class Recorder:
    """A NOTIFY_SOCKET bound in this process."""

    def __init__(self, tmp: Path) -> None:
        self.path = str(tmp / "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0)

    def messages(self) -> list[dict[str, str]]:
        out = []
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return out
            out.append(dict(ln.split("=", 1) for ln in data.decode().splitlines()))


@pytest.fixture
def daemon_of(tmp_path: Path, fake_spawn: Callable[..., FakeWorker],
              monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """A dmain.Daemon over fake mount processes, its supervisor started, reloading
    ``tmp_path / 'casfs.toml'``."""
    monkeypatch.setattr(dmain, "_spawn", fake_spawn)
    made: list[Any] = []
    root_level = logging.getLogger().level

    def make(mounts: list[dict[str, Any]], **kw: Any) -> tuple[Any, Recorder]:
        cfg = config(tmp_path, mounts, **kw)
        rec = Recorder(tmp_path)
        d = dmain.Daemon(cfg, notifier=Notifier(rec.path),
                         load=lambda: dconfig.load(tmp_path / "casfs.toml"))
        d.supervisor._standby_fn = None  # no real standby mount processes here
        d.supervisor.start()
        made.append(d)
        return d, rec

    yield make
    logging.getLogger().setLevel(root_level)
    for d in made:
        d.supervisor.stop()
        d.notifier.close()


@pytest.mark.expect_log(r"reload refused: .*casfs\.toml.*; still serving the configuration"
                        r" loaded before")
def test_reload_refuses_a_file_that_does_not_load_in_one_line(
        tmp_path: Path, daemon_of: Callable[..., Any], calls: list[tuple[str, str]],
        caplog: pytest.LogCaptureFixture) -> None:
    d, rec = daemon_of([mount("a", tmp_path)])
    before = d.cfg
    calls.clear()
    (tmp_path / "casfs.toml").write_text("[store]\nroot = '/x'\nnot_a_key = 1\n")
    with caplog.at_level(logging.INFO, logger="casfs"):
        assert d.reload() is False
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and errors[0].levelno == logging.ERROR
    assert "store.not_a_key" in errors[0].getMessage()
    assert d.cfg is before and calls == []
    msgs = rec.messages()
    assert msgs[0]["RELOADING"] == "1" and msgs[-1]["READY"] == "1"
    assert msgs[-1]["STATUS"].startswith("1/1 mounts up")


@pytest.mark.expect_log(r"reload refused: store\.root, \[tenants\] changed, which only a"
                        r" restart applies")
def test_reload_refuses_what_only_a_restart_applies(
        tmp_path: Path, daemon_of: Callable[..., Any], calls: list[tuple[str, str]],
        caplog: pytest.LogCaptureFixture) -> None:
    d, _ = daemon_of([mount("a", tmp_path)])
    before = d.cfg
    calls.clear()
    text = (tmp_path / "casfs.toml").read_text().replace(str(tmp_path / "root"),
                                                         str(tmp_path / "root2"))
    (tmp_path / "casfs.toml").write_text(text + '[tenants]\nmode = "cluster"\n')
    assert d.reload() is False
    assert d.cfg is before and calls == []  # nothing applied, not even the rest


def test_reload_applies_the_log_level_and_the_mounts(
        tmp_path: Path, daemon_of: Callable[..., Any], calls: list[tuple[str, str]],
        caplog: pytest.LogCaptureFixture) -> None:
    d, rec = daemon_of([mount("a", tmp_path), mount("b", tmp_path)], level="info")
    logging.getLogger().setLevel(logging.INFO)
    calls.clear()
    config(tmp_path, [mount("a", tmp_path), mount("c", tmp_path)], level="warning")
    with caplog.at_level(logging.INFO, logger="casfs.daemon.main"):
        assert d.reload() is True
    assert logging.getLogger().level == logging.WARNING
    assert d.supervisor._spawn_options["log_level"] == "warning"
    assert sorted(calls) == [("start", "c"), ("stop", "b")]
    assert d.cfg.log_level == "warning"
    line = next(r.getMessage() for r in caplog.records if "reloaded" in r.getMessage())
    assert line == (f"reloaded {tmp_path / 'casfs.toml'}: log level info -> warning;"
                    " b removed; c added")
    assert rec.messages()[-1]["READY"] == "1"


def test_sighup_reloads_and_does_not_stop(tmp_path: Path, daemon_of: Callable[..., Any]) -> None:
    """SIGHUP only asks: the supervision loop reloads at its next turn."""
    d, _ = daemon_of([mount("a", tmp_path)])
    reloaded = threading.Event()
    d.reload = lambda: reloaded.set()  # type: ignore[method-assign]
    d._on_hup(signal.SIGHUP)
    assert not d.stop_requested.is_set()
    t = threading.Thread(target=d.supervisor.run, args=(d.stop_requested,),
                         kwargs={"tick": d._tick})
    t.start()
    try:
        assert reloaded.wait(10)
    finally:
        d.stop_requested.set()
        t.join()


def test_restart_only_keys(tmp_path: Path) -> None:
    a = config(tmp_path, [mount("a", tmp_path)])
    assert dmain.restart_only_changes(a, a) == []
    b = config(tmp_path, [mount("b", tmp_path)], level="error", name="b.toml",
               extra="[defaults]\nstable_after = 7.0\n")
    assert dmain.restart_only_changes(a, b) == []  # mounts, defaults, log level: live
    c = config(tmp_path, [mount("a", tmp_path)], name="c.toml",
               node={"on_demand": True, "mount_base": str(tmp_path / "elsewhere")})
    assert dmain.restart_only_changes(a, c) == ["node.mount_base",
                                                "node.on_demand/node.serve_base"]


# --- the watchdog ---------------------------------------------------------------------------


def test_the_watchdog_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rec = Recorder(tmp_path)
    monkeypatch.setenv("NOTIFY_SOCKET", rec.path)
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    n = Notifier.from_environment()
    assert n.watchdog_interval == 30.0
    for var in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        assert var not in os.environ  # the mount processes must not see them
    assert n.watchdog() and rec.messages() == [{"WATCHDOG": "1"}]
    n.close()
    # meant for another process (casfsd run by a wrapper that got the watchdog)
    monkeypatch.setenv("NOTIFY_SOCKET", rec.path)
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", "1")
    assert Notifier.from_environment().watchdog_interval is None
    # no NOTIFY_SOCKET: nowhere to ping
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert Notifier.from_environment().watchdog_interval is None


def test_alive_while_the_loop_turns_or_waits_within_a_bound(tmp_path: Path) -> None:
    sup = Supervisor(config(tmp_path, [mount("a", tmp_path)]), lambda *a, **k: None)
    assert sup.alive(stalled_after=1.0)
    sup.heartbeat -= 5
    assert not sup.alive(stalled_after=1.0)  # wedged
    with sup.busy(10):
        sup.heartbeat -= 5
        assert sup.alive(stalled_after=1.0)  # a restart waiting for its worker
    assert sup.alive(stalled_after=1.0)  # the bounded wait ended: a beat
    sup.busy_until = time.monotonic() - 1  # a bound overrun is wedged too
    sup.heartbeat -= 5
    assert not sup.alive(stalled_after=1.0)


# --- a real casfsd ---------------------------------------------------------------------------

FAST = {"stable_after": 0.2, "publish_interval": 0.5, "refresh_interval": 1.0}


def _pids(d: Daemon) -> dict[str, int]:
    return {m["name"]: int(m["pid"]) for m in d.status()}


@pytest.mark.fuse
@pytest.mark.slow
@pytest.mark.expect_log(r"reload refused: ")
def test_sighup_applies_a_changed_config_to_a_running_casfsd(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    mounts = [{"name": "keep", "family": "generic", "namespace": "keep-ns"},
              {"name": "change", "family": "generic", "namespace": "change-ns"},
              {"name": "drop", "family": "generic", "namespace": "drop-ns"}]
    d = daemons("a", mounts, defaults=FAST, node={"on_demand": False})
    assert d.proc is not None and d.notify is not None
    paths = {m["name"]: Path(m["path"]) for m in mounts}
    before = _pids(d)
    (paths["keep"] / "k.bin").write_bytes(b"kept")

    added = {"name": "add", "family": "generic", "namespace": "add-ns",
             "path": str(tmp_path / "a" / "mnt" / "add")}
    d.mount_paths.append(Path(added["path"]))
    changed = dict(mounts[1], namespace="change-ns-2")
    write_config(d.config, root=d.root, state=d.state, defaults=FAST,
                 mounts=[mounts[0], changed, added], node={"on_demand": False})
    d.notify.messages.clear()
    d.proc.send_signal(signal.SIGHUP)
    d.notify.wait_for("READY", "1", proc=d.proc)
    assert d.notify.messages[0].get("RELOADING") == "1"
    wait_until(lambda: "reloaded" in d.log(), "the reload's line", proc=d.proc)
    assert "drop removed; change changed; add added" in d.log()

    after = _pids(d)
    assert set(after) == {"keep", "change", "add"}
    assert after["keep"] == before["keep"]  # untouched: the same process serves on
    assert after["change"] != before["change"]
    assert not mounted(paths["drop"])
    assert {m["namespace"] for m in d.status()} == {"keep-ns", "change-ns-2", "add-ns"}
    (Path(added["path"]) / "n.bin").write_bytes(b"new mount")
    wait_until(lambda: d.published("add-ns") == {"n.bin"}, "the new mount publishes",
               proc=d.proc)
    assert (paths["keep"] / "k.bin").read_bytes() == b"kept"

    # a bad file: one line, casfsd serves on with what it had
    d.config.write_text(d.config.read_text() + "\n[node]\nbogus = 1\n")
    d.notify.messages.clear()
    d.proc.send_signal(signal.SIGHUP)
    d.notify.wait_for("READY", "1", proc=d.proc)
    wait_until(lambda: "reload refused" in d.log(), "the refusal", proc=d.proc)
    assert _pids(d) == after and d.proc.poll() is None
    assert d.terminate() == 0


@pytest.mark.fuse
@pytest.mark.slow
def test_watchdog_pings_only_while_casfsd_is_not_wedged(
        daemons: Callable[..., Daemon], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")  # 2 s: a ping every 0.5 s
    d = daemons("a", [{"name": "m", "family": "generic", "namespace": "m-ns"}],
                node={"on_demand": False})
    assert d.proc is not None and d.notify is not None

    def pings() -> int:
        return sum(1 for m in list(d.notify.messages) if m.get("WATCHDOG") == "1")

    wait_until(lambda: pings() >= 3, "WATCHDOG=1 pings", proc=d.proc)
    os.kill(d.proc.pid, signal.SIGSTOP)  # wedged: every thread stops
    try:
        time.sleep(0.6)
        n = pings()
        time.sleep(2.5)
        assert pings() == n, "pinged while stopped"
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    wait_until(lambda: pings() >= n + 2, "pings again after SIGCONT", proc=d.proc)
    assert d.terminate() == 0


def test_the_unit_reloads_and_declares_a_watchdog() -> None:
    from .test_unit_file import unit_settings

    s = unit_settings()
    assert s["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert int(s["WatchdogSec"]) >= 10
    assert "TimeoutAbortSec" in s
