"""Each syscall family: the same sequence on a plain directory and through each view mode.

Results must agree errno for errno, as root and as a second uid (a real user
created for the test; the fuse mount uses allow_other and default_permissions),
and the trees left behind must be identical. See scenarios.py for what each
family does; docs/reliability.md ("POSIX conformance") for the public suite.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .conftest import User
from .scenarios import FAMILIES, Ctx, listing

pytestmark = [pytest.mark.fuse]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("mode", ["fuse", "dir"])
def test_same_as_plain_directory(
    mode: str, family: str, request: pytest.FixtureRequest, plain_root: Path,
    second_user: User,
) -> None:
    view: Path = request.getfixturevalue(f"{mode}_view")
    scenario = FAMILIES[family]
    results = []
    for base in (plain_root / mode / family, view / family):
        os.chmod(base, 0o777)
        old = os.umask(0o022)
        try:
            got = scenario(Ctx(str(base), second_user.uid, second_user.gid))
        finally:
            os.umask(old)
        results.append((got, listing(str(base))))
    (plain, plain_tree), (seen, seen_tree) = results
    assert seen == plain
    assert seen_tree == plain_tree
