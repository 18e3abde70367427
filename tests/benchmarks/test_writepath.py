"""bench/writepath.py's client writes, run for real at a small size: every target of the
row is computed from passes of the same round, the overlay mode's against a bare
overlayfs written beside it (its floor), not against a plain dir alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from fusehelpers import require_fuse

from bench import writepath
from bench.common import Settings
from casfs.view import overlay

pytestmark = pytest.mark.fuse


def test_the_write_row_holds_each_mode_to_its_floor(tmp_path: Path) -> None:
    require_fuse()
    if overlay.unavailable_reason() is not None:
        pytest.fail(f"overlayfs is required here: {overlay.unavailable_reason()}")
    res = writepath.client_writes(Settings(quick=True, workdir=tmp_path, repeats=1), 4)
    verdicts = {t.metric: v for t, v in zip(res.targets, res.verdicts(), strict=True)}
    assert set(verdicts) == {"casfs_over_floor", "overlay_over_bare_overlay",
                             "promotion_mb_per_s"}
    assert all(v["value"] is not None for v in verdicts.values()), verdicts
    raw = res.raw
    assert len(raw["bare_overlay"]) == len(raw["overlay"]) == 1
    assert raw["bare_overlay"][0]["files"] == raw["plain"][0]["files"] > 0
    assert res.ratios["overlay_over_bare_overlay"] == round(
        raw["overlay"][0]["seconds"] / raw["bare_overlay"][0]["seconds"], 2)
    assert str(tmp_path) not in Path("/proc/mounts").read_text()  # every mount undone
