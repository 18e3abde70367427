"""The namespace-name rule, in one place (docs/format.md, "Namespaces"): 1-128 of
``[A-Za-z0-9._-]``, starting with a letter, a digit or ``_`` (never ``-``, which reads
as an option, nor ``.``, a hidden or relative name). On the shared root a name may
carry its tenant, ``<tenant>~<name>`` (casfs.tenants); the store checks that form."""

from __future__ import annotations

import re

from casfs.errors import UsageError

NAMESPACE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
RULE = "1-128 of [A-Za-z0-9._-], starting with a letter, digit or '_'"


def is_namespace(name: object) -> bool:
    return isinstance(name, str) and NAMESPACE_RE.fullmatch(name) is not None


def check_namespace(name: object, what: str = "namespace") -> str:
    """``name`` if it is a valid namespace name; UsageError naming the rule otherwise."""
    if not is_namespace(name):
        raise UsageError(f"invalid {what} {name!r:.80}: use {RULE}")
    assert isinstance(name, str)
    return name
