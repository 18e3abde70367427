"""Where packed objects live: pack and forward keys, and the locations rows name.

A manifest row of a packed object names its place in its extras,
``"pack": [pack_digest, offset, length]`` (docs/format.md, "Packs"), read by
``parse_location``. When gc repacks a pack, a forward record
``repacked/<2 hex>/<62 hex>`` says where its live members went
(casfs.store.packs writes it; ``load_forward`` reads it). Both the object
store (which follows a forward on a read) and the pack writer use these.

Layering: below casfs.store.objects and casfs.store.packs (both import it);
it imports only casfs.store.digests and casfs.store.backend.
"""

from __future__ import annotations

import logging

import zstandard

from casfs.errors import HostileManifestError
from casfs.store.backend import Backend, NotRegularFileError
from casfs.store.digests import DIGEST_RE
from casfs.util import jsonsafe

# Logged as the pack layer: the warning below is about a pack forward.
log = logging.getLogger("casfs.store.packs")

Location = tuple[str, int, int]  # (pack digest, offset, length)

# A member is a small object's stored form (<= SMALL_OBJECT + header, zstd or raw): a row
# claiming more is malformed (a ranged read allocates what the row says, before any check).
MAX_MEMBER_BYTES = 1 << 20

FORWARD_PREFIX = "repacked"
MAX_FORWARD_BYTES = 64 << 20
MAX_HOPS = 8  # forwards followed for one read (a pack repacked again and again)
MAX_PACK_OFFSET = 1 << 48  # far past any pack (~1 MiB; repacked, a few GiB at most)


def pack_key(digest: str) -> str:
    return f"packs/{digest[:2]}/{digest[2:]}"


def forward_key(pack: str) -> str:
    return f"{FORWARD_PREFIX}/{pack[:2]}/{pack[2:]}"


def parse_location(value: object) -> Location | None:
    """A manifest row's ``pack`` extras as (pack digest, offset, length); None if malformed."""
    if not isinstance(value, list | tuple) or len(value) != 3:
        return None
    pack, off, length = value
    if not isinstance(pack, str) or not DIGEST_RE.match(pack):
        return None
    if type(off) is not int or type(length) is not int or off < 0 or length <= 0:
        return None
    if off > MAX_PACK_OFFSET:  # a hostile row: 2**63 overflowed pread (a traceback)
        return None
    if length > MAX_MEMBER_BYTES:  # a hostile row: readers would allocate ``length``
        return None
    return pack, off, length


def load_forward(backend: Backend, pack: str) -> dict[str, Location] | None:
    """digest -> new location of ``pack``'s moved members; None if there is no (sound) forward."""
    try:
        with backend.open(forward_key(pack)) as f:
            raw = f.read(MAX_FORWARD_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError, NotRegularFileError):
        return None
    try:
        doc = jsonsafe.parse(zstandard.ZstdDecompressor().decompress(
            raw, max_output_size=MAX_FORWARD_BYTES), "forward")
        if doc.get("casfs_repacked") != 1 or doc.get("pack") != pack:
            raise ValueError("not this pack's forward")
        out: dict[str, Location] = {}
        for d, v in doc["members"].items():
            loc = parse_location(v)
            if loc is not None and DIGEST_RE.match(d):
                out[d] = loc
    except (ValueError, KeyError, TypeError, AttributeError, HostileManifestError,
            zstandard.ZstdError) as e:
        log.warning("ignoring damaged pack forward %s: %s", pack, e)
        return None
    return out
