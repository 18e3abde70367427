"""Every store command of the casfs CLI, in a fresh process, with and without --json."""

from __future__ import annotations

import filecmp
import os
import random
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

Cli = Callable[..., Any]


def make_src(base: Path) -> Path:
    rng = random.Random(5)
    files = {
        "ab/cab12.py": b"def call(args):\n    return args\n" * 50,
        "ab/cab12.cpp": b'extern "C" void kernel(float* x) { x[0] += 1; }\n' * 30,
        "ab/cab12.so": rng.randbytes(9000),
        "fxgraph/ab/fxyz/entry": rng.randbytes(300),
        "top.txt": b"top\n",
        "empty.bin": b"",
    }
    for rel, data in files.items():
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    os.chmod(base / "ab/cab12.so", 0o755)
    os.chmod(base / "top.txt", 0o600)
    os.utime(base / "top.txt", ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    (base / "ab" / ".1234.5678.tmp").write_bytes(b"scratch")  # never published
    return base


@pytest.fixture
def imported(cli: Cli, tmp_path: Path) -> Path:
    src = make_src(tmp_path / "src")
    cli("init", check=True)
    cli("import", src, "--family", "inductor", "-n", "ns", check=True)
    return src


def test_init_is_idempotent(cli: Cli, casfs_env: dict[str, Path]) -> None:
    res = cli("init", check=True)
    assert str(casfs_env["root"]) in res.out
    assert (casfs_env["root"] / "casfs.json").is_file()
    assert cli("init", check=True).rc == 0
    for sub in ("objects", "namespaces", "tmp"):
        assert (casfs_env["root"] / sub).is_dir()


def test_import_text_and_json_and_dedup(cli: Cli, tmp_path: Path) -> None:
    src = make_src(tmp_path / "src")
    res = cli("import", src, "--family", "inductor", "-n", "ns", check=True)
    assert res.out.startswith("ns@1: 6 files")
    again = cli("import", src, "--family", "inductor", "-n", "ns", "--json", check=True).json()
    assert again["seq"] == 1 and again["added"] == 0 and again["new_objects"] == 0
    assert again["already_published"] == 6 and again["files"] == 6
    assert again["skipped_scratch"] == 1
    (src / "new.py").write_text("x = 2\n")
    third = cli("import", src, "-n", "ns", "--json", check=True).json()
    assert third["seq"] == 2 and third["added"] == 1 and third["new_objects"] == 1


def test_export_is_byte_identical_with_modes(cli: Cli, imported: Path, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    res = cli("export", "ns", dest, check=True)
    assert "6 files" in res.out
    cmp = filecmp.dircmp(imported, dest)

    def same(c: filecmp.dircmp[str]) -> None:
        assert c.diff_files == [] and c.funny_files == []
        for sub in c.subdirs.values():
            same(sub)

    same(cmp)
    for dirpath, _, names in os.walk(imported):
        for n in names:
            a = Path(dirpath) / n
            rel = a.relative_to(imported)
            b = dest / rel
            if n.endswith(".tmp"):
                assert not b.exists()
                continue
            assert filecmp.cmp(a, b, shallow=False), rel
            sa, sb = os.stat(a), os.stat(b)
            assert stat.S_IMODE(sa.st_mode) == stat.S_IMODE(sb.st_mode), rel
            assert sa.st_mtime_ns == sb.st_mtime_ns, rel
    dest2 = tmp_path / "out2"
    doc = cli("export", "ns@1", dest2, "--json", check=True).json()
    assert doc == {"namespace": "ns", "seq": 1, "files": 6, "bytes": doc["bytes"], "failed": [],
                   "skipped_generations": []}
    assert doc["bytes"] == sum(p.stat().st_size for p in dest2.rglob("*") if p.is_file())


@pytest.mark.expect_log(r"rejected object: object \w+: content does not match its name")
def test_export_reports_corrupt_object_and_exits_1(
    cli: Cli, imported: Path, tmp_path: Path, casfs_env: dict[str, Path]
) -> None:
    digest = cli("stat", "ns", "top.txt", "--json", check=True).json()["digest"]
    p = casfs_env["root"] / "objects" / digest[:2] / digest[2:]
    p.chmod(0o644)
    p.write_bytes(p.read_bytes()[:-1] + b"X")
    dest = tmp_path / "out"
    res = cli("export", "ns", dest)
    assert res.rc == 1 and "Traceback" not in res.err
    assert "failed: top.txt" in res.err
    assert not (dest / "top.txt").exists()  # a corrupt object leaves no file behind
    assert (dest / "ab/cab12.py").read_bytes() == (imported / "ab/cab12.py").read_bytes()
    assert not [n for n in os.listdir(dest) if n.startswith(".tmp")]


def test_namespaces_and_generations(cli: Cli, imported: Path) -> None:
    (imported / "more.txt").write_text("more")
    cli("import", imported, "-n", "ns", check=True)
    cli("import", imported, "-n", "other", check=True)
    text = cli("namespaces", check=True).out
    assert text.splitlines()[0].split() == ["NAMESPACE", "LATEST", "GENERATIONS", "FILES", "SIZE"]
    assert any(ln.split()[:3] == ["ns", "2", "2"] for ln in text.splitlines())
    rows = cli("namespaces", "--json", check=True).json()
    assert {r["namespace"]: (r["latest"], r["generations"], r["entries"]) for r in rows} == {
        "ns": (2, 2, 7), "other": (1, 1, 7)}
    cli("pin", "ns@1", "golden", check=True)
    gens = cli("generations", "ns", "--json", check=True).json()
    assert [g["seq"] for g in gens] == [1, 2]
    assert gens[0]["pins"] == ["golden"] and gens[1]["pins"] == []
    assert gens[1]["parent"] == 1 and gens[1]["entries"] == 7
    text = cli("generations", "ns", check=True).out
    assert "golden" in text and text.splitlines()[0].startswith("SEQ")


def test_ls_stat_cat(cli: Cli, imported: Path) -> None:
    top = cli("ls", "ns", check=True).out.split()
    assert "ab/" in top and "fxgraph/" in top and "top.txt" in top
    rows = cli("ls", "ns", "-r", "--json", check=True).json()
    assert [r["path"] for r in rows] == sorted(
        ["ab/cab12.py", "ab/cab12.cpp", "ab/cab12.so", "fxgraph/ab/fxyz/entry", "top.txt",
         "empty.bin"])
    sub = cli("ls", "ns@1", "ab", "--json", check=True).json()
    assert {r["path"] for r in sub} == {"ab/cab12.py", "ab/cab12.cpp", "ab/cab12.so"}
    st = cli("stat", "ns", "ab/cab12.so", "--json", check=True).json()
    assert st["mode"] == "0o755" and st["size"] == 9000 and st["codec"] == "raw"
    assert st["stored_bytes"] == 9000 + 16
    st_py = cli("stat", "ns", "ab/cab12.py", "--json", check=True).json()
    assert st_py["codec"] == "zstd" and st_py["stored_bytes"] < st_py["size"]
    text = cli("stat", "ns", "ab/cab12.py", check=True).out
    assert "codec: zstd" in text and st_py["digest"] in text
    cat = cli("cat", "ns", "ab/cab12.py", check=True)
    assert cat.out.encode() == (imported / "ab/cab12.py").read_bytes()


def test_diff(cli: Cli, imported: Path) -> None:
    (imported / "new/a.py").parent.mkdir()
    (imported / "new/a.py").write_text("a = 1\n")
    cli("import", imported, "-n", "ns", check=True)
    doc = cli("diff", "ns@1", "ns@2", "--json", check=True).json()
    assert doc == {"added": ["new/a.py"], "removed": [], "changed": [],
                   "skipped_generations": []}
    assert cli("diff", "ns@1", "ns@2", check=True).out.strip() == "+ new/a.py"
    back = cli("diff", "ns@2", "ns@1", "--json", check=True).json()
    assert back["removed"] == ["new/a.py"]


def test_du(cli: Cli, imported: Path) -> None:
    (imported / "copy").mkdir()
    (imported / "copy/cab12.py").write_bytes((imported / "ab/cab12.py").read_bytes())
    cli("import", imported, "-n", "ns", check=True)
    doc = cli("du", "ns", "--json", check=True).json()
    for key in ("logical_bytes", "stored_bytes", "dedup_ratio", "compression_ratio"):
        assert key in doc
    assert doc["files"] == 7
    assert doc["logical_bytes"] == sum(
        p.stat().st_size for p in imported.rglob("*") if p.is_file() and not p.name.endswith(
            ".tmp"))
    assert doc["dedup_ratio"] > 1.0  # copy/cab12.py is the same object
    assert doc["compression_ratio"] > 1.0
    assert doc["stored_bytes"] < doc["logical_bytes"]
    text = cli("du", check=True).out
    assert "dedup x" in text and "compression x" in text


@pytest.mark.expect_log(
    r"rejected object: object \w+: (content does not match its name|unknown codec)",
)
def test_verify_clean_and_damaged(
    cli: Cli, imported: Path, casfs_env: dict[str, Path]
) -> None:
    res = cli("verify", check=True)
    assert res.out.strip().endswith("0 problems")
    assert cli("verify", "--json", check=True).json()["ok"] is True
    digests = {p: cli("stat", "ns", p, "--json", check=True).json()["digest"]
               for p in ("top.txt", "ab/cab12.so", "ab/cab12.py")}
    obj = casfs_env["root"] / "objects"
    flipped = obj / digests["top.txt"][:2] / digests["top.txt"][2:]
    flipped.chmod(0o644)
    data = bytearray(flipped.read_bytes())
    data[-1] ^= 0xFF
    flipped.write_bytes(bytes(data))
    (obj / digests["ab/cab12.so"][:2] / digests["ab/cab12.so"][2:]).unlink()
    codec = obj / digests["ab/cab12.py"][:2] / digests["ab/cab12.py"][2:]
    codec.chmod(0o644)
    data = bytearray(codec.read_bytes())
    data[5] = 7
    codec.write_bytes(bytes(data))
    res = cli("verify")
    assert res.rc == 1 and "Traceback" not in res.err
    for d in digests.values():
        assert d in res.out
    assert "unknown codec 7" in res.out and "missing" in res.out
    doc = cli("verify", "--json").json()
    assert doc["ok"] is False and len(doc["problems"]) >= 4  # 2 corrupt + their refs + 1 missing


def test_gc_commands(cli: Cli, imported: Path, casfs_env: dict[str, Path]) -> None:
    for i in range(3):
        (imported / f"g{i}.txt").write_text(f"gen {i}")
        cli("import", imported, "-n", "ns", check=True)
    (casfs_env["root"] / "tmp" / ".tmp-obj-1-stale").write_bytes(b"x")
    dry = cli("gc", "--dry-run", "--keep", "1", "--grace", "0", "--json", check=True).json()
    assert dry["dry_run"] is True and len(dry["removed_generations"]) == 3
    assert dry["removed_tmp"] == 1
    assert [g["seq"] for g in cli("generations", "ns", "--json", check=True).json()] == [1, 2, 3, 4]
    young = cli("gc", "--keep", "1", "--json", check=True).json()  # default 24 h grace
    assert young["removed_generations"] == [] and young["removed_objects"] == 0
    text = cli("gc", "--keep", "2", "--grace", "0", check=True).out
    assert text.startswith("removed ") and "2 generations" in text and "1 temp files" in text
    assert [g["seq"] for g in cli("generations", "ns", "--json", check=True).json()] == [3, 4]
    assert cli("verify", "--json", check=True).json()["ok"] is True


def test_pin_unpin(cli: Cli, imported: Path) -> None:
    assert cli("pin", "ns@1", "keepme", check=True).out.strip() == "pinned ns@1 as keepme"
    assert cli("pin", "ns@1", "keepme", check=True).rc == 0  # same pin again: fine
    (imported / "x").write_text("x")
    cli("import", imported, "-n", "ns", check=True)
    line = cli("pin", "ns@2", "keepme").assert_clean_error()
    assert "already exists" in line
    cli("gc", "--keep", "1", "--grace", "0", check=True)
    assert [g["seq"] for g in cli("generations", "ns", "--json", check=True).json()] == [1, 2]
    assert "unpinned" in cli("unpin", "ns", "keepme", check=True).out
    cli("gc", "--keep", "1", "--grace", "0", check=True)
    assert [g["seq"] for g in cli("generations", "ns", "--json", check=True).json()] == [2]
    assert "no pin" in cli("unpin", "ns", "keepme").assert_clean_error()
    assert "NAMESPACE@SEQ" in cli("pin", "ns", "x").assert_clean_error()


def test_key(cli: Cli) -> None:
    doc = cli("key", "--family", "inductor", "--json", check=True).json()
    assert doc["family"] == "inductor" and doc["namespace"].startswith("inductor-")
    assert "python" in doc["ingredients"]
    text = cli("key", "--family", "inductor", check=True).out
    assert text.splitlines()[0] == doc["namespace"]
    both = cli("key", "--family", "triton,inductor", "--json", check=True).json()
    assert [d["family"] for d in both] == ["triton", "inductor"]


def test_import_auto_namespace(cli: Cli, tmp_path: Path) -> None:
    src = make_src(tmp_path / "src")
    ns = cli("key", "--family", "inductor", "--json", check=True).json()["namespace"]
    doc = cli("import", src, "--family", "inductor", "--json", check=True).json()
    assert doc["namespace"] == ns and doc["seq"] == 1


# --- errors: one line, non-zero, no traceback --------------------------------------------
@pytest.mark.parametrize("args,needle", [
    (["ls", "bad/ns"], "invalid namespace name"),
    (["ls", "../x"], "invalid namespace name"),
    (["generations", "bad ns"], "invalid namespace name"),
    (["du", "a/b"], "invalid namespace name"),
    (["ls", "ns@99"], "no generation ns@99"),
    (["ls", "ns@x"], "bad generation"),
    (["ls", "nope"], "has no generations"),
    (["generations", "nope"], "has no generations"),
    (["stat", "ns", "no/such/file"], "no file"),
    (["cat", "ns", "no/such/file"], "no file"),
    (["ls", "ns", "no/such/dir"], "no 'no/such/dir'"),
    (["diff", "ns@1", "ns@7"], "no generation ns@7"),
    (["pin", "ns@5", "p"], "no generation ns@5"),
    (["pin", "ns@1", "bad/pin"], "invalid pin name"),
])
def test_errors_are_one_clean_line(cli: Cli, imported: Path, args: list[str],
                                   needle: str) -> None:
    line = cli(*args).assert_clean_error()
    assert needle in line


def test_import_bad_namespace_and_bad_src(cli: Cli, tmp_path: Path) -> None:
    src = make_src(tmp_path / "src")
    assert "invalid namespace name" in cli("import", src, "-n", "bad/ns").assert_clean_error()
    assert "is not a directory" in cli("import", tmp_path / "nope", "-n", "ns") \
        .assert_clean_error()


def test_missing_root(cli: Cli, casfs_env: dict[str, Path]) -> None:
    for args in (["ls", "ns"], ["namespaces"], ["verify"], ["gc"], ["export", "ns", "/tmp/x"]):
        line = cli(*args).assert_clean_error()
        assert "no casfs shared root" in line, (args, line)
    assert not casfs_env["root"].exists()  # queries never create a root


def test_root_with_unknown_major_version(cli: Cli, casfs_env: dict[str, Path]) -> None:
    cli("init", check=True)
    (casfs_env["root"] / "casfs.json").chmod(0o644)
    (casfs_env["root"] / "casfs.json").write_text('{"format": "casfs", "version": "2.0"}')
    assert "format version 2.0" in cli("namespaces").assert_clean_error()


def test_export_into_non_empty_dir(cli: Cli, imported: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    line = cli("export", "ns", dest).assert_clean_error()
    assert "not an empty directory" in line
    assert os.listdir(dest) == ["keep.txt"] and (dest / "keep.txt").read_text() == "mine"
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert "not an empty directory" in cli("export", "ns", afile).assert_clean_error()


@pytest.mark.expect_log(r"rejected object: object \w+: content does not match its name")
def test_cat_of_corrupt_object_writes_nothing(
    cli: Cli, imported: Path, casfs_env: dict[str, Path]
) -> None:
    digest = cli("stat", "ns", "ab/cab12.so", "--json", check=True).json()["digest"]
    p = casfs_env["root"] / "objects" / digest[:2] / digest[2:]
    p.chmod(0o644)
    data = bytearray(p.read_bytes())
    data[-1] ^= 1  # raw object: every byte but the last would stream out before the hash check
    p.write_bytes(bytes(data))
    res = cli("cat", "ns", "ab/cab12.so")
    assert "does not match" in res.assert_clean_error()
    assert res.out == ""


@pytest.mark.expect_log(r"is not a directory \(a symbolic link, another mount\?\): not collecting")
def test_a_fifo_where_the_root_stages_is_one_line_not_a_traceback(
    cli: Callable[..., Any], casfs_env: dict[str, Path], tmp_path: Path
) -> None:
    """An environment error (here a FIFO where the root's tmp/ directory was) is one
    `casfs: error:` line from import, as any error; gc, which only collects staging
    leftovers there, goes on. Both used to end in a NotADirectoryError traceback."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a")
    cli("init", check=True)
    staging = casfs_env["root"] / "tmp"
    staging.rmdir()
    os.mkfifo(staging)
    line = cli("import", src, "-n", "ns", timeout=60).assert_clean_error()
    assert "Not a directory" in line
    assert cli("gc", "--keep", "1", "--grace", "0", timeout=60).rc == 0


def test_import_skips_a_file_dated_past_2262(cli: Cli, tmp_path: Path) -> None:
    """Was: its row (mtime over 2**63 ns) was published, and every reader rejected the
    whole generation as damaged ("bad mtime"): the other files of the import were lost
    from view and `casfs verify` reported a problem."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "good").write_text("good")
    (src / "future").write_text("future")
    os.utime(src / "future", ns=(13_569_465_600 * 10**9,) * 2)  # 2400-01-01
    res = cli("import", "--json", "--namespace", "ns", src, check=True)
    assert res.json()["skipped"] == ["future"]
    assert [r["path"] for r in cli("ls", "--json", "ns", check=True).json()] == ["good"]
    assert "0 problems" in cli("verify", check=True).out


def test_names_that_are_not_utf8_print_as_their_bytes_in_any_locale(
        cli: Cli, tmp_path: Path) -> None:
    """Was: under a strict UTF-8 locale (en_US.UTF-8; PYTHONIOENCODING=utf-8:strict here)
    `casfs ls` of such a name died with a UnicodeEncodeError traceback."""
    src = tmp_path / "src"
    src.mkdir()
    (src / os.fsdecode(b"odd\xffname")).write_bytes(b"x")
    cli("import", "--namespace", "ns", src, check=True)
    env = dict(os.environ, PYTHONIOENCODING="utf-8:strict")
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "ls", "ns"], env=env,
                       capture_output=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == b"odd\xffname"


@pytest.mark.parametrize("bad", [["--grace", "-5"], ["--grace", "nan"], ["--keep", "0"]])
def test_gc_refuses_a_negative_grace_or_keeping_nothing(cli: Cli, bad: list[str]) -> None:
    """A negative grace deletes what a writer staged a moment ago; --keep 0 kept no
    generation at all (every namespace's files unreferenced, then deleted)."""
    r = cli("gc", *bad)
    line = r.assert_clean_error()
    assert bad[0] in line
