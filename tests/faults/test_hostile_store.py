"""Hostile and half-written records and manifests: nested, truncated, huge, bombs, young.

I2: the job sees ENOENT or correct bytes. I3: the newest generation stays
complete (nothing is published over entries a node could not read).
I4: nothing blocks. The operator sees one clean line and a counter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from casfs.errors import HostileManifestError, PublishDeferredError
from casfs.store import manifest
from casfs.store.entry import Entry
from casfs.store.generations import parse_record, seq_name
from casfs.store.objects import digest_bytes
from casfs.store.root import SharedRoot

pytestmark = pytest.mark.expect_log(
    r"skipping (damaged|unresolved|over-limit) .*generation",
    r"cannot read pack locations",
    r"publishing without a profile",
    r"skipping incomplete commit record",
    r"not visible yet \(.*\); publication waits",
    r"over the object size limit",
)


def _record_path(root: Path, seq: int, ns: str = "ns") -> Path:
    return root / f"namespaces/{ns}/generations/{seq_name(seq)}"


def _import(root: Path, state: Path, src: Path, ns: str = "ns") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(root),
                           "--state-dir", str(state), "import", str(src), "-n", ns],
                          capture_output=True, text=True, timeout=120, check=False)


def _src(tmp: Path, files: dict[str, bytes]) -> Path:
    src = tmp / "src"
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    return src


def test_record_truncated_at_every_offset_is_damage(root: SharedRoot) -> None:
    """I3: every prefix of a record or manifest is rejected as damage, nothing else."""
    e = root.objects.put_bytes(b"x")
    root.generations().publish("ns", [Entry(f"d/f{i}", e.digest, 1, 0o644, i) for i in range(3)],
                               node="n", options={"tenant": "t"})
    data = _record_path(root.path, 1).read_bytes()
    rec = root.generations().record("ns", 1)
    assert rec.base is not None
    mdata = root.objects.get_bytes(rec.base.digest)
    for cut in range(len(data)):
        if data[:cut].strip() == data.strip():
            continue
        with pytest.raises(HostileManifestError):
            parse_record(data[:cut], "ns", 1)
    for cut in range(len(mdata)):
        with pytest.raises(HostileManifestError):
            manifest.decode(mdata[:cut])


def test_nested_record_is_skipped_everywhere(cli: Callable[..., Any],
                                             casfs_env: dict[str, Path], tmp_path: Path) -> None:
    """Issue 8 item 1 (I3): 200 KB of '[' as the newest record is damage, not a traceback."""
    src = _src(tmp_path, {"a": b"a"})
    cli("import", src, "-n", "ns", check=True)
    _record_path(casfs_env["root"], 2).write_bytes(b"[" * 200_000)
    gens = cli("generations", "ns")
    assert gens.rc == 0 and "nested too deeply" in gens.err and "Traceback" not in gens.err
    ver = cli("verify")
    assert ver.rc == 1 and "ns@2" in ver.out and "Traceback" not in ver.err
    (src / "b").write_bytes(b"b")
    cli("import", src, "-n", "ns", check=True)  # publishes seq 3 over the damaged 2
    assert {e["path"] for e in cli("ls", "ns", "--json", check=True).json()} == {"a", "b"}
    assert _record_path(casfs_env["root"], 3).exists()


@pytest.mark.fuse
def test_nested_record_mount_serves_and_publishes(cluster: dict[str, Any],
                                                  tmp_path: Path) -> None:
    """Issue 8 item 1 through a mount (I2, I3): the mount starts and serves the newest good."""
    root = cluster["root"]
    assert _import(root, tmp_path / "seed", _src(tmp_path, {"a": b"A"})).returncode == 0
    _record_path(root, 2).write_bytes(b"[" * 200_000)
    b = cluster["b"]
    w = b.mount(namespace="ns")
    assert (w.cfg.mountpoint / "a").read_bytes() == b"A"
    (w.cfg.mountpoint / "new").write_bytes(b"N")
    out = b.ask(w, "publish")
    assert out["ok"] is True and out["seq"] == 3, out
    snap = SharedRoot.open(root).generations().entries("ns")
    assert {p: e.size for p, e in snap.entries.items()} == {"a": 1, "new": 1}
    assert b.ask(w, "stats")["counters"]["bad_generations"] >= 1


@pytest.mark.fuse
def test_nested_record_through_casfs_run(cli: Callable[..., Any], casfs_env: dict[str, Path],
                                         tmp_path: Path) -> None:
    """Issue 8 item 1 through `casfs run` (I2, I3): its mount process checks each record's
    tenant before parsing it, and that check let the RecursionError out: the lease was
    refused and every job of the namespace got a private, empty cache. Now the job is
    served the newest good generation and its file lands as N+1."""
    src = _src(tmp_path, {"a": b"A"})
    cli("import", src, "-n", "ns", check=True)
    _record_path(casfs_env["root"], 2).write_bytes(b"[" * 200_000)
    env = dict(os.environ, CASFS_MOUNT_BASE=str(tmp_path / "mnt"))
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
                        "-n", "ns", "--stable-after", "0.2", "--", "/bin/sh", "-c",
                        'cat "$CASFS_CACHE_DIR/a" && echo N > "$CASFS_CACHE_DIR/new"'],
                       env=env, capture_output=True, text=True, timeout=180, check=False)
    assert r.returncode == 0 and r.stdout == "A", (r.stdout, r.stderr)
    assert "private and temporary" not in r.stderr, r.stderr
    assert {e["path"] for e in cli("ls", "ns", "--json", check=True).json()} == {"a", "new"}
    assert _record_path(casfs_env["root"], 3).exists()


def test_nested_triton_group_file_is_skipped(cli: Callable[..., Any], tmp_path: Path) -> None:
    """A job's Triton group file of 200 KB of '[' (a compiler bug, a hostile job) is an
    incomplete commit record, skipped like any other, not a RecursionError that fails
    `casfs import` (and every promotion round of the namespace)."""
    src = _src(tmp_path, {"KEY/__grp__k.json": b"[" * 200_000, "KEY/k.cubin": b"k"})
    res = cli("import", src, "-n", "tr", "--family", "triton")
    assert res.rc == 0 and "Traceback" not in res.err, res.err
    assert "incomplete commit record KEY/__grp__k.json" in res.err
    assert [e["path"] for e in cli("ls", "tr", "KEY", "--json", check=True).json()] == [
        "KEY/k.cubin"]


def _young_record_naming_a_missing_manifest(root: SharedRoot) -> bytes:
    """Record 2 = record 1 + a delta whose manifest object is not stored yet."""
    x = root.objects.put_bytes(b"X")
    delta = manifest.encode([Entry("x", x.digest, 1, 0o644, 1)], "delta")
    doc = json.loads(_record_path(root.path, 1).read_bytes())
    doc |= {"seq": 2, "parent": 1, "entries": doc["entries"] + 1,
            "deltas": [{"digest": digest_bytes(delta), "size": len(delta), "entries": 1}]}
    assert root.backend.create_exclusive(f"namespaces/ns/generations/{seq_name(2)}",
                                         json.dumps(doc).encode())
    return delta


def test_young_missing_manifest_serves_previous_and_defers(root: SharedRoot) -> None:
    """Issue 8 item 4 (I3): serve seq 1 meanwhile, never publish seq 3 on top of it."""
    a = root.objects.put_bytes(b"A")
    root.generations().publish("ns", [Entry("a", a.digest, 1, 0o644, 1)], node="n")
    delta = _young_record_naming_a_missing_manifest(root)
    gens = root.generations()
    newest, rec, snap = gens.newest_valid("ns")
    assert newest == 2 and rec is not None and rec.seq == 1 and set(snap.entries) == {"a"}
    b = root.objects.put_bytes(b"B")
    with pytest.raises(PublishDeferredError, match="waits until it resolves"):
        gens.publish("ns", [Entry("b", b.digest, 1, 0o644, 1)], node="n")
    assert gens.seqs("ns") == [1, 2]
    root.objects.put_bytes(delta)  # the manifest becomes visible: publication resumes
    res = gens.publish("ns", [Entry("b", b.digest, 1, 0o644, 1)], node="n")
    assert res.seq == 3
    assert set(root.generations().entries("ns").entries) == {"a", "x", "b"}


@pytest.mark.fuse
def test_young_missing_manifest_through_a_mount(cluster: dict[str, Any], tmp_path: Path) -> None:
    """Issue 8 item 4 through a mount (I2, I3): a fresh mount serves seq 1, defers, resumes."""
    root_path = cluster["root"]
    assert _import(root_path, tmp_path / "seed", _src(tmp_path, {"a": b"A"})).returncode == 0
    root = SharedRoot.open(root_path)
    delta = _young_record_naming_a_missing_manifest(root)
    b = cluster["b"]
    w = b.mount(namespace="ns")
    mp = w.cfg.mountpoint
    assert (mp / "a").read_bytes() == b"A"  # used to serve nothing for 10 minutes
    (mp / "mine").write_bytes(b"M")
    out = b.ask(w, "publish")
    assert out["ok"] is False and "deferred" in out["message"], out
    st = b.ask(w, "status")
    assert st["pending_publication"] == 1
    assert st["counters"]["publish_deferred"] >= 1
    root.objects.put_bytes(delta)
    out = b.ask(w, "publish")
    assert out["ok"] is True and out["seq"] == 3, out
    assert set(root.generations().entries("ns").entries) == {"a", "x", "mine"}
    assert (mp / "x").read_bytes() == b"X"  # the resolved generation is served too


_MAXRSS = r"""
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(r.returncode)
sys.stderr.write(r.stderr)
"""


def _rss_kb(args: list[str], env: dict[str, str]) -> tuple[int, int, str]:
    p = subprocess.run([sys.executable, "-c", _MAXRSS, sys.executable, "-m", "casfs.cli.main",
                        *args], capture_output=True, text=True, timeout=180, env=env, check=True)
    rss, rc = p.stdout.split()
    return int(rss), int(rc), p.stderr


@pytest.mark.slow
def test_manifest_bomb_is_refused_in_bounded_memory(casfs_env: dict[str, Path],
                                                     tmp_path: Path) -> None:
    """Issue 8 item 3 (I3, I4): an honest 13 KB -> 200 MiB manifest is refused unread."""
    root = SharedRoot.open(casfs_env["root"], create=True)
    a = root.objects.put_bytes(b"A")
    root.generations().publish("ns", [Entry("a", a.digest, 1, 0o644, 1)], node="n")
    bomb = tmp_path / "bomb.json"
    with open(bomb, "wb") as f:  # valid JSON: whitespace is allowed anywhere
        f.write(b'{"casfs_manifest": 1, "kind": "full", "entries": []')
        for _ in range(200):
            f.write(b" " * (1 << 20))
        f.write(b"}")
    m = root.objects.put_file(bomb)
    bomb.unlink()
    doc = json.loads(_record_path(root.path, 1).read_bytes())
    doc |= {"seq": 2, "parent": 1, "entries": 0, "deltas": [],
            "base": {"digest": m.digest, "size": m.size, "entries": 0}}
    _record_path(root.path, 2).write_text(json.dumps(doc))
    env = dict(os.environ)
    base_rss, rc, _ = _rss_kb(["ls", "ns@1"], env)
    assert rc == 0
    for args in (["ls", "ns"], ["verify"], ["import", str(_src(tmp_path, {"b": b"b"})), "-n",
                                            "ns"]):
        rss, rc, err = _rss_kb(args, env)
        # ls shows ns@1, as a mount serves it, with a warning naming ns@2
        # (tests/cli/test_damaged_newest.py); verify and import refuse.
        assert (rc == 0) == (args[0] == "ls") and "Traceback" not in err, (args, err)
        assert rss < base_rss + 32 * 1024, (args, rss, base_rss)  # not the 200 MiB
        if args[0] != "verify":
            assert "CASFS_MAX_MANIFEST_BYTES" in err, err
    assert root.generations().seqs("ns") == [1, 2]  # nothing published over it


@pytest.mark.fuse
def test_file_bomb_is_a_miss_without_filling_the_disk(cluster: dict[str, Any], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 8 item 3 (I2, I4): an object over CASFS_MAX_OBJECT_BYTES is a miss, unwritten."""
    files = {"big": bytes(4 << 20), "small": b"s" * 100}
    assert _import(cluster["root"], tmp_path / "seed", _src(tmp_path, files)).returncode == 0
    monkeypatch.setenv("CASFS_MAX_OBJECT_BYTES", str(1 << 20))  # the mount's limit: 1 MiB
    b = cluster["b"]
    w = b.mount(namespace="ns")
    mp = w.cfg.mountpoint
    with pytest.raises(FileNotFoundError):
        (mp / "big").read_bytes()
    assert (mp / "small").read_bytes() == files["small"]
    cached = sum(f.stat().st_size for f in (b.state / "objects").rglob("*") if f.is_file())
    assert cached < 1 << 20
    assert b.ask(w, "stats")["counters"]["rejections"] >= 1


def test_a_fifo_as_the_root_marker_never_blocks(cli: Callable[..., Any],
                                                 casfs_env: dict[str, Path],
                                                 tmp_path: Path) -> None:
    """I4: casfs.json replaced by a FIFO hung every command (ls, doctor) and every mount
    start on the root forever (a blocking open). Now it is a damaged marker: one line."""
    cli("import", _src(tmp_path, {"a": b"A"}), "-n", "ns", check=True)
    marker = casfs_env["root"] / "casfs.json"
    marker.unlink()
    os.mkfifo(marker)
    cli("ls", "ns", timeout=30).assert_clean_error()
    doc = cli("doctor", "--json", timeout=30)
    assert doc.rc == 1 and "Traceback" not in doc.err
    assert {c["check"]: c for c in doc.json()}["shared_root"]["status"] == "fail"


def test_a_record_planted_at_the_last_12_digit_seq_hides_nothing_from_gc(
        tmp_path: Path, casfs_env: dict[str, Path], cli: Callable[..., Any]) -> None:
    """A valid record planted at seq 999999999999 makes the next publication
    1000000000000, a 13-digit name. Was: seq listings took 12-digit names only, so
    `casfs generations` and verify never saw it and gc, keeping the newest *listed*
    generations, deleted its objects: its files were lost (I3)."""
    a = tmp_path / "a"
    b = tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "a").write_bytes(b"A")
    (b / "b").write_bytes(b"B")
    cli("import", "--namespace", "ns", a, check=True)
    first = _record_path(casfs_env["root"], 1)
    doc = json.loads(first.read_bytes())
    doc["seq"] = 999999999999
    _record_path(casfs_env["root"], 999999999999).write_text(json.dumps(doc))
    cli("import", "--namespace", "ns", b, check=True)
    gens = cli("generations", "--json", "ns", check=True).json()
    assert 10**12 in {g["seq"] for g in gens}, gens
    for _ in range(2):  # mark, then sweep
        cli("gc", "--keep", "1", "--grace", "0", check=True)
    assert cli("cat", "ns", "b", check=True).out == "B"
    assert cli("verify", check=True).rc == 0
