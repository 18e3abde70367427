"""Fixtures for view tests: overlay mounts over a plain lower directory.

``overlay(files)`` mounts a fresh overlay whose lower layer holds ``files``
(relative path -> bytes) and returns an ``Overlay`` (paths + the MountedView);
``twin(files)`` also returns a plain directory with the same content, for
running one POSIX sequence on both and comparing. Mounts are torn down after
the test even when it fails.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fusehelpers import MountedView, require_fuse

# A small lower tree shaped like a compiler cache.
SAMPLE: dict[str, bytes] = {
    "top.txt": b"top level\n",
    "ab/abcdef.py": b"print('kernel')\n",
    "ab/abcdef.so": bytes(range(256)) * 40,
    "fxgraph/ab/key1/entry": b"pickle-1",
    "fxgraph/ab/key1/entry2": b"pickle-2",
    "triton/KEY/kernel.cubin": b"\x7fELF" + b"\0" * 100,
    "triton/KEY/__grp__kernel.json": b'{"child_paths": {}}',
    "emptyish/only": b"x",
    "bad/corrupt.bin": b"this object fails verification",
    "bad/good.bin": b"fine",
}
CLEAN = {k: v for k, v in SAMPLE.items() if "corrupt" not in k}


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


@dataclass
class Overlay:
    lower: Path
    upper: Path
    mnt: Path
    view: MountedView

    def remount(self) -> None:
        self.view.stop()
        self.view.start()


@pytest.fixture
def overlay(tmp_path: Path) -> Iterator[Callable[..., Overlay]]:
    require_fuse()
    made: list[Overlay] = []

    def make(
        files: dict[str, bytes] | None = None,
        name: str = "o",
        *,
        base_dir: Path | None = None,
        allow_other: bool = False,
    ) -> Overlay:
        base = (base_dir or tmp_path) / name
        lower, upper, mnt = base / "lower", base / "upper", base / "mnt"
        lower.mkdir(parents=True)
        write_tree(lower, SAMPLE if files is None else files)
        ov = Overlay(lower, upper, mnt, MountedView(lower, upper, mnt, allow_other=allow_other))
        made.append(ov)
        ov.view.start()
        return ov

    try:
        yield make
    finally:
        cwd = os.getcwd()
        for ov in made:
            if cwd == str(ov.mnt) or cwd.startswith(str(ov.mnt) + os.sep):
                os.chdir(tmp_path)
            ov.view.stop()


@pytest.fixture
def twin(overlay: Callable[..., Overlay], tmp_path: Path) -> Callable[..., tuple[Path, Path]]:
    """(mount root, plain dir) holding the same initial files."""

    def make(files: dict[str, bytes] | None = None) -> tuple[Path, Path]:
        ov = overlay(CLEAN if files is None else files)
        plain = tmp_path / "plain"
        shutil.rmtree(plain, ignore_errors=True)
        plain.mkdir()
        write_tree(plain, CLEAN if files is None else files)
        # Match the view's synthesized modes: lower dirs 0o777, the root 0o1777 like /tmp.
        for d, _, _ in os.walk(plain):
            os.chmod(d, 0o777)
        os.chmod(plain, 0o1777)
        return ov.mnt, plain

    return make
