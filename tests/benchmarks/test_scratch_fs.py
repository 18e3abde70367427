"""bench.common.scratch_fs: the benchmarks say which filesystem their nodes create files
on, and whether it keeps a journal (an ext4 without one, as this VM's root, makes every
file created dearer after churn: the network figures depend on it)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.common import scratch_fs, warn_scratch_fs


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[Callable[[str, bool], Path]]:
    mounted: list[Path] = []

    def make(name: str, journal: bool) -> Path:
        img, mnt = tmp_path / f"{name}.img", tmp_path / name
        with open(img, "wb") as f:
            f.truncate(64 << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", *([] if journal else ["-O", "^has_journal"]),
                        str(img)], check=True)
        mnt.mkdir()
        subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
        mounted.append(mnt)
        return mnt

    yield make
    for mnt in mounted:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_journal_is_seen_or_its_absence(ext4: Callable[[str, bool], Path],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with_j, without = ext4("journaled", True), ext4("bare", False)
    (with_j / "sub").mkdir()
    got = scratch_fs(with_j / "sub")
    assert got["fstype"] == "ext4" and got["journal"] is True
    assert got["source"].startswith("/dev/loop")
    bare = scratch_fs(without)
    assert bare["fstype"] == "ext4" and bare["journal"] is False
    warn_scratch_fs(got)
    assert capsys.readouterr().err == ""
    warn_scratch_fs(bare)
    assert "without a journal" in capsys.readouterr().err


def test_other_filesystems_have_no_journal_figure() -> None:
    got = scratch_fs(Path("/dev/shm"))
    assert got["fstype"] == "tmpfs" and got["journal"] is None


def test_a_journaled_scratch_is_mounted_for_the_run_and_gone_after(tmp_path: Path) -> None:
    from fusehelpers import mounted

    from bench.common import journaled_scratch

    with journaled_scratch(tmp_path, 64 << 20) as d:
        got = scratch_fs(d)
        assert got["fstype"] == "ext4" and got["journal"] is True
        (d / "f").write_bytes(b"x")
        held = d
    assert not mounted(held)
    assert list(tmp_path.iterdir()) == []  # the image and its mount point removed
