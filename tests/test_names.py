"""Namespace names: one rule (casfs.util.names, docs/format.md), enforced the same by
the CLI, the daemon's config and the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from casfs.daemon.config import load
from casfs.errors import ConfigError, UsageError
from casfs.fingerprint import check_namespace
from casfs.util.names import is_namespace

GOOD = ["triton-ab12", "a", "_private", "x.y_z-1", "A" * 128]
BAD = ["-rf", ".hidden", "", "a/b", "a~b", "é", "A" * 129, "a\n", "..", "sp ace"]


@pytest.mark.parametrize("name", GOOD)
def test_good_names(name: str) -> None:
    assert is_namespace(name) and check_namespace(name) == name


@pytest.mark.parametrize("name", BAD)
def test_bad_names_are_refused_with_the_rule(name: str) -> None:
    assert not is_namespace(name)
    with pytest.raises(UsageError, match="starting with a letter, digit or '_'"):
        check_namespace(name)


def test_the_daemon_config_refuses_a_leading_dash(tmp_path: Path) -> None:
    cfg = tmp_path / "casfs.toml"
    cfg.write_text(f'[store]\nroot = "{tmp_path}/root"\n[node]\nstate_dir = "{tmp_path}/s"\n'
                   '[[mounts]]\nname = "t"\nfamily = "triton"\nnamespace = "-rf"\n')
    with pytest.raises(ConfigError, match="namespace"):
        load(cfg)


def test_the_store_agrees() -> None:
    from casfs.store.generations import check_name

    for name in GOOD:
        assert check_name(name) == name
    for name in BAD:
        if name == "a~b":
            assert check_name(name) == name  # on the root: namespace b of tenant a
            continue
        with pytest.raises(UsageError):
            check_name(name)
