"""casfs.util.owned: a path casfs mounts or writes at must belong to its user, component
by component (issue 21, "Mount bases that belong to their user"). Unit level: the
checker is given a uid, and directories are chowned to other uids (the tests run as
root). The real-user attacks through ``casfs run`` are in test_squatted_base.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from casfs.util.owned import UnsafePathError, check_dir, check_mountpoint

ME, OTHER = 61001, 61002


@pytest.fixture
def top(tmp_path: Path) -> Path:
    """A root-owned 0755 directory (tmp_path's parents are root's)."""
    d = tmp_path / "top"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    return d


def mine(p: Path, mode: int = 0o700, uid: int = ME) -> Path:
    p.mkdir()
    os.chown(p, uid, uid)
    os.chmod(p, mode)
    return p


def test_own_and_root_owned_directories_pass(top: Path) -> None:
    d = mine(mine(top / "home") / "cache")
    assert check_dir(d, "x", uid=ME) == d


def test_another_users_directory_on_the_way_is_refused_naming_it(top: Path) -> None:
    other = mine(top / "other", 0o755, OTHER)
    d = mine(other / "cache")
    with pytest.raises(UnsafePathError) as e:
        check_dir(d, "mount base", uid=ME)
    msg = str(e.value)
    assert "\n" not in msg and str(other) in msg and "another user" in msg
    assert msg.startswith("mount base: ")


def test_world_writable_not_sticky_is_refused(top: Path) -> None:
    shared = top / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    d = mine(shared / "base")
    with pytest.raises(UnsafePathError, match="writable by others"):
        check_dir(d, "x", uid=ME)


def test_below_a_sticky_dir_the_component_must_be_the_users_and_private(top: Path) -> None:
    tmp = top / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    ok = mine(tmp / "casfs-me")
    assert check_dir(ok, "x", uid=ME) == ok
    squatted = mine(tmp / "casfs-victim", 0o777, OTHER)  # made first by another user
    with pytest.raises(UnsafePathError, match="another user"):
        check_dir(squatted, "x", uid=ME)
    open_mine = mine(tmp / "casfs-open", 0o1777)
    with pytest.raises(UnsafePathError, match="below a sticky"):
        check_dir(open_mine / "x", "x", uid=ME, create_mode=0o700)


def test_missing_components_are_created_private_and_a_race_winner_is_refused(
        top: Path) -> None:
    tmp = top / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    made = check_dir(tmp / "casfs-0" / "ns", "x", create_mode=0o700)  # as root: uid 0
    assert made == tmp / "casfs-0" / "ns"
    assert (made.stat().st_mode & 0o7777, made.parent.stat().st_mode & 0o7777) == (0o700,) * 2
    # Someone else's directory at the name (made between lstat and mkdir, or before):
    mine(tmp / "casfs-61001", 0o700, OTHER)
    with pytest.raises(UnsafePathError, match="another user"):
        check_dir(tmp / "casfs-61001" / "ns", "x", uid=ME, create_mode=0o700)


def test_group_writable_only_with_a_group_of_the_users(top: Path) -> None:
    team = top / "team"
    team.mkdir()
    os.chown(team, 0, 7001)
    os.chmod(team, 0o2770)  # a group tenant's directory
    assert check_dir(team, "x", uid=ME, groups=[7001]) == team
    with pytest.raises(UnsafePathError, match="writable by group"):
        check_dir(team, "x", uid=ME, groups=[7002])


def test_symlinks_only_when_nobody_else_can_change_them(top: Path) -> None:
    real = mine(top / "real")
    (top / "link").symlink_to(real)  # root's, in a root-owned directory: like /var/run
    assert check_dir(top / "link", "x", uid=ME) == real
    tmp = top / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    planted = tmp / "casfs-61001"
    planted.symlink_to(real)
    os.lchown(planted, OTHER, OTHER)
    with pytest.raises(UnsafePathError, match="symlink"):
        check_dir(planted, "x", uid=ME)
    # Not a directory at all: refused, not followed or replaced.
    (top / "file").write_text("")
    with pytest.raises(UnsafePathError, match="not a directory"):
        check_dir(top / "file" / "x", "x", uid=ME, create_mode=0o700)


def test_a_shared_root_may_be_multi_user_but_its_ancestors_may_not(top: Path) -> None:
    root = mine(top / "root", 0o1777, OTHER)  # casfs init --multi-user, by another user
    assert check_dir(root, "shared root", uid=ME, shared=True) == root
    with pytest.raises(UnsafePathError):
        check_dir(root, "state dir", uid=ME)  # the same place is no state dir
    svc = mine(top / "svc-root", 0o755, OTHER)  # a service account's root, not writable
    assert check_dir(svc, "shared root", uid=ME, shared=True) == svc
    open_root = mine(top / "open-root", 0o777, OTHER)
    with pytest.raises(UnsafePathError, match="open-root"):
        check_dir(open_root, "shared root", uid=ME, shared=True)
    bad = mine(top / "bad", 0o777, OTHER)
    inner = mine(bad / "root", 0o1777)
    with pytest.raises(UnsafePathError, match="bad"):
        check_dir(inner, "shared root", uid=ME, shared=True)


def test_a_mountpoint_is_checked_by_its_parent_only(top: Path) -> None:
    base = mine(top / "base", uid=0)
    assert check_mountpoint(base / "triton", "x") == base / "triton"
    other = mine(top / "other", 0o777, OTHER)
    with pytest.raises(UnsafePathError):
        check_mountpoint(other / "triton", "x")


def test_a_state_dir_is_made_and_kept_private(tmp_path: Path) -> None:
    """``private_dir``: made 0700 (parents too); as root one open to others is closed."""
    from casfs.util.owned import private_dir

    fresh = tmp_path / "var" / "lib" / "casfs"
    assert private_dir(fresh, "state dir") == fresh
    assert fresh.stat().st_mode & 0o777 == 0o700
    wide = tmp_path / "wide"
    wide.mkdir()
    wide.chmod(0o751)
    private_dir(wide, "state dir")
    assert wide.stat().st_mode & 0o777 == (0o700 if os.geteuid() == 0 else 0o751)
