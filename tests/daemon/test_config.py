"""casfsd config loading in-process: precedence, conversions, zero-config; sd_notify."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest

from casfs.daemon import config as dconfig
from casfs.daemon.notify import Notifier
from casfs.errors import ConfigError


def write(tmp: Path, text: str) -> Path:
    p = tmp / "casfs.toml"
    p.write_text(text)
    return p


def minimal(tmp: Path, extra: str = "", mount_extra: str = "") -> str:
    return (f'[store]\nroot = "{tmp}/root"\n[node]\nstate_dir = "{tmp}/state"\n{extra}\n'
            f'[[mounts]]\nname = "kern"\nnamespace = "kern-ns"\n{mount_extra}\n')


def test_defaults_then_file_then_flags(tmp_path: Path) -> None:
    p = write(tmp_path, minimal(tmp_path, extra='[log]\nlevel = "warning"\n'
                                              "[defaults]\npublish_interval = 7\n",
                                mount_extra='refresh_interval = 3\nmode = "overlay"\n'
                                            "wait_warm = 45"))
    cfg = dconfig.load(p)
    (m,) = cfg.mount_configs()
    assert m.publish_interval == 7.0  # [defaults] from the file
    assert m.refresh_interval == 3.0  # the mount's own setting wins over [defaults]
    assert m.stable_after == 2.0  # built-in default
    assert m.allow_other is True
    assert m.mode == "overlay" and m.wait_warm == 45.0  # overlay: READY waits for the hot set
    assert m.mountpoint == cfg.mount_base / "kern"
    assert m.family == "generic" and m.namespace == "kern-ns"
    assert cfg.log_level == "warning" and cfg.metrics_listen is None
    flags = dconfig.Overrides(root=str(tmp_path / "other-root"), log_level="debug",
                              metrics_listen=":9999")
    cfg2 = dconfig.load(p, flags)
    assert cfg2.root == tmp_path / "other-root"
    assert cfg2.log_level == "debug"
    assert cfg2.metrics_listen == ("127.0.0.1", 9999)
    assert cfg2.state_dir == cfg.state_dir  # not given on the command line: the file's


@pytest.mark.parametrize(("text", "n"), [
    (1024, 1024), ("20GiB", 20 << 30), ("500M", 500 << 20), ("1.5T", int(1.5 * (1 << 40))),
    ("2GB", 2_000_000_000), ("10 KiB", 10 << 10),
])
def test_byte_sizes(text: object, n: int) -> None:
    assert dconfig.as_bytes(text, "k") == n


@pytest.mark.parametrize("bad", ["lots", -1, 0, True, "5X", 1.5])
def test_bad_byte_sizes(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"^k: "):
        dconfig.as_bytes(bad, "k")


@pytest.mark.parametrize(("key", "value"), [
    ("fetch_timeout", "nan"), ("fetch_timeout", "inf"), ("publish_interval", "nan"),
    ("refresh_interval", "-inf"), ("stable_after", "nan"), ("wait_warm", "inf"),
    ("shutdown_timeout", "inf")])
def test_seconds_are_finite(tmp_path: Path, key: str, value: str) -> None:
    """TOML has nan and inf. publish_interval = nan crash-looped the mount worker (a
    trio ValueError), fetch_timeout = nan turned sharing off without a word, and
    fetch_timeout = inf let an open wait forever: each is now one line at load."""
    p = write(tmp_path, minimal(tmp_path, mount_extra=f"{key} = {value}"))
    with pytest.raises(ConfigError, match=rf"mounts\[0\]\.{key}: expected a finite number"):
        dconfig.load(p)


def test_cache_cap_is_node_wide(tmp_path: Path) -> None:
    text = minimal(tmp_path).replace("[node]\n", '[node]\ncache_max_bytes = "3GiB"\n')
    text += '[[mounts]]\nname = "two"\nnamespace = "two-ns"\n'
    cfg = dconfig.load(write(tmp_path, text))
    assert [m.cache_max_bytes for m in cfg.mount_configs()] == [3 << 30, 3 << 30]


def test_zero_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASFS_ROOT", str(tmp_path / "r"))
    monkeypatch.setenv("CASFS_STATE_DIR", str(tmp_path / "s"))
    monkeypatch.setenv("CASFS_MOUNT_BASE", str(tmp_path / "m"))
    cfg = dconfig.load(None)
    assert [(m.name, m.family) for m in cfg.mounts] == [("triton", "triton"),
                                                        ("inductor", "inductor")]
    assert cfg.mounts[0].path == tmp_path / "m" / "triton"
    assert cfg.mounts[0].namespace.startswith("triton-")
    assert cfg.root == tmp_path / "r"


@pytest.mark.parametrize("abstract", [False, True])
def test_notify_datagrams(tmp_path: Path, abstract: bool) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"casfs-test-{uuid.uuid4().hex}"
        s.bind("\0" + name)
        address = "@" + name
    else:
        address = str(tmp_path / "n.sock")
        s.bind(address)
    s.settimeout(30)
    n = Notifier(address)
    try:
        assert n.enabled
        assert n.ready("2/2 mounts\nup")
        assert s.recv(4096) == b"READY=1\nSTATUS=2/2 mounts up"
        assert n.stopping()
        assert s.recv(4096).startswith(b"STOPPING=1\n")
    finally:
        n.close()
        s.close()


def test_notify_without_socket_is_a_noop() -> None:
    n = Notifier(None)
    assert not n.enabled
    assert n.ready("x") is False


def test_retention_setting_drops_unused_files(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from casfs.daemon.main import retention_once
    from casfs.store import reads
    from casfs.store.entry import Entry
    from casfs.store.root import SharedRoot

    text = minimal(tmp_path).replace("[node]", "unused_for_days = 7\n[node]")
    cfg = dconfig.load(write(tmp_path, text))
    assert cfg.unused_for_days == 7.0 and cfg.retention_interval == 86400.0
    assert dconfig.load(write(tmp_path, minimal(tmp_path))).unused_for_days == 0.0
    with pytest.raises(ConfigError, match="unused_for_days"):
        dconfig.load(write(tmp_path, minimal(tmp_path).replace(
            "[node]", "unused_for_days = -1\n[node]")))
    root = SharedRoot.open(tmp_path / "root", create=True)
    entries = []
    for name in ("used", "unused"):
        put = root.objects.put_bytes(name.encode())
        entries.append(Entry(name, put.digest, put.size, 0o644, 1))
    t0 = time.time()
    monkeypatch.setattr("casfs.store.generations.time.time", lambda: t0 - 30 * 86400)
    root.generations().publish("ns", entries, node="a")
    monkeypatch.undo()
    reads.record(root.backend, "ns", "b", ["used"], t0 - 86400)
    assert retention_once(cfg) == {"ns": ["unused"]}
    assert list(root.generations().entries("ns").entries) == ["used"]


def test_jobs_socket_bounds(tmp_path: Path) -> None:
    """[jobs]: per-tenant bounds at the jobs socket (docs/security.md), refused when
    they would let one tenant take everything."""
    cfg = dconfig.load(write(tmp_path, minimal(tmp_path)))
    assert cfg.jobs == dconfig.JobsLimits()
    assert cfg.jobs.namespaces_per_tenant == 32 and cfg.jobs.request_timeout == 10.0
    cfg = dconfig.load(write(tmp_path, minimal(tmp_path, "[jobs]\nnamespaces_per_tenant = 4\n"
                                                         "request_timeout = 2.5\n")))
    assert cfg.jobs.namespaces_per_tenant == 4 and cfg.jobs.request_timeout == 2.5
    for bad, msg in (("workers = 0", "jobs.workers: must be at least 1"),
                     ("leases_per_tenant = 1.5", "jobs.leases_per_tenant: expected an integer"),
                     ("request_timeout = 0", "jobs.request_timeout: must be greater than 0"),
                     ("workers = 2\nrequests_per_tenant = 3", "more than jobs.workers"),
                     ("connections = 8", "more than jobs.connections"),
                     ("threads = 3", "jobs.threads: unknown key")):
        with pytest.raises(ConfigError, match=msg):
            dconfig.load(write(tmp_path, minimal(tmp_path, f"[jobs]\n{bad}\n")))
