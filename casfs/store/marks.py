"""gc marks: the objects one gc run found unreferenced (phase 1 of casfs.store.maintenance.gc).

    gc/marks/<created, 12 digits>-<32 hex>    zstd(JSON) {"casfs_gc_mark": 1, "created": t,
                                                         "digests": [hex, ...],
                                                         "packs": [hex, ...]}

A mark is created once (create-only) and deleted by the sweep that acts on
it. One gc run writes as many marks as it needs, each naming at most
``MARK_NAMES`` objects and packs. Its age is taken from the storage's own
timestamp of the mark (the clock that also stamps objects), not from the
writer's clock. Publishers read marks (``Condemned``) to learn which re-used
objects they must write again.

Anyone who can write the root can plant a mark, so a mark is read as exactly
the shape ``write`` gives it (both lists sorted, every name 64 hex), streamed,
never as a JSON tree: a zstd bomb of ``[[],[],...]`` cost 24x its decompressed
size in every publisher. A mark of another shape, or naming more than
``MAX_MARK_NAMES``, is damage: ignored by publishers and by gc alike (so it
condemns nothing and is never swept), logged.
"""

from __future__ import annotations

import binascii
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, cast

import zstandard

from casfs.store.backend import Backend, NotRegularFileError

log = logging.getLogger(__name__)

PREFIX = "gc/marks"
NAME_RE = re.compile(r"^\d{12}-[0-9a-f]{32}\Z")
# A name is 68 bytes of a mark's JSON ('"<64 hex>", '), 32 bytes held per name
# (packed). gc splits what it marks into marks of MARK_NAMES; readers refuse a
# mark of more than MAX_MARK_NAMES (twice that: a mark before the split, from
# an older release, of up to 2 Mi unreferenced objects is still read). A mark
# of MAX_MARK_NAMES is 136 MiB of JSON, streamed, and 64 MiB held.
MARK_NAMES = 1 << 20
MAX_MARK_NAMES = 2 * MARK_NAMES
_NAME_JSON = 68
_HEAD_MAX = 128  # '{"casfs_gc_mark": 1, "created": <number>, "digests": ['
MAX_MARK_BYTES = _HEAD_MAX + 32 + MAX_MARK_NAMES * _NAME_JSON  # decompressed
MAX_MARK_RAW = MAX_MARK_BYTES  # hex compresses ~2x: a real mark is about half this
# The names a publisher keeps (packed, 32 bytes each: 256 MiB) across the marks of
# one listing. Marks beyond are not ignored (gc would still act on them): they are
# read again at each publication, one at a time, and only its own names kept.
MAX_HELD_NAMES = 4 * MAX_MARK_NAMES
_CHUNK = 1 << 20
# Object stores stamp whole seconds: an object written in the mark's second may
# look older than the mark. Within this slack it counts as written after it (kept).
MTIME_SLACK = 2.0
# How often a publisher re-lists marks. gc's grace must exceed this plus the
# longest publication, so every publisher sees a mark before it is swept.
LIST_TTL = 30.0


@dataclass(frozen=True, slots=True)
class Mark:
    name: str
    created: float  # the storage's timestamp of the mark object
    digests: frozenset[str]
    packs: frozenset[str] = frozenset()  # pack objects (casfs.store.packs) it names

    def spares(self, mtime: float) -> bool:
        """Whether an object with this mtime was (possibly) written after the mark."""
        return mtime >= self.created - MTIME_SLACK


def write(backend: Backend, digests: Iterable[str], created: float,
          packs: Iterable[str] = ()) -> list[str]:
    """Mark ``digests`` and ``packs``: one mark per ``MARK_NAMES`` of them (readers
    refuse a bigger one). Returns the marks' names."""
    ds, ps = sorted(digests), sorted(packs)
    names: list[str] = []
    while ds or ps or not names:
        take_d = ds[:MARK_NAMES]
        take_p = ps[:MARK_NAMES - len(take_d)]
        ds, ps = ds[len(take_d):], ps[len(take_p):]
        name = f"{int(created):012d}-{uuid.uuid4().hex}"
        doc = {"casfs_gc_mark": 1, "created": created, "digests": take_d, "packs": take_p}
        data = zstandard.ZstdCompressor(level=3).compress(json.dumps(doc).encode())
        backend.create_exclusive(f"{PREFIX}/{name}", data)
        names.append(name)
    return names


def remove(backend: Backend, mark: Mark) -> None:
    backend.delete(f"{PREFIX}/{mark.name}")


class DamagedMarkError(ValueError):
    pass


_HEAD_RE = re.compile(rb'\{"casfs_gc_mark": 1, "created": -?\d{1,20}(?:\.\d{1,20})?'
                      rb'(?:e[-+]?\d{1,3})?, "digests": \[')
_ITEM_RE = re.compile(rb'"([0-9a-f]{64})"(, |\])')
_PACKS = b', "packs": ['


class _CappedReader:
    """A file read through, refused past ``cap`` bytes (a mark's raw size)."""

    def __init__(self, f: BinaryIO, cap: int) -> None:
        self.f, self.left = f, cap

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(_CHUNK if n < 0 else min(n, _CHUNK))
        self.left -= len(data)
        if self.left < 0:
            raise DamagedMarkError(f"over {MAX_MARK_RAW} bytes")
        return data


def _parse(f: BinaryIO) -> tuple[bytes, bytes]:
    """The digests and packs of a mark, each packed (32 bytes a name, ascending).

    Streamed: memory is the packed names plus one chunk, whatever the mark holds.
    """
    reader = zstandard.ZstdDecompressor().stream_reader(
        cast(BinaryIO, _CappedReader(f, MAX_MARK_RAW)), read_size=_CHUNK)
    buf, pos, total, eof = b"", 0, 0, False

    def more(n: int) -> None:  # at least n bytes after pos, unless the mark ends first
        nonlocal buf, pos, total, eof
        while len(buf) - pos < n and not eof:
            chunk = reader.read(_CHUNK)
            total += len(chunk)
            if total > MAX_MARK_BYTES:
                raise DamagedMarkError(f"over {MAX_MARK_BYTES} bytes decompressed")
            eof = not chunk
            buf, pos = buf[pos:] + chunk, 0

    def names(count: int) -> bytes:
        nonlocal pos
        out = bytearray()
        more(1)
        if buf[pos:pos + 1] == b"]":
            pos += 1
            return bytes(out)
        while True:
            more(_NAME_JSON)
            # The items before the list's "]" are checked and unhexed a run at a time
            # (C speed: a name at a time was ~7 s for a mark of 1 Mi names).
            k = (len(buf) - pos) // _NAME_JSON
            end = buf.find(b"]", pos)
            if end >= 0:
                k = min(k, (end - pos) // _NAME_JSON)
            if k:
                run = buf[pos:pos + k * _NAME_JSON]
                packed = _run(run, k)
                pos += len(run)
            else:  # the last item, or damage
                m = _ITEM_RE.match(buf, pos)
                if m is None or m.group(2) != b"]":
                    raise DamagedMarkError(
                        f"not a mark's list at byte {total - len(buf) + pos}")
                packed = binascii.a2b_hex(m.group(1))
                pos = m.end()
            # Written sorted: refusing disorder keeps the one shape (and binary search).
            if out[-32:] > packed[:32] or not _ascending(packed):
                raise DamagedMarkError("names not in ascending order")
            out += packed
            count += len(packed) // 32
            if count > MAX_MARK_NAMES:
                raise DamagedMarkError(f"over {MAX_MARK_NAMES} names")
            if k == 0:
                return bytes(out)

    more(_HEAD_MAX)
    m = _HEAD_RE.match(buf, pos)
    if m is None:
        raise DamagedMarkError("not a gc mark's header")
    pos = m.end()
    digests = names(0)
    packs = b""
    more(len(_PACKS))
    if buf.startswith(_PACKS, pos):  # absent in marks of releases before packs
        pos += len(_PACKS)
        packs = names(len(digests) // 32)
    more(2)
    if buf[pos:] != b"}":
        raise DamagedMarkError("not a gc mark's end")
    return digests, packs


def _run(run: bytes, k: int) -> bytes:
    """``k`` items '"<64 hex>", ' packed, or DamagedMarkError."""
    if (run[0::_NAME_JSON] != b'"' * k or run[65::_NAME_JSON] != b'"' * k
            or run[66::_NAME_JSON] != b"," * k or run[67::_NAME_JSON] != b" " * k):
        raise DamagedMarkError("not a mark's list")
    hexes = run.translate(None, b'", ')
    if len(hexes) != 64 * k or hexes.translate(None, b"0123456789abcdef"):
        raise DamagedMarkError("a name in a mark is not 64 hex")
    return binascii.a2b_hex(hexes)


def _ascending(packed: bytes) -> bool:
    names = [packed[i:i + 32] for i in range(0, len(packed), 32)]
    return names == sorted(names)


def _unpack(packed: bytes) -> frozenset[str]:
    return frozenset(packed[i:i + 32].hex() for i in range(0, len(packed), 32))


def _has(packed: bytes, digest: bytes) -> bool:
    lo, hi = 0, len(packed) // 32
    while lo < hi:  # binary search over the ascending 32-byte names
        mid = (lo + hi) // 2
        if packed[mid * 32:mid * 32 + 32] < digest:
            lo = mid + 1
        else:
            hi = mid
    return packed[lo * 32:lo * 32 + 32] == digest


def _read_packed(backend: Backend, name: str) -> tuple[float, bytes, bytes] | None:
    key = f"{PREFIX}/{name}"
    info = backend.info(key)
    if info is None:
        return None  # swept meanwhile
    try:
        with backend.open(key) as f:
            digests, packs = _parse(f)
    except FileNotFoundError:
        return None
    except (ValueError, NotRegularFileError, zstandard.ZstdError) as e:
        # A damaged mark (a FIFO or directory too, or one not of the written shape)
        # protects nothing and condemns nothing: gc reads it the same way and never
        # acts on it, so publishers may ignore it too (logged).
        log.warning("ignoring damaged gc mark %s: %s", name, e)
        return None
    return info.mtime, digests, packs


def _read(backend: Backend, name: str) -> Mark | None:
    got = _read_packed(backend, name)
    if got is None:
        return None
    mtime, digests, packs = got
    return Mark(name, mtime, _unpack(digests), _unpack(packs))


def load_all(backend: Backend) -> Iterator[Mark]:
    for name in backend.list(PREFIX):
        if NAME_RE.match(name):
            m = _read(backend, name)
            if m is not None:
                yield m


class Condemned:
    """The digests named by current marks, cached per mark (marks are immutable).

    Re-listed at most every ``ttl`` seconds: a LIST that lags by seconds is
    harmless, since a mark is acted on only ``grace`` (hours) after it is made.
    Holds at most ``MAX_HELD_NAMES`` names (packed); marks beyond are read again
    at each ``among``, never ignored: gc acts on them.
    """

    def __init__(self, backend: Backend, ttl: float | None = None) -> None:
        self.backend = backend
        self.ttl = LIST_TTL if ttl is None else ttl
        self._marks: dict[str, tuple[bytes, ...]] = {}
        self._unheld: set[str] = set()  # readable marks over the budget
        self._held = 0
        self._listed = 0.0
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Re-list the marks if the listing is older than ``ttl``; read new ones."""
        with self._lock:
            self._refresh()

    def _refresh(self) -> None:
        if time.monotonic() - self._listed < self.ttl and self._listed:
            return
        names = {n for n in self.backend.list(PREFIX) if NAME_RE.match(n)}
        for n in list(self._marks):
            if n not in names:
                self._held -= sum(len(p) for p in self._marks.pop(n)) // 32
        self._unheld &= names
        for n in sorted(names - set(self._marks) - self._unheld):
            got = _read_packed(self.backend, n)
            if got is None:
                continue
            held = (len(got[1]) + len(got[2])) // 32
            if self._held + held > MAX_HELD_NAMES:
                log.warning("gc marks name over %d objects: mark %s is read again at"
                            " each publication", MAX_HELD_NAMES, n)
                self._unheld.add(n)
                continue
            self._marks[n] = got[1:]
            self._held += held
        self._listed = time.monotonic()

    def among(self, digests: Iterable[str]) -> set[str]:
        """Which of ``digests`` (objects or packs) a current mark names."""
        with self._lock:
            self._refresh()
            wanted = {bytes.fromhex(d): d for d in digests}
            out: set[str] = set()
            for packed in self._marks.values():
                out |= self._match(wanted, packed)
            for n in sorted(self._unheld):  # one at a time: memory is one mark's
                got = _read_packed(self.backend, n)
                if got is not None:
                    out |= self._match(wanted, got[1:])
            return out

    @staticmethod
    def _match(wanted: dict[bytes, str], packed: tuple[bytes, ...]) -> set[str]:
        return {d for b, d in wanted.items() if any(_has(p, b) for p in packed)}
