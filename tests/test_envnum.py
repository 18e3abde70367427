"""casfs.util.envnum: a CASFS_* number set wrong is the default and one warning."""

from __future__ import annotations

import logging

import pytest

from casfs.node import client, promoteproc
from casfs.store import manifest, objects
from casfs.util import envnum

pytestmark = pytest.mark.expect_log(r"CASFS_\w+=.* is not (a number|an integer)")


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envnum, "_warned", set())


@pytest.mark.parametrize("bad", ["abc", "nan", "inf", "-5", "0"])
def test_a_bad_seconds_value_is_the_default_and_said_once(
        bad: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("CASFS_LEASE_TIMEOUT", bad)
    monkeypatch.setenv("CASFS_PROMOTE_HANG_AFTER", bad)
    with caplog.at_level(logging.WARNING, logger="casfs.util.envnum"):
        assert client.lease_timeout() == client.DEFAULT_LEASE_TIMEOUT
        assert client.lease_timeout() == client.DEFAULT_LEASE_TIMEOUT
        assert promoteproc.hang_after() == promoteproc.HANG_AFTER
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said  # once per variable, not per call
    assert said[0].startswith(f"CASFS_LEASE_TIMEOUT={bad!r} is not a number > 0")


def test_good_values_are_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASFS_LEASE_TIMEOUT", "2.5")
    monkeypatch.setenv("CASFS_MAX_OBJECT_BYTES", "4096")
    monkeypatch.setenv("CASFS_MAX_MANIFEST_BYTES", " 1048576 ")
    assert client.lease_timeout() == 2.5
    assert objects.max_object_bytes() == 4096
    assert manifest.max_manifest_bytes() == 1 << 20
    monkeypatch.delenv("CASFS_LEASE_TIMEOUT")
    assert client.lease_timeout() == client.DEFAULT_LEASE_TIMEOUT  # unset: no warning


@pytest.mark.parametrize("bad", ["0", "-1", "1e6", "lots"])
def test_a_size_limit_set_wrong_does_not_stop_promotion(
        bad: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """CASFS_MAX_OBJECT_BYTES=0 refused every object (nothing promoted, no reason)."""
    monkeypatch.setenv("CASFS_MAX_OBJECT_BYTES", bad)
    monkeypatch.setenv("CASFS_MAX_MANIFEST_BYTES", bad)
    with caplog.at_level(logging.WARNING, logger="casfs.util.envnum"):
        assert objects.max_object_bytes() == objects.DEFAULT_MAX_OBJECT_BYTES
        assert manifest.max_manifest_bytes() == manifest.DEFAULT_MAX_MANIFEST_BYTES
    assert any("CASFS_MAX_OBJECT_BYTES" in r.getMessage() for r in caplog.records)


@pytest.mark.expect_log(r"CASFS_ROOT is set but empty: using the default shared root")
def test_an_empty_root_variable_is_said(monkeypatch: pytest.MonkeyPatch,
                                        caplog: pytest.LogCaptureFixture) -> None:
    """`CASFS_ROOT=$UNSET_VAR` silently published into this node's own default root."""
    from casfs.util import defaults

    monkeypatch.setattr(defaults, "_said", set())
    monkeypatch.setenv("CASFS_ROOT", "")
    with caplog.at_level(logging.WARNING, logger="casfs.util.defaults"):
        assert defaults.default_root() == defaults.default_root()  # the default, said once
    assert [r.getMessage() for r in caplog.records if "CASFS_ROOT" in r.getMessage()] == [
        f"CASFS_ROOT is set but empty: using the default shared root"
        f" {defaults.default_root()} (this node's alone)"]
    monkeypatch.delenv("CASFS_ROOT")
    defaults.default_root()  # unset: nothing said
