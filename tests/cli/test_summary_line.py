"""The one line `casfs run` prints per cache: what an operator reads first after a job;
`--wait-warm` refused outside overlay mode."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from casfs.cli.summary import summary_line


def test_summary_line_names_conflicts_only_when_there_are_some() -> None:
    st = {"namespace": "inductor-x", "restored_entries": 5, "last_publish": {"seq": 3},
          "counters": {"lookup_lower": 7, "promoted_files": 2, "files_published": 2}}
    line = summary_line("inductor", st)
    assert line.startswith("inductor: restored 5 entries, 7 lookups served")
    assert "(inductor-x@3)" in line and "conflicted" not in line
    st["counters"]["publish_conflicts"] = 4
    assert "4 paths conflicted (another node's version kept" in summary_line("inductor", st)


def test_summary_line_of_a_namespace_kept_for_its_grace() -> None:
    st = {"namespace": "u1001~generic-x", "counters": {"files_published": 1}, "kept_s": 60.0}
    line = summary_line("generic", st)
    assert line.startswith("generic: restored 0 entries") and "1 published" in line
    assert line.endswith("; served 60 s more for a next job on this node, then released")
    assert "another job" not in line


def test_summary_line_when_the_mount_process_died() -> None:
    assert summary_line("triton", None) == "triton: no statistics (the mount process died)"


def test_summary_line_reports_both_readiness_points() -> None:
    st: dict = {"namespace": "triton-x", "counters": {}, "mount_ready_s": 1.5,
                "warm_ready_s": 1.25}
    assert summary_line("triton", st).endswith("; mount-ready 1.50s, warm-ready 1.25s")
    st["warm_ready_s"] = None
    st["counters"]["warm_wait_timeouts"] = 1
    assert summary_line("triton", st).endswith("not warm-ready (--wait-warm timed out)")


def test_wait_warm_needs_overlay_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from casfs.cli.main import main

    rc = main(["--root", str(tmp_path / "root"), "--state-dir", str(tmp_path / "state"),
               "mount", str(tmp_path / "mnt"), "--namespace", "ns", "--wait-warm=5"])
    assert rc != 0
    assert "--wait-warm needs --mode overlay" in capsys.readouterr().err
    assert not (tmp_path / "state" / "run").exists()  # refused before any mount started


def test_the_summarys_look_at_the_root_gives_up_on_a_root_that_does_not_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The miss hints read the shared root in `casfs run`'s own process: a stalled root
    (a dead hard NFS mount) held the job's exit status for as long as it stalled (a
    review: 231 s after the job; for good if it never answers). Given up after 5 s."""
    import threading
    import time

    from casfs.cli import summary

    stalled = threading.Event()
    monkeypatch.setattr(summary, "miss_hints", lambda look: stalled.wait(60) and [])
    t = time.monotonic()
    hints, causes = summary.bounded_look(cast(summary.RootLook, object()), limit=0.5)
    assert (hints, causes) == ([], {}) and time.monotonic() - t < 5
    stalled.set()
    monkeypatch.setattr(summary, "miss_hints", lambda look: ["a hint"])
    monkeypatch.setattr(summary, "miss_causes", lambda look: {"ns": "cause"})
    assert summary.bounded_look(cast(summary.RootLook, object())) == (["a hint"], {"ns": "cause"})

