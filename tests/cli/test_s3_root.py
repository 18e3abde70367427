"""A shared root on a real S3 server (SeaweedFS): every store command, the create-only probe,
and credentials kept out of every output."""

from __future__ import annotations

import filecmp
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from seaweed import SECRET_KEY

from casfs.errors import StoreFormatError
from casfs.store.backend import LocalBackend
from casfs.store.root import SharedRoot, probe_create_only
from cli.test_store_cli import make_src

Cli = Callable[..., Any]


@pytest.fixture
def s3_cli(cli: Cli, s3_url: str, monkeypatch: pytest.MonkeyPatch) -> Cli:
    monkeypatch.setenv("CASFS_ROOT", s3_url)
    return cli


def _no_secret(*outputs: str) -> None:
    for out in outputs:
        assert SECRET_KEY not in out


def test_every_store_command_on_s3(s3_cli: Cli, s3_url: str, tmp_path: Path) -> None:
    r = s3_cli("init", s3_url, check=True)
    assert s3_url.split("?")[0] in r.out
    s3_cli("init", check=True)  # idempotent
    src = make_src(tmp_path / "src")
    r1 = s3_cli("import", src, "-n", "ns", check=True)
    (src / "added.txt").write_bytes(b"second generation\n")
    r2 = s3_cli("import", src, "-n", "ns", check=True)
    outs = [r1.out, r1.err, r2.out, r2.err]
    assert s3_cli("namespaces", "--json", check=True).json()[0]["namespace"] == "ns"
    gens = s3_cli("generations", "ns", "--json", check=True).json()
    assert [g["seq"] for g in gens] == [1, 2]
    ls = s3_cli("ls", "ns", "-r", "--json", check=True).json()
    assert "added.txt" in {e["path"] for e in ls}
    cat = s3_cli("cat", "ns", "ab/cab12.py", check=True)
    assert cat.out == (src / "ab/cab12.py").read_text()
    diff = s3_cli("diff", "ns@1", "ns@2", "--json", check=True)
    assert "added.txt" in diff.out
    dest = tmp_path / "out"
    s3_cli("export", "ns", dest, check=True)
    assert filecmp.cmp(src / "ab/cab12.so", dest / "ab/cab12.so", shallow=False)
    du = s3_cli("du", "--json", check=True).json()
    assert du["files"] == 7 and du["stored_bytes"] > 0
    v = s3_cli("verify", "--json", check=True).json()
    assert v["problems"] == [] and v["generations"] == 2
    s3_cli("pin", "ns@1", "golden", check=True)
    gc = s3_cli("gc", "--keep", "1", "--grace", "0", "--json", check=True).json()
    assert gc["removed_generations"] == []  # ns@1 is pinned, ns@2 the newest
    s3_cli("unpin", "ns", "golden", check=True)
    doc = s3_cli("doctor", "--json")
    checks = {c["check"]: c for c in doc.json()}
    assert checks["shared_root"]["status"] == "ok", checks["shared_root"]
    assert "create-only writes honoured" in checks["shared_root"]["detail"]
    outs += [du and str(du), str(v), str(gc), doc.out, doc.err]
    _no_secret(*outs)


def test_wrong_secret_is_one_clean_line_without_the_secret(
    s3_cli: Cli, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_cli("init", s3_url, check=True)
    wrong = "wrong-" + SECRET_KEY[::-1]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    r = s3_cli("namespaces")
    line = r.assert_clean_error()
    assert "s3://" in line
    _no_secret(r.out, r.err)
    assert wrong not in r.out + r.err


def test_missing_root_and_bad_urls(s3_cli: Cli, s3_url: str) -> None:
    r = s3_cli("ls", "ns")
    assert "casfs init" in r.assert_clean_error()
    r = s3_cli("--root", "s3://Bad_Bucket/x", "namespaces")
    assert "bucket" in r.assert_clean_error()
    r = s3_cli("--root", "s3://casfs-test/x?endpoint=ftp://h", "namespaces")
    assert "endpoint" in r.assert_clean_error()
    r = s3_cli("--root", "s3://key:secret@casfs-test/x", "namespaces")
    assert "credentials" in r.assert_clean_error()


class _CheckThenPut(LocalBackend):
    """A server that checks, then puts: racing creates of one key all 'succeed'."""

    def create_exclusive(self, key: str, data: bytes) -> bool:
        import time

        existed = self.info(key) is not None
        time.sleep(0.05)  # the window a real check-then-put server has
        if existed:
            return False
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return True


def test_probe_refuses_a_server_that_checks_then_puts(tmp_path: Path) -> None:
    backend = _CheckThenPut(tmp_path)
    (tmp_path / "tmp").mkdir()
    # two *sequential* creates would pass: only racing ones show the problem
    assert backend.create_exclusive("seq/a", b"1") and not backend.create_exclusive("seq/a", b"2")
    with pytest.raises(StoreFormatError, match="does not honour create-only"):
        probe_create_only(backend, "test-root")


def test_probe_accepts_seaweedfs(s3_url: str) -> None:
    root = SharedRoot.open(s3_url, create=True)
    probe_create_only(root.backend, s3_url)
    for run in root.backend.list("probes"):  # cleaned up (SeaweedFS may keep empty "dirs")
        assert list(root.backend.list(f"probes/{run}")) == []


def test_endpoint_and_credentials_from_an_aws_profile(s3_url: str, seaweed_server: Any,
                                                      tmp_path: Path) -> None:
    """The standard AWS config chain: a profile in ~/.aws/config with its endpoint_url and
    region, its keys in ~/.aws/credentials, nothing in the environment or the URL. The
    profile's endpoint used to be ignored (requests went to AWS itself)."""
    import os
    import subprocess
    import sys

    from seaweed import ACCESS_KEY

    url = s3_url.split("?")[0]  # no endpoint option
    (tmp_path / "config").write_text(
        f"[profile casfs]\nregion = us-east-1\nendpoint_url = {seaweed_server.endpoint}\n")
    (tmp_path / "credentials").write_text(
        f"[casfs]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"AWS_PROFILE": "casfs", "AWS_CONFIG_FILE": str(tmp_path / "config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
            "CASFS_STATE_DIR": str(tmp_path / "state")}
    for args in (["init", url], ["--root", url, "doctor", "--json"]):
        r = subprocess.run([sys.executable, "-m", "casfs.cli.main", *args], env=env,
                           capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
    checks = {c["check"]: c for c in json.loads(r.stdout)}
    assert checks["shared_root"]["status"] == "ok", checks["shared_root"]
    assert SECRET_KEY not in r.stdout + r.stderr
