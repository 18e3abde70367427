"""One ``casfs run`` serving several cache families from one mount process, through
real FUSE mounts: what the families share in that process (its fd limit, the
node's promotion state) must not cost a job an error or a family its files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import wait_until

from casfs.store.root import SharedRoot

pytestmark = pytest.mark.fuse

FAMILIES = {"triton": "TRITON_CACHE_DIR", "inductor": "TORCHINDUCTOR_CACHE_DIR",
            "vllm": "VLLM_CACHE_ROOT", "cuda": "CUDA_CACHE_PATH",
            "flashinfer": "FLASHINFER_WORKSPACE_BASE"}

WRITE = """
import os, sys
n, same = int(sys.argv[1]), sys.argv[2] == "same"
for var in sys.argv[3:]:
    for i in range(n):
        d = os.path.join(os.environ[var], f"k{i:04d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "data.bin"), "wb") as f:
            f.write(b"same bytes" if same else (var + str(i)).encode() * 40)
"""

# Reads every file of every family twice, then writes new ones: an error is printed.
READ = """
import os, sys
errors = 0
for rnd in range(2):
    for var in sys.argv[1:]:
        d = os.environ[var]
        for top, _, files in os.walk(d):
            for name in files:
                try:
                    with open(os.path.join(top, name), "rb") as f:
                        f.read()
                except OSError as e:
                    errors += 1
                    print("read", e, file=sys.stderr)
        for i in range(10):
            try:
                os.makedirs(os.path.join(d, f"new{rnd}_{i}"), exist_ok=True)
                with open(os.path.join(d, f"new{rnd}_{i}", "x"), "wb") as f:
                    f.write(var.encode())
            except OSError as e:
                errors += 1
                print("write", e, file=sys.stderr)
print("errors", errors)
sys.exit(1 if errors else 0)
"""


def casfs_run(tmp: Path, node: str, families: list[str] | None, script: str, *args: str,
              prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``casfs run`` of ``script`` with ``families`` (None: every family, the default)."""
    env = dict(os.environ, CASFS_ROOT=str(tmp / "root"), CASFS_STATE_DIR=str(tmp / node),
               CASFS_MOUNT_BASE=str(tmp / "mnt"), CASFS_SOCKET=str(tmp / "no-daemon.sock"))
    for var in FAMILIES.values():
        env.pop(var, None)
    path = tmp / f"{node}.py"
    path.write_text(script)
    return subprocess.run(
        [*prefix, sys.executable, "-m", "casfs.cli.main", "run",
         *(["--family", ",".join(families)] if families else []),
         "--stable-after", "0", "--python", sys.executable, "--",
         sys.executable, str(path), *args],
        env=env, capture_output=True, text=True, timeout=600, check=False)


def published_paths(root: Path, family: str) -> set[str]:
    gens = SharedRoot.open(root).generations()
    (ns,) = [n for n in gens.namespaces() if n.startswith(f"{family}-")]
    return set(gens.snapshot(gens.latest(ns)).entries)


def test_the_same_bytes_written_in_two_families_are_published_in_both(tmp_path: Path) -> None:
    """Promoted at once in one process, the same bytes land in one pack; the first
    family's publication dropped the node's record of where, so the other family's
    final publication found its object 'lost' and published nothing."""
    fams = ["triton", "inductor", "vllm"]
    r = casfs_run(tmp_path, "a", fams, WRITE, "3", "same", *(FAMILIES[f] for f in fams))
    assert r.returncode == 0, r.stderr[-3000:]
    for fam in fams:
        assert published_paths(tmp_path / "root", fam) == {
            f"k{i:04d}/data.bin" for i in range(3)}, (fam, r.stderr[-3000:])


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_many_families_under_a_low_fd_limit_never_fail_the_job(tmp_path: Path) -> None:
    """Each family's cache kept its own quarter of RLIMIT_NOFILE as idle fds: with
    several families read at a limit of 256 the process ran out, the job's writes
    got EMFILE, and an accept on the control socket ended the mount. A hard limit
    the process cannot lift, as an operator's LimitNOFILE would set."""
    fams = list(FAMILIES)
    r = casfs_run(tmp_path, "a", fams, WRITE, "400", "distinct", *FAMILIES.values())
    assert r.returncode == 0, r.stderr[-3000:]
    # Every family served (the default): ten caches in the one mount process.
    r = casfs_run(tmp_path, "b", None, READ, *FAMILIES.values(),
                  prefix=("prlimit", "--nofile=256:256", "--"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "errors 0" in r.stdout
    assert "mount process died" not in r.stderr, r.stderr[-3000:]
    for fam in fams:  # every family's new files published at the end: the mount lived
        assert {f"new{rnd}_{i}/x" for rnd in (0, 1) for i in range(10)} <= published_paths(
            tmp_path / "root", fam), (fam, r.stderr[-3000:])
    # Written as the mount process exits, after the release casfs run waited for: a
    # moment after casfs run's own exit on a loaded machine.
    final = tmp_path / "b" / "run" / "host.final-stats"
    wait_until(final.exists, "the mount process's final stats", timeout=60, interval=0.1)
    stats = json.loads(final.read_text())
    assert {ns["namespace"].split("-")[0] for ns in stats["namespaces"]} >= set(fams)


MOVE = """
import errno, os, shutil
t, i = os.environ["TRITON_CACHE_DIR"], os.environ["TORCHINDUCTOR_CACHE_DIR"]
os.makedirs(f"{t}/k", exist_ok=True)
with open(f"{t}/k/f", "w") as f:
    f.write("hello")
try:
    os.rename(f"{t}/k/f", f"{i}/f")
except OSError as e:  # two namespaces: two filesystems to the job
    print("rename", errno.errorcode[e.errno])
shutil.move(f"{t}/k/f", f"{i}/moved")  # falls back to copy + unlink
os.makedirs(f"{i}/pkg", exist_ok=True)
open(f"{i}/pkg/__init__.py", "w").close()  # an empty file beside a non-empty one
open(f"{i}/zz-empty", "w").close()
"""


def test_a_job_moves_files_between_families_and_leaves_empty_ones(tmp_path: Path) -> None:
    """Moving a file from one family's cache to another's is a move between
    filesystems (EXDEV, then copy); empty files publish like any other (an empty file
    in a promotion part once failed every round of its namespace: python-zstandard's
    multi-threaded compression dropped its segment)."""
    r = casfs_run(tmp_path, "a", ["triton", "inductor"], MOVE)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rename EXDEV" in r.stdout
    assert "promotion round failed" not in r.stderr
    assert published_paths(tmp_path / "root", "inductor") == {
        "moved", "pkg/__init__.py", "zz-empty"}, r.stderr[-3000:]


@pytest.mark.parametrize(("make", "rc"), [("missing", 127), ("noexec", 126)])
def test_a_command_that_cannot_run_exits_as_a_shell_would(tmp_path: Path, make: str,
                                                          rc: int) -> None:
    prog = tmp_path / "prog.sh"
    if make == "noexec":
        prog.write_text("echo hi\n")
        prog.chmod(0o644)
    env = dict(os.environ, CASFS_ROOT=str(tmp_path / "root"), CASFS_STATE_DIR=str(tmp_path / "a"),
               CASFS_MOUNT_BASE=str(tmp_path / "mnt"), CASFS_SOCKET=str(tmp_path / "no.sock"))
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
                        "--", str(prog)], env=env, capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == rc, r.stderr
    assert f"casfs: error: cannot run {prog}: " in r.stderr
    assert "Traceback" not in r.stderr
