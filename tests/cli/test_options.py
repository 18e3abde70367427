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
