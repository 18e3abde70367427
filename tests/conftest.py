"""Shared fixtures: every test gets its own shared root and node state dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def casfs_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
    """Point CASFS_ROOT and CASFS_STATE_DIR at fresh dirs under tmp_path (never the user's)."""
    root = tmp_path / "root"
    state = tmp_path / "state"
    monkeypatch.setenv("CASFS_ROOT", str(root))
    monkeypatch.setenv("CASFS_STATE_DIR", str(state))
    yield {"root": root, "state": state}
