"""The cache-family registry: the only place that names a family.

Each family is one module of this package declaring a ``FAMILY``
(``casfs.families.base.Family``). Adding a family = one module, one line in
``_MODULES`` and its tests. The rest of casfs asks here: ``names()``,
``get(name)``, ``rules(name)``, ``env_for(...)``.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable, Mapping

from casfs.errors import UsageError
from casfs.families.base import HOST_INGREDIENTS, MAX_PARSED_BYTES, Family, too_large_to_parse
from casfs.families.rules import CacheRules, Relocator, walk_files

__all__ = [
    "DEFAULT_DAEMON",
    "FALLBACK",
    "HOST_INGREDIENTS",
    "MAX_PARSED_BYTES",
    "CacheRules",
    "Family",
    "Relocator",
    "check",
    "env_for",
    "get",
    "names",
    "rules",
    "too_large_to_parse",
    "walk_files",
]

# Registration order is the order of `casfs key` and of the docs.
_MODULES = ("triton", "inductor", "vllm", "flashinfer", "cuda", "cutedsl", "deepgemm",
            "tilelang", "sglang", "generic")
# Families the zero-config daemon mounts (one mount process each, statically).
DEFAULT_DAEMON = ("triton", "inductor")
# The family of a cache casfs has no family for (a mount named after no family).
FALLBACK = "generic"

_REGISTRY: dict[str, Family] = {}
_LOADING = threading.Lock()


def _load() -> dict[str, Family]:
    """The registry, filled once and whole: a thread asking while another fills it
    waits, and never sees it half filled (it would find no such family)."""
    if not _REGISTRY:
        with _LOADING:
            if not _REGISTRY:
                loaded: dict[str, Family] = {}
                for mod in _MODULES:
                    fam: Family = importlib.import_module(f"casfs.families.{mod}").FAMILY
                    assert fam.name == mod, f"casfs.families.{mod} declares {fam.name!r}"
                    loaded[fam.name] = fam
                _REGISTRY.update(loaded)  # one step under the GIL
    return _REGISTRY


def names() -> tuple[str, ...]:
    return tuple(_load())


def default_run() -> tuple[str, ...]:
    """What ``casfs run``/``casfs env`` serve when no family is named: every family.

    One mount process serves them all (a directory each), so a cache the job
    never uses costs a directory, not a process.
    """
    return names()


def check(name: str) -> str:
    """Return ``name`` if it is a family; UsageError listing the families otherwise."""
    if name not in _load():
        raise UsageError(f"unknown cache family {name!r}; expected one of {', '.join(names())}")
    return name


def get(name: str) -> Family:
    return _load()[check(name)]


def closure(name: str) -> list[Family]:
    """The family, then every family it includes (transitively), each once."""
    out: list[Family] = []
    todo = [name]
    while todo:
        fam = get(todo.pop(0))
        if fam not in out:
            out.append(fam)
            todo.extend(fam.includes)
    return out


def rules(name: str, extra_patterns: Iterable[str] = ()) -> CacheRules:
    return CacheRules(closure(name), extra_patterns)


def env_for(family_dirs: Mapping[str, str], job_env: Mapping[str, str],
            companions: bool = False) -> dict[str, str]:
    """The variables to add to ``job_env`` so each family's tools use its directory.

    A variable the job already set is never overridden (the job knows where
    its cache is); companions are set only when asked for, and never over
    the job's own value either.
    """
    out: dict[str, str] = {}
    for name, directory in family_dirs.items():
        fam = get(name)
        for var in fam.env_vars:
            if var not in job_env and var not in out:
                out[var] = directory
        if companions:
            for var, value in fam.companions.items():
                if var not in job_env and var not in out:
                    out[var] = value
    return out
