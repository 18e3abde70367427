"""Compile seconds at publication: one row of each timed entry gets ``cs``.

The first miss of each entry comes from the mount (casfs.node.compiletime);
the figure runs from it to the newest mtime of the entry's rows in the
publication, and goes on the entry's commit record if the publication holds
one, else on that newest row (docs/format.md, "cs").
"""

from __future__ import annotations

from casfs.families import CacheRules
from casfs.store.entry import COMPILE_SECONDS, COMPILE_SECONDS_MAX, Entry


def compile_times(rules: CacheRules, rows: list[Entry],
                  first_miss: dict[str, int]) -> dict[str, tuple[str, float]]:
    """path -> (entry, compile seconds) for the one row of each timed entry in ``rows``."""
    groups: dict[str, list[Entry]] = {}
    for e in rows:
        entry = rules.entry_of(e.path)
        if entry is not None and entry in first_miss:
            groups.setdefault(entry, []).append(e)
    out: dict[str, tuple[str, float]] = {}
    for entry, group in groups.items():
        last = max(e.mtime_ns for e in group)
        seconds = round((last - first_miss[entry]) / 1e9, 3)
        if not 0 <= seconds <= COMPILE_SECONDS_MAX:
            continue  # a clock step, a file dated by the job (utime): no figure
        commit = [e for e in group if rules.is_commit_record(e.path)]
        row = max(commit or group, key=lambda e: (e.mtime_ns, e.path))
        out[row.path] = (entry, seconds)
    return out


def with_compile_times(rules: CacheRules, rows: list[Entry], first_miss: dict[str, int],
                       ) -> tuple[list[Entry], list[str]]:
    """``rows`` with ``cs`` on each timed entry's row; and the entries timed."""
    times = compile_times(rules, rows, first_miss)
    if not times:
        return rows, []
    out = []
    for e in rows:
        t = times.get(e.path)
        if t is not None:
            e = Entry(e.path, e.digest, e.size, e.mode, e.mtime_ns,
                      {**(e.extras or {}), COMPILE_SECONDS: t[1]})
        out.append(e)
    return out, sorted({entry for entry, _ in times.values()})
