"""Output helpers: JSON for scripts, aligned text for people, progress bars on terminals."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from casfs.node.logfmt import one_line


def emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=1, sort_keys=True, default=str)
    sys.stdout.write("\n")


def table(rows: Sequence[Sequence[Any]], header: Sequence[str] | None = None) -> None:
    # one_line: cells may hold what a tenant wrote on the root (a node name in a record,
    # a path); a terminal's escape sequence or a newline there is shown escaped
    all_rows = [[one_line(str(c)) for c in r] for r in ([header] if header else []) + list(rows)]
    if not all_rows:
        return
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(all_rows[0]))]
    for r in all_rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class Progress:
    """advance(n) and set_total(n); a rich bar on a terminal, nothing otherwise."""

    def __init__(self, advance: Callable[[int], None], set_total: Callable[[int], None]) -> None:
        self.advance = advance
        self.set_total = set_total


@contextlib.contextmanager
def progress(
    description: str, total: int | None = None, enabled: bool = True
) -> Iterator[Progress]:
    if not enabled or not sys.stderr.isatty():
        yield Progress(lambda n: None, lambda n: None)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as RichProgress

    with RichProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)
        yield Progress(
            lambda n: bar.advance(task, n), lambda n: bar.update(task, total=n)
        )
