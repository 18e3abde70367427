"""The one line `casfs run` prints per cache: what an operator reads first after a job."""

from __future__ import annotations

from casfs.cli.mount_cmds import summary_line


def test_summary_line_names_conflicts_only_when_there_are_some() -> None:
    st = {"namespace": "inductor-x", "restored_entries": 5, "last_publish": {"seq": 3},
          "counters": {"lookup_lower": 7, "promoted_files": 2, "files_published": 2}}
    line = summary_line("inductor", st)
    assert line.startswith("inductor: restored 5 entries, 7 lookups served")
    assert "(inductor-x@3)" in line and "conflicted" not in line
    st["counters"]["publish_conflicts"] = 4
    assert "4 paths conflicted (another node's version kept" in summary_line("inductor", st)


def test_summary_line_when_the_mount_process_died() -> None:
    assert summary_line("triton", None) == "triton: no statistics (the mount process died)"
