"""An S3 root's staging directory is the node state dir's, never a fixed name in /tmp.

Every process with an ``s3://`` root stages objects, packs and records on local
disk before it uploads them. Before, that was ``/tmp/casfs-s3-staging-<uid>``
unless CASFS_STATE_DIR was set, and casfsd never set it: another user who made
``/tmp/casfs-s3-staging-0`` first (0777) could read everything root staged
there, swap a staged file for her own bytes before root uploaded it under the
victim's digest, or make it a file and stop every S3 root from opening (found by
a review on 2026-12-06). Now it is ``<state dir>/s3-staging``, checked and made
like the state dir (casfs.util.owned): hers there is refused in one line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs.errors import ConfigError
from casfs.store.s3backend import S3Backend
from casfs.util.location import parse_location
from tests.users import RealUser, open_tmp, real_users

LOC = "s3://bucket/root?endpoint=http://127.0.0.1:9"


@pytest.fixture
def setting() -> Iterator[tuple[RealUser, Path]]:
    with open_tmp() as d, real_users(1, d) as users:
        yield users[0], d


def _backend() -> S3Backend:
    loc = parse_location(LOC)
    assert not isinstance(loc, Path)
    return S3Backend(loc)


def test_a_planted_tmp_staging_dir_is_never_used(setting: tuple[RealUser, Path],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    user, d = setting
    planted = Path("/tmp") / f"casfs-s3-staging-{os.getuid()}"
    made = False
    if not planted.exists():  # hers, 0777, as she would make it before root's first upload
        user.sh(f"mkdir -m 0777 {planted}", check=True)
        made = True
    try:
        state = d / "state"
        monkeypatch.setenv("CASFS_STATE_DIR", str(state))
        staging = _backend().staging_dir
        assert staging == state / "s3-staging"
        st = staging.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (os.getuid(), 0o700)
    finally:
        if made:
            planted.rmdir()


def test_her_staging_dir_in_the_state_dir_is_refused_in_one_line(
        setting: tuple[RealUser, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    user, d = setting
    state = d / "state"
    state.mkdir(mode=0o755)
    (state / "s3-staging").mkdir(mode=0o777)
    os.chown(state / "s3-staging", user.uid, user.gid)
    monkeypatch.setenv("CASFS_STATE_DIR", str(state))
    with pytest.raises(ConfigError) as e:
        _backend()
    assert "S3 staging directory" in e.value.message and "\n" not in e.value.message


def test_casfsd_gives_its_children_its_state_dir(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """casfsd exports its configured state dir: its mount processes and workers (which
    inherit CASFS_* variables) stage there, not in a default of their own."""
    from casfs.daemon import main as dmain
    from casfs.errors import CasfsError

    seen: dict[str, str | None] = {}

    class Stop:  # stands in for the daemon: records what its children would inherit
        def __init__(self, *a: object, **k: object) -> None:
            seen["env"] = os.environ.get("CASFS_STATE_DIR")
            raise CasfsError("stopped here")

    monkeypatch.delenv("CASFS_STATE_DIR", raising=False)
    monkeypatch.setattr(dmain, "Daemon", Stop)
    state = tmp_path / "configured-state"
    cfg = tmp_path / "casfs.toml"
    cfg.write_text(f'[store]\nroot = "{tmp_path / "root"}"\n[node]\nstate_dir = "{state}"\n')
    assert dmain.main(["--config", str(cfg)]) != 0
    assert seen["env"] == str(state)
