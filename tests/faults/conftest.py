"""Fixtures of the fault suite: the previous release, CLI runners with a timeout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.node.conftest import cluster  # noqa: F401  (real-mount nodes, reused)
from tests.store.conftest import root  # noqa: F401  (a fresh shared root)

REPO = Path(__file__).resolve().parents[2]
PREVIOUS_RELEASE = "97902a3"  # the release before the format step (docs/format.md)


@pytest.fixture(scope="session")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runnable copy of the previous release's casfs package (PYTHONPATH for it).

    Needs git and the full history (CI runs in a clean clone): fails, never skips.
    """
    git = shutil.which("git")
    assert git, "git is needed to extract the previous release"
    dest = tmp_path_factory.mktemp("previous-release")
    archive = subprocess.run([git, "-C", str(REPO), "archive", PREVIOUS_RELEASE, "casfs"],
                             capture_output=True, check=True, timeout=60).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True, timeout=60)
    assert (dest / "casfs/store/generations.py").is_file()
    return dest


CliRun = Callable[..., subprocess.CompletedProcess[str]]


def cli_for(code: Path, env: dict[str, str]) -> CliRun:
    """A CLI runner importing casfs from ``code``."""

    def run(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        e = dict(os.environ) | env | {"PYTHONPATH": str(code)}
        # cwd too: ``python -m`` puts the working directory first on sys.path.
        return subprocess.run([sys.executable, "-m", "casfs.cli.main", *map(str, args)],
                              capture_output=True, text=True, timeout=timeout, env=e, cwd=code)

    return run


CORRUPTIONS = ("bitflip", "truncate", "zero", "other-object", "symlink", "fifo", "directory")


def corrupt(path: Path, kind: str, other: Path) -> None:
    """Damage the object file at ``path`` as ``kind``; ``other`` is another valid object."""
    data = path.read_bytes()
    path.unlink()
    if kind == "bitflip":
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 0x01]))
    elif kind == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "zero":
        path.write_bytes(b"")
    elif kind == "other-object":
        path.write_bytes(other.read_bytes())
    elif kind == "symlink":
        path.symlink_to(other)  # a valid object, or /etc/passwd: never followed
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
        (path / "x").write_bytes(data)
    else:
        raise AssertionError(kind)
