"""The whiteout format (overlayfs's) and the pure merge rule of one directory listing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from casfs.view.whiteout import (
    is_opaque,
    is_whiteout,
    make_opaque,
    make_whiteout,
    merge_children,
    sweep,
    work_dir_for,
)


def test_upper_shadows_lower_without_duplicates() -> None:
    got = merge_children([("b", "U"), ("a", "U")], [("a", "L"), ("c", "L")])
    assert got == [("a", "U"), ("b", "U"), ("c", "L")]


def test_whiteouts_hide_lower_and_are_never_listed() -> None:
    got = merge_children([("z", "U")], [("a", "L"), ("b", "L")], whiteouts=["a"])
    assert got == [("b", "L"), ("z", "U")]


def test_hidden_lower_names_dropped_and_no_name_reserved() -> None:
    got = merge_children([], [(".wh.x", "L"), ("bad", "L"), ("ok", "L")],
                         lower_hidden=lambda n: n == "bad")
    assert got == [(".wh.x", "L"), ("ok", "L")]


def test_markers_on_disk_and_sweep(tmp_path: Path) -> None:
    up = tmp_path / "upper" / "ns"
    (up / "d").mkdir(parents=True)
    long = "x" * 255
    make_whiteout(str(up / long))  # NAME_MAX names need no prefix
    make_whiteout(str(up / "d" / "gone"))
    make_opaque(str(up / "d"))
    (up / "d" / "kept").write_bytes(b"mine")
    assert is_whiteout(os.lstat(up / long)) and is_opaque(str(up / "d"))
    assert not is_whiteout(os.lstat(up / "d" / "kept"))
    assert sweep(up) == 3
    assert sorted(os.listdir(up)) == ["d"] and os.listdir(up / "d") == ["kept"]
    assert not is_opaque(str(up / "d"))
    assert work_dir_for(up) == tmp_path / "upper" / ".casfs-work" / "ns"


def test_sweep_leaves_dot_wh_names_of_the_new_format(tmp_path: Path) -> None:
    (tmp_path / ".wh.x").touch()  # no legacy staging dir: an ordinary user file
    assert sweep(tmp_path) == 0 and (tmp_path / ".wh.x").exists()


def test_sweep_as_the_owner_clears_a_marker_in_a_dir_the_job_made_read_only() -> None:
    """A non-root node's view runs as the job's user: a marker under a directory the
    job chmod-ed 0555 is still dropped (the dir keeps its mode), and the sweep never
    raises (it did: PermissionError, and that namespace's view could not start)."""
    from users import open_tmp, real_users

    with open_tmp() as tmp, real_users(1, tmp) as (u,):
        up = tmp / "upper"
        (up / "d").mkdir(parents=True)
        make_whiteout(str(up / "d" / "gone"))
        (up / "d" / "kept").write_bytes(b"mine")
        (up / "d" / "o").mkdir()
        os.setxattr(up / "d" / "o", "user.overlay.opaque", b"y")  # a non-root view's
        for p in (up, up / "d", up / "d" / "kept", up / "d" / "o"):
            os.lchown(p, u.uid, u.gid)
        os.chmod(up / "d" / "o", 0o555)
        os.chmod(up / "d", 0o555)
        p = u.python("import sys\nfrom pathlib import Path\n"
                     "from casfs.view.whiteout import sweep\n"
                     "errors = []\n"
                     f"print(sweep(Path({str(up)!r}), errors), errors)\n")
        assert p.returncode == 0, p.stderr
        assert p.stdout.split() == ["2", "[]"], p.stdout
        assert sorted(os.listdir(up / "d")) == ["kept", "o"]
        assert not is_opaque(str(up / "d" / "o"))  # its lower entries show again
        assert os.stat(up / "d").st_mode & 0o777 == 0o555
        assert os.stat(up / "d" / "o").st_mode & 0o777 == 0o555


@pytest.mark.expect_log(r"sweeping .*: \[Errno 30\] Read-only file system")
def test_sweep_reports_a_marker_it_cannot_remove_instead_of_raising(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from casfs.view import whiteout

    (tmp_path / "d").mkdir()
    make_whiteout(str(tmp_path / "d" / "gone"))
    real = os.unlink

    def refuse(path: str, *a: object, **kw: object) -> None:
        if str(path).endswith("gone"):
            raise OSError(30, "Read-only file system", path)
        real(path, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(whiteout.os, "unlink", refuse)
    errors: list[str] = []
    assert sweep(tmp_path, errors) == 0
    assert errors == [str(tmp_path / "d")]  # the view keeps checking for whiteouts
