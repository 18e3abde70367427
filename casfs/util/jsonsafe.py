"""JSON parsing of hostile input: every failure is one HostileManifestError.

``json.loads`` raises ValueError for bad syntax, UnicodeDecodeError for bad
bytes and RecursionError for deep nesting (200 KB of ``[`` is under every
size cap): all three mean "damaged", and must be handled like any other
damage rather than escaping as a traceback.

Python's json also accepts ``NaN``, ``Infinity`` and ``-Infinity`` (not JSON)
and turns ``1e400`` into infinity: ``int()`` of such a value raises
OverflowError/ValueError wherever a reader converts it, so ``parse`` refuses
them. Integers of up to 4300 digits still parse: a reader bounds each number
it converts or writes back (``count``, ``real``).
"""

from __future__ import annotations

import json
import math
from typing import Any

from casfs.errors import HostileManifestError

MAX_COUNT = 1 << 53  # counts above this lose precision as floats and in other JSON readers
MAX_REAL = 1e18  # far past any time, size or count a casfs document holds


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"number {text[:40]} out of range")
    return v


def parse(data: bytes | str, what: str, *, finite: bool = True) -> Any:
    """``finite`` False: NaN and infinities parse (a manifest: a row's value that is not a
    figure is ignored by the one reader of it, never the whole manifest's damage)."""
    try:
        if not finite:
            return json.loads(data)
        return json.loads(data, parse_constant=_constant, parse_float=_finite)
    except RecursionError:
        raise HostileManifestError(f"{what}: JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise HostileManifestError(f"{what}: not valid JSON ({str(e)[:120]})") from None


def count(v: object) -> int | None:
    """``v`` if it is an int (not a bool) in [0, MAX_COUNT); else None."""
    return v if type(v) is int and 0 <= v < MAX_COUNT else None


def real(v: object, limit: float = MAX_REAL) -> float | None:
    """``v`` as a float if it is a number (not a bool) within +-``limit``; else None.

    A 4300-digit int compares fine but overflows ``float()``; NaN fails the bound."""
    if type(v) is not int and type(v) is not float:
        return None
    return float(v) if -limit <= v <= limit else None
