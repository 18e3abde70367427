"""Numbers from CASFS_* environment variables: a bad value is one warning, never silent.

A variable that is set but not a finite number above its floor falls back to the
default, and says so once per process (an operator who set it wants to know it
was not used); unset or empty is simply the default.
"""

from __future__ import annotations

import logging
import math
import os

log = logging.getLogger(__name__)
_warned: set[str] = set()


def env_float(name: str, default: float, *, above: float = 0.0) -> float:
    """$name as a finite number > ``above``, else ``default``."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value > above:
        return value
    _fallback(name, text, default, f"a number > {above:g}")
    return default


def env_int(name: str, default: int, *, least: int = 1) -> int:
    """$name as an integer >= ``least``, else ``default``."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if text.isdigit() and int(text) >= least:
        return int(text)
    _fallback(name, text, default, f"an integer >= {least}")
    return default


def _fallback(name: str, text: str, default: float, want: str) -> None:
    if name not in _warned:
        _warned.add(name)
        log.warning("%s=%r is not %s: using the default, %s", name, text[:40], want,
                    default)
