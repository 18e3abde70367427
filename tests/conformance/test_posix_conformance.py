"""Each syscall family: the same sequence on a plain directory and through each view mode.

Results must agree errno for errno, as root and as a second uid (a real user
created for the test; the fuse mount uses allow_other and default_permissions),
and the trees left behind must be identical. See scenarios.py for what each
family does; docs/reliability.md ("POSIX conformance") for the public suite.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from .conftest import User
from .scenarios import FAMILIES, INITIAL, OVERLAY, Ctx, listing, same_ino, set_mode

pytestmark = [pytest.mark.fuse]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("mode", ["fuse", "dir", "overlay"])
def test_same_as_plain_directory(
    mode: str, family: str, request: pytest.FixtureRequest, plain_root: Path,
    second_user: User,
) -> None:
    view: Path = request.getfixturevalue(f"{mode}_view")
    scenario = FAMILIES[family]
    results = []
    set_mode(mode)
    try:
        for base in (plain_root / mode / family, view / family):
            os.chmod(base, 0o777)
            old = os.umask(0o022)
            try:
                got = scenario(Ctx(str(base), second_user.uid, second_user.gid, mode))
            finally:
                os.umask(old)
            results.append((got, listing(str(base))))
    finally:
        set_mode("fuse")
    (plain, plain_tree), (seen, seen_tree) = results
    assert seen == plain, [(v, p) for v, p in zip(seen, plain, strict=True) if v != p]
    assert seen_tree == plain_tree, [
        (v, p) for v, p in zip(seen_tree, plain_tree, strict=False) if v != p]


def test_overlay_documented_deviations(overlay_view: Path) -> None:
    """The overlay mode differs from a plain directory exactly where overlayfs says it does."""
    base = overlay_view / "deviations"
    base.mkdir()
    (base / "d").mkdir()
    assert os.stat(overlay_view / "rename" / "ld").st_nlink == 1  # merged dir (plain: 3)
    assert os.stat(base).st_nlink == 3  # a pure upper dir counts its subdirs
    lower_dir = overlay_view / "bind" / "ld"
    assert {k.split("/")[1] for k in INITIAL if k.startswith("ld/")} <= set(os.listdir(lower_dir))
    with pytest.raises(OSError) as exc:
        os.rename(lower_dir, base / "moved")
    assert exc.value.errno == errno.EXDEV
    os.link(overlay_view / "rmdir" / "lf2", base / "lf2-link")
    assert os.stat(base / "lf2-link").st_nlink == 2
    assert not same_ino(str(overlay_view / "rmdir" / "lf2"), str(base / "lf2-link"))
    with pytest.raises(OSError) as exc:  # plain: a no-op (same file)
        os.rename(base / "lf2-link", overlay_view / "rmdir" / "lf2")
    assert exc.value.errno == errno.ESTALE
    assert OVERLAY == "overlay"
