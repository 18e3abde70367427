"""Corrupted objects of every kind, in the shared root and in the local object cache.

I1: no wrong byte reaches a reader (CLI or job). I2: the job sees ENOENT or the
correct bytes. I4: nothing blocks (a FIFO or directory is never opened
blocking). The operator sees the object named by `casfs verify` and heals it
with `casfs import` of the same files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from casfs.store.objects import object_key
from casfs.store.root import SharedRoot
from tests.faults.conftest import CORRUPTIONS, corrupt

pytestmark = pytest.mark.expect_log(
    r"rejected object: ",
    r"repaired damaged object ",
    r"unavailable, serving a miss: ",
    r"cached object .*(does not hash to its name|bytes, expected|is not a regular file)",
    r": reading its loose copy",
    r"pack \w+ is damaged or unreadable",
)


def _seed(src: Path) -> dict[str, bytes]:
    files = {f"k/{kind}": (kind.encode() + b"-payload ") * 500 for kind in CORRUPTIONS}
    files["k/good"] = b"good bytes " * 300
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    return files


def _damage_all(root_path: Path, kinds: tuple[str, ...] = CORRUPTIONS) -> dict[str, str]:
    snap = SharedRoot.open(root_path).generations().entries("ns").entries
    good = root_path / object_key(snap["k/good"].digest)
    digests = {}
    for kind in kinds:
        d = snap[f"k/{kind}"].digest
        corrupt(root_path / object_key(d), kind, good)
        digests[kind] = d
    return digests


def test_cli_rejects_reports_and_repairs(
    cli: Callable[..., Any], casfs_env: dict[str, Path], tmp_path: Path
) -> None:
    """I1, I4 through the CLI: cat/export refuse, verify names each, import heals them."""
    src = tmp_path / "src"
    files = _seed(src)
    cli("import", src, "-n", "ns", check=True)
    digests = _damage_all(casfs_env["root"])
    for kind in CORRUPTIONS:
        res = cli("cat", "ns", f"k/{kind}", timeout=30)  # a FIFO used to hang here
        assert res.rc != 0 and res.out == "" and "Traceback" not in res.err, kind
    assert cli("cat", "ns", "k/good", check=True).out.encode() == files["k/good"]
    ver = cli("verify", "--json", timeout=30).json()
    assert ver["ok"] is False
    for kind, digest in digests.items():
        assert any(digest in p for p in ver["problems"]), (kind, ver)
    dest = tmp_path / "out"
    exp = cli("export", "ns", dest, timeout=30)
    assert exp.rc == 1
    for kind in CORRUPTIONS:
        assert f"failed: k/{kind}" in exp.err and not (dest / "k" / kind).exists()
    assert (dest / "k/good").read_bytes() == files["k/good"]
    cli("import", src, "-n", "ns", check=True, timeout=30)  # the documented repair
    assert cli("verify", "--json", timeout=30).json()["ok"] is True
    for rel, data in files.items():
        assert cli("cat", "ns", rel, check=True).out.encode() == data, rel


@pytest.mark.fuse
def test_job_sees_a_miss_for_every_corrupt_object(cluster: dict[str, Any],
                                                  tmp_path: Path) -> None:
    """I1, I2, I4 through a real mount: each damaged object is ENOENT at once."""
    src = tmp_path / "src"
    files = _seed(src)
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(cluster["root"]),
                        "--state-dir", str(tmp_path / "seed-state"), "import", str(src),
                        "-n", "ns"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    _damage_all(cluster["root"])
    b = cluster["b"]
    w = b.mount(namespace="ns", fetch_timeout=30.0)
    mp = w.cfg.mountpoint
    for kind in CORRUPTIONS:
        # `cat` in a subprocess with a timeout: a hang fails the test instead of stalling it.
        res = subprocess.run(["cat", str(mp / "k" / kind)], capture_output=True, timeout=20,
                             check=False)
        assert res.returncode != 0 and res.stdout == b"", (kind, res.stdout[:80])
        assert b"No such file" in res.stderr, (kind, res.stderr)
    assert (mp / "k" / "good").read_bytes() == files["k/good"]
    c = b.ask(w, "stats")["counters"]
    assert c.get("fetch_timeouts", 0) == 0
    assert c["rejections"] >= len(CORRUPTIONS)


@pytest.mark.fuse
def test_damaged_local_cache_files_are_refetched(cluster: dict[str, Any],
                                                 tmp_path: Path) -> None:
    """I1, I4 for the node's object cache: a non-regular, torn or bit-flipped cached file
    is refetched (a bit flip keeps the size: found by hashing on the mount's first open)."""
    src = tmp_path / "src"
    files = _seed(src)
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(cluster["root"]),
                        "--state-dir", str(tmp_path / "seed-state"), "import", str(src),
                        "-n", "ns"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    b = cluster["b"]
    w = b.mount(namespace="ns")
    for rel, data in files.items():
        assert (w.cfg.mountpoint / rel).read_bytes() == data  # now in b's object cache
    b.stop(w)
    snap = SharedRoot.open(cluster["root"]).generations().entries("ns").entries
    cache = b.state / "objects"
    kinds = ("bitflip", "truncate", "zero", "symlink", "fifo", "directory")
    victim = tmp_path / "victim"
    victim.write_bytes(b"not the cached bytes " * 200)
    for kind in kinds:
        d = snap[f"k/{kind}"].digest
        corrupt(cache / d[:2] / d[2:], kind, victim)
    w = b.mount(namespace="ns")
    for kind in kinds:
        res = subprocess.run(["cat", str(w.cfg.mountpoint / "k" / kind)], capture_output=True,
                             timeout=20, check=False)
        assert res.returncode == 0 and res.stdout == files[f"k/{kind}"], (kind, res.stderr)
    assert victim.read_bytes() == b"not the cached bytes " * 200  # never written through
    assert b.ask(w, "stats")["counters"]["cache_damaged"] == 1  # the bit flip


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_backend_never_follows_or_blocks(kind: str, tmp_path: Path) -> None:
    """I4: every backend read (whole objects, pack ranges, records) refuses non-files at once."""
    from casfs.store.backend import LocalBackend, NotRegularFileError

    backend = LocalBackend(tmp_path)
    target = tmp_path / "objects" / "ab" / "cd"
    target.parent.mkdir(parents=True)
    (tmp_path / "victim").write_bytes(b"secret")
    target.write_bytes(b"x")
    corrupt(target, kind, tmp_path / "victim")
    with pytest.raises(NotRegularFileError):
        backend.open("objects/ab/cd")
    with pytest.raises(NotRegularFileError):
        backend.read_range("objects/ab/cd", 0, 3)


@pytest.mark.fuse
@pytest.mark.parametrize("kind", ["bitflip", "truncate", "fifo", "directory"])
def test_damaged_pack_is_reported_and_repaired_by_import(
    kind: str, cluster: dict[str, Any], tmp_path: Path
) -> None:
    """I1, I4 for packed objects: a damaged pack is a miss (CLI and mount), verify names it,
    and `casfs import` of the same files (packs on or off) repairs it: rows are immutable
    and keep naming the pack, so the import writes the members loose and every reader
    (cat, export, verify, a mount's fetch) reads the verified loose copy. Before, import
    trusted the pack (packs on: "already stored") or wrote loose copies nobody read."""
    from casfs.store.packs import pack_key

    src = tmp_path / "src"
    files = {f"p/{i}": f"packed member {i} ".encode() * 40 for i in range(6)}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    root = cluster["root"]

    def cli(*args: str | Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(root),
                               "--state-dir", str(tmp_path / "cli-state"), *map(str, args)],
                              capture_output=True, text=True, timeout=timeout, check=False)

    assert cli("import", "--packs", src, "-n", "ns").returncode == 0
    snap = SharedRoot.open(root).generations().entries("ns").entries
    (pack,) = {e.extras["pack"][0] for e in snap.values() if e.extras}
    victim = tmp_path / "victim"
    victim.write_bytes(b"x" * 100)
    target = root / pack_key(pack)
    if kind == "bitflip":  # inside the first member (conftest's flips the footer's last byte)
        data = bytearray(target.read_bytes())
        data[20] ^= 1
        target.chmod(0o644)
        target.write_bytes(bytes(data))
    else:
        corrupt(target, kind, victim)
    failed = 0
    for rel, data in files.items():  # each a miss or its own bytes (a truncation spares some)
        res = cli("cat", "ns", rel)
        assert "Traceback" not in res.stderr
        assert (res.returncode, res.stdout.encode()) in ((0, data), (3, b"")), (rel, res)
        failed += res.returncode != 0
    assert failed or kind == "truncate"  # half a pack of tiny members still holds them
    ver = cli("verify", "--json")
    assert ver.returncode == 1 and any(pack in p for p in json.loads(ver.stdout)["problems"])
    # The repair: packs on for half the kinds, the POSIX default (off) for the others.
    packs = "--packs" if kind in ("bitflip", "fifo") else "--no-packs"
    assert cli("import", packs, src, "-n", "ns").returncode == 0
    ver = cli("verify", "--json")
    assert ver.returncode == 0, ver.stdout
    for rel, data in files.items():
        out = cli("cat", "ns", rel)
        assert out.returncode == 0 and out.stdout.encode() == data, (rel, out.stderr)
    w = cluster["b"].mount(namespace="ns")  # a fresh node: every read is a cold fetch
    for rel, data in files.items():
        assert (w.cfg.mountpoint / rel).read_bytes() == data, rel
