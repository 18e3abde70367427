"""A large file into an S3 root (real SeaweedFS): streamed up in parts with bounded memory,
read back whole, and an upload cut half-way leaves the store as it was."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import pytest

from casfs.store import s3backend
from casfs.store.objects import object_key
from casfs.store.root import SharedRoot

Cli = Callable[..., Any]
MIB = 1 << 20
BIG = 96 * MIB  # incompressible: stored as large as it is


@pytest.fixture
def s3_cli(cli: Cli, s3_url: str, monkeypatch: pytest.MonkeyPatch) -> Cli:
    monkeypatch.setenv("CASFS_ROOT", s3_url)
    cli("init", s3_url, check=True)
    return cli


def _random_file(path: Path, size: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    h = blake3.blake3()
    with open(path, "wb") as f:
        for _ in range(size // MIB):
            chunk = os.urandom(MIB)
            h.update(chunk)
            f.write(chunk)
    return h.hexdigest()


def _import(src: Path, ns: str, **env: str) -> tuple[int, int, str]:
    """(exit status, peak RSS in bytes, stderr) of a ``casfs import`` in its own process."""
    p = subprocess.Popen([sys.executable, "-m", "casfs.cli.main", "import", str(src), "-n", ns],
                         env=dict(os.environ, **env), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    assert p.stderr is not None
    err = p.stderr.read().decode()
    _, status, usage = os.wait4(p.pid, 0)  # this child's own peak, not the session's
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, usage.ru_maxrss * 1024, err


def _uploads(seaweed_server: Any, prefix: str) -> list[str]:
    """Incomplete multipart uploads under ``prefix``."""
    import boto3
    from seaweed import ACCESS_KEY, SECRET_KEY

    c = boto3.client("s3", endpoint_url=seaweed_server.endpoint, aws_access_key_id=ACCESS_KEY,
                     aws_secret_access_key=SECRET_KEY, region_name="us-east-1")
    got = c.list_multipart_uploads(Bucket="casfs-test", Prefix=prefix + "/")
    return [u["Key"] for u in got.get("Uploads", [])]


def test_a_large_import_streams_with_bounded_memory(s3_cli: Cli, s3_url: str,
                                                    tmp_path: Path) -> None:
    small = tmp_path / "small"
    (small / "f").parent.mkdir(parents=True)
    (small / "f").write_bytes(b"small file\n")
    rc, base_rss, err = _import(small, "small")
    assert rc == 0, err
    src = tmp_path / "big"
    digest = _random_file(src / "model.bin", BIG)
    rc, rss, err = _import(src, "big")
    assert rc == 0, err
    # Was: the whole stored object in memory for its PUT (~ +100 MiB here, 286 MiB ->
    # ~342 MB peak). Parts: 8 MiB x (2 in flight + 1 filling).
    assert rss - base_rss < 40 * MIB, (rss / MIB, base_rss / MIB)
    root = SharedRoot.open(s3_url)
    info = root.objects.backend.info(object_key(digest))
    assert info is not None and info.size >= BIG  # stored loose, under its content's name
    out = tmp_path / "out.bin"
    with open(out, "wb") as f:
        r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "cat", "big", "model.bin"],
                           stdout=f, stderr=subprocess.PIPE, timeout=300, check=False)
    assert r.returncode == 0, r.stderr.decode()
    assert out.stat().st_size == BIG
    with open(out, "rb") as f:
        h = blake3.blake3()
        while chunk := f.read(MIB):
            h.update(chunk)
    assert h.hexdigest() == digest
    v = s3_cli("verify", "--json", check=True).json()
    assert v["problems"] == []


def test_an_upload_cut_half_way_leaves_no_object(s3_cli: Cli, s3_url: str, tmp_path: Path,
                                                 seaweed_server: Any) -> None:
    src = tmp_path / "big"
    digest = _random_file(src / "model.bin", 48 * MIB)
    # killed (SIGKILL) after three parts went out: a multipart upload left open
    rc, _, err = _import(src, "big", CASFS_CRASHPOINT="s3-part-sent",
                         CASFS_CRASHPOINT_AFTER="3")
    assert rc == -9, err
    root = SharedRoot.open(s3_url)
    key = object_key(digest)
    prefix = s3_url.split("?")[0].split("/", 3)[3]
    assert f"{prefix}/{key}" in _uploads(seaweed_server, prefix)  # it was cut mid-upload
    assert root.objects.backend.info(key) is None  # and nothing of it is visible
    assert s3_cli("verify", "--json", check=True).json()["problems"] == []
    assert s3_cli("ls", "big").rc != 0  # nothing published
    rc, _, err = _import(src, "big")  # the retry goes through
    assert rc == 0, err
    assert root.objects.verify(digest, 48 * MIB) == 48 * MIB
    assert s3_cli("verify", "--json", check=True).json()["problems"] == []


def test_a_failed_upload_is_aborted(s3_url: str, tmp_path: Path, seaweed_server: Any,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """An error in the middle of the parts (here injected after the second): the upload
    is aborted, no object appears, the caller gets an OSError and the next put succeeds."""
    backend = SharedRoot.open(s3_url, create=True).objects.backend
    calls = []

    def fail_third(step: str) -> None:
        calls.append(step)
        if len(calls) == 3:
            raise RuntimeError("injected: the connection dropped")

    monkeypatch.setattr(s3backend, "crashpoint", fail_third)
    staged = tmp_path / "staged"
    _random_file(staged, 40 * MIB)
    data = staged.read_bytes()
    key = "objects/ab/" + "c" * 62
    with pytest.raises(OSError, match="injected"):
        backend.put_if_absent(key, staged)
    prefix = s3_url.split("?")[0].split("/", 3)[3]
    assert backend.info(key) is None
    assert _uploads(seaweed_server, prefix) == []  # aborted, not left open
    staged.write_bytes(data)
    assert backend.put_if_absent(key, staged)  # a retry goes through
    staged.write_bytes(data)
    assert not backend.put_if_absent(key, staged)  # create-only: there now
    with backend.open(key) as f:
        assert f.read() == data
