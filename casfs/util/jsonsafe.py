"""JSON parsing of hostile input: every failure is one HostileManifestError.

``json.loads`` raises ValueError for bad syntax, UnicodeDecodeError for bad
bytes and RecursionError for deep nesting (200 KB of ``[`` is under every
size cap): all three mean "damaged", and must be handled like any other
damage rather than escaping as a traceback.
"""

from __future__ import annotations

import json
from typing import Any

from casfs.errors import HostileManifestError


def parse(data: bytes | str, what: str) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise HostileManifestError(f"{what}: JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise HostileManifestError(f"{what}: not valid JSON ({str(e)[:120]})") from None
