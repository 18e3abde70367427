"""Fixtures for store tests: a fresh shared root per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from casfs.store.root import SharedRoot


@pytest.fixture
def root(tmp_path: Path) -> SharedRoot:
    return SharedRoot.open(tmp_path / "root", create=True)
