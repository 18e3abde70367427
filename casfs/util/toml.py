"""Typed access to TOML tables, for configuration files: every error one line naming the key.

``Table`` wraps one table (``get`` a key through a converter, ``table`` a sub-table,
``finish`` refuses keys nobody asked for); ``as_*`` convert and check a value.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from casfs.errors import ConfigError

_BYTES_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)", re.IGNORECASE)
_UNITS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}


class Table:
    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a table, got {describe(data)}")
        self.data: dict[str, Any] = data
        self.where = where
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def has(self, name: str) -> bool:
        return name in self.data

    def get(self, name: str, conv: Callable[[Any, str], Any], default: Any = None) -> Any:
        self.used.add(name)
        if name not in self.data:
            return default
        return conv(self.data[name], self.key(name))

    def table(self, name: str) -> Table:
        self.used.add(name)
        return Table(self.data.get(name, {}), self.key(name))

    def finish(self) -> None:
        for k in self.data:
            if k not in self.used:
                raise ConfigError(f"{self.key(k)}: unknown key")


def describe(v: Any) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "a table"}.get(type(v), type(v).__name__)
    text = repr(v) if not isinstance(v, dict | list) else ""
    return f"{kind} {text[:40]}".strip()


def as_str(v: Any, key: str) -> str:
    if not isinstance(v, str):
        raise ConfigError(f"{key}: expected a string, got {describe(v)}")
    return v


def as_number(v: Any, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(f"{key}: expected a number of seconds, got {describe(v)}")
    if not math.isfinite(v):  # TOML has nan and inf: a wait of inf s never ends
        raise ConfigError(f"{key}: expected a finite number of seconds, got {v}")
    return float(v)


def as_positive(v: Any, key: str) -> float:
    x = as_number(v, key)
    if x <= 0:
        raise ConfigError(f"{key}: must be greater than 0, got {x:g}")
    return x


def as_non_negative(v: Any, key: str) -> float:
    x = as_number(v, key)
    if x < 0:
        raise ConfigError(f"{key}: must not be negative, got {x:g}")
    return x


def as_count(v: Any, key: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{key}: expected an integer, got {describe(v)}")
    if v < 1:
        raise ConfigError(f"{key}: must be at least 1, got {v}")
    return v


def as_bool(v: Any, key: str) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{key}: expected true or false, got {describe(v)}")
    return v


def as_bytes(v: Any, key: str) -> int:
    """An integer, or a string such as "20GiB", "500M", "1.5T" (K/M/G/T are powers of 1024;
    KB/MB/GB/TB powers of 1000)."""
    if isinstance(v, int) and not isinstance(v, bool):
        n = v
    elif isinstance(v, str) and (m := _BYTES_RE.fullmatch(v.strip())):
        num, unit, suffix = m.groups()
        base = 1000 if suffix.upper() == "B" and unit else 1024
        n = int(float(num) * base ** _UNITS[unit.upper()])
    else:
        raise ConfigError(f"{key}: expected a byte count such as 20GiB, got {describe(v)}")
    if n <= 0:
        raise ConfigError(f"{key}: must be greater than 0")
    return n


def as_abs_path(v: Any, key: str) -> Path:
    s = as_str(v, key)
    if not s or "\0" in s:
        raise ConfigError(f"{key}: expected a path")
    if not os.path.isabs(s):
        raise ConfigError(f"{key}: must be an absolute path, got {s!r}")
    return Path(os.path.normpath(s))


def as_str_list(v: Any, key: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise ConfigError(f"{key}: expected an array of non-empty strings, got {describe(v)}")
    return tuple(v)


def read_file(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
