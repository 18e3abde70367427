"""Each mount option's default lives in one place (casfs.node.options): the CLI's flags
and casfsd's TOML loader read it from there, so they never disagree."""

from __future__ import annotations

from pathlib import Path

from casfs.cli.main import build_parser
from casfs.daemon.config import load
from casfs.node.options import DEFAULTS


def test_the_cli_and_the_daemon_take_the_same_defaults(tmp_path: Path) -> None:
    args = build_parser("run").parse_args(["run", "--", "true"])
    for name in ("stable_after", "publish_interval", "refresh_interval", "fetch_timeout",
                 "mode", "wait_warm"):
        assert getattr(args, name) == getattr(DEFAULTS, name), name
    cfg = tmp_path / "casfs.toml"
    cfg.write_text(f'[store]\nroot = "{tmp_path}/root"\n[node]\nstate_dir = "{tmp_path}/s"\n')
    assert load(cfg).defaults == DEFAULTS
    assert args.allow_other is False and DEFAULTS.allow_other is True  # casfsd serves others


def test_a_prefetch_budget_of_zero_means_never_as_the_help_says() -> None:
    import pytest

    for cmd in ("run", "mount"):
        tail = ["--", "true"] if cmd == "run" else ["/tmp/x"]
        args = build_parser(cmd).parse_args([cmd, "--prefetch-budget", "0", *tail])
        assert args.prefetch_budget == 0
        assert build_parser(cmd).parse_args(
            [cmd, "--prefetch-budget", "64M", *tail]).prefetch_budget == 64 << 20
        with pytest.raises(SystemExit):  # a negative or malformed one is still refused
            build_parser(cmd).parse_args([cmd, "--prefetch-budget", "-5", *tail])
