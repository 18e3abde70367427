"""Digests: how every object, manifest and pack in a shared root is named.

A name is the blake3-256 hex digest of the bytes it names (an object's
*uncompressed* content; a pack's whole blob), and a loose object lives at
``objects/<2 hex>/<62 hex>`` (docs/format.md).

Layering: this module imports nothing from casfs.store; casfs.store.packloc,
casfs.store.objects, casfs.store.packs and everything above them import it.
"""

from __future__ import annotations

import re

import blake3

from casfs.errors import CorruptObjectError

DIGEST_RE = re.compile(r"^[0-9a-f]{64}\Z")  # \Z: "$" lets a trailing "\n" through


def digest_bytes(data: bytes) -> str:
    # blake3's own threading only pays for multi-MB inputs; compiler artefacts
    # are mostly a few KB, so hash single-threaded.
    return blake3.blake3(data).hexdigest()


def check_digest(digest: object) -> str:
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise CorruptObjectError(f"not a blake3 hex digest: {digest!r:.80}")
    return digest


def object_key(digest: str) -> str:
    return f"objects/{digest[:2]}/{digest[2:]}"
