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
size in every publisher. A mark of another shape, or past OLD_MAX_MARK_BYTES,
is damage: ignored by publishers and by gc alike (so it condemns nothing and
is never swept), logged. docs/format.md "gc marks" has the bounds.
"""

from __future__ import annotations

import binascii
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, cast

import zstandard

from casfs.store.backend import Backend, NotRegularFileError

log = logging.getLogger(__name__)

PREFIX = "gc/marks"
NAME_RE = re.compile(r"^\d{12}-[0-9a-f]{32}\Z")
# A name is 68 bytes of a mark's JSON ('"<64 hex>", '), 32 bytes held per name
# (packed). gc splits what it marks into marks of MARK_NAMES; a publisher holds a
# mark of up to MAX_MARK_NAMES (136 MiB of JSON, streamed, 64 MiB held) and streams
# a larger one against each publication's names.
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
# What the release before the split read (1 GiB of JSON, ~15.8 Mi names): a mark of its
# gc past MAX_MARK_NAMES is still honoured (a publisher ignoring it re-used an object
# that gc then swept: a review), streamed against a publication's own names, never
# held; gc reads it whole, as that release did, to sweep it.
OLD_MAX_MARK_BYTES = 1 << 30
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


class MarkTooLargeError(DamagedMarkError):
    """Of the written shape, but naming more than a held mark may (see OLD_MAX_MARK_BYTES)."""


_HEAD_RE = re.compile(rb'\{"casfs_gc_mark": 1, "created": -?\d{1,20}(?:\.\d{1,20})?'
                      rb'(?:e[-+]?\d{1,3})?, "digests": \[')
_ITEM_RE = re.compile(rb'"([0-9a-f]{64})"(, |\])')
_PACKS = b', "packs": ['


class _CappedReader:
    """A file read through, refused past ``cap`` bytes (a mark's raw size)."""

    def __init__(self, f: BinaryIO, cap: int) -> None:
        self.f, self.cap, self.left = f, cap, cap

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(_CHUNK if n < 0 else min(n, _CHUNK))
        self.left -= len(data)
        if self.left < 0:
            raise DamagedMarkError(f"over {self.cap} bytes")
        return data


def _parse(f: BinaryIO, max_names: int | None = None) -> tuple[bytes, bytes]:
    """The digests and packs of a mark, each packed (32 bytes a name, ascending).

    Streamed: memory is the packed names plus one chunk, whatever the mark holds.
    MarkTooLargeError past ``max_names`` (a mark of the written shape all the same).
    """
    lists = (bytearray(), bytearray())
    count = 0
    if max_names is None:
        max_names = MAX_MARK_NAMES

    def keep(packed: bytes, which: int) -> None:
        nonlocal count
        count += len(packed) // 32
        if count > max_names:
            raise MarkTooLargeError(f"over {max_names} names")
        lists[which].extend(packed)

    # The names' count alone tells a held mark from a larger one: a byte bound for the
    # held count refused an older release's mark as damage before its count was seen
    # (a review: cached as damaged, never honoured, while that release's gc swept it).
    _stream(f, keep, OLD_MAX_MARK_BYTES)
    return bytes(lists[0]), bytes(lists[1])


def _matching(f: BinaryIO, wanted: frozenset[bytes]) -> set[bytes]:
    """Which of ``wanted`` (packed names) a mark names, in one chunk's memory."""
    hits: set[bytes] = set()

    def match(packed: bytes, which: int) -> None:
        hits.update(wanted.intersection([packed[i:i + 32] for i in range(0, len(packed), 32)]))

    _stream(f, match, OLD_MAX_MARK_BYTES)
    return hits


def _stream(f: BinaryIO, sink: Callable[[bytes, int], None], max_bytes: int) -> None:
    """Each run of a mark's names, packed, to ``sink`` (0: digests, 1: packs), checked
    to be exactly the written shape (DamagedMarkError otherwise)."""
    reader = zstandard.ZstdDecompressor().stream_reader(
        cast(BinaryIO, _CappedReader(f, max_bytes)), read_size=_CHUNK)
    buf, pos, total, eof = b"", 0, 0, False

    def more(n: int) -> None:  # at least n bytes after pos, unless the mark ends first
        nonlocal buf, pos, total, eof
        while len(buf) - pos < n and not eof:
            chunk = reader.read(_CHUNK)
            total += len(chunk)
            if total > max_bytes:
                raise DamagedMarkError(f"over {max_bytes} bytes decompressed")
            eof = not chunk
            buf, pos = buf[pos:] + chunk, 0

    def names(which: int) -> None:
        nonlocal pos
        last = b""
        more(1)
        if buf[pos:pos + 1] == b"]":
            pos += 1
            return
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
            if last > packed[:32] or not _ascending(packed):
                raise DamagedMarkError("names not in ascending order")
            last = packed[-32:]
            sink(packed, which)
            if k == 0:
                return

    more(_HEAD_MAX)
    m = _HEAD_RE.match(buf, pos)
    if m is None:
        raise DamagedMarkError("not a gc mark's header")
    pos = m.end()
    names(0)
    more(len(_PACKS))
    if buf.startswith(_PACKS, pos):  # absent in marks of releases before packs
        pos += len(_PACKS)
        names(1)
    more(2)
    if buf[pos:] != b"}":
        raise DamagedMarkError("not a gc mark's end")


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


_SEARCH_STEPS = 40  # a binary search costs about as much as walking this many names


def _has(packed: bytes, digest: bytes) -> bool:
    lo, hi = 0, len(packed) // 32
    while lo < hi:  # binary search over the ascending 32-byte names
        mid = (lo + hi) // 2
        if packed[mid * 32:mid * 32 + 32] < digest:
            lo = mid + 1
        else:
            hi = mid
    return packed[lo * 32:lo * 32 + 32] == digest


def _read_packed(backend: Backend, name: str, max_names: int | None = None
                 ) -> tuple[float, bytes, bytes] | None:
    """(mtime, digests, packs) of a mark; None if gone or damaged (logged).
    MarkTooLargeError past ``max_names``."""
    key = f"{PREFIX}/{name}"
    info = backend.info(key)
    if info is None:
        return None  # swept meanwhile
    try:
        with backend.open(key) as f:
            digests, packs = _parse(f, max_names)
    except FileNotFoundError:
        return None
    except MarkTooLargeError:
        raise
    except (ValueError, NotRegularFileError, zstandard.ZstdError) as e:
        # A damaged mark (a FIFO or directory too, or one not of the written shape)
        # protects nothing and condemns nothing: gc reads it the same way and never
        # acts on it, so publishers may ignore it too (logged).
        log.warning("ignoring damaged gc mark %s: %s", name, e)
        return None
    return info.mtime, digests, packs


def _read(backend: Backend, name: str) -> Mark | None:
    # gc: a mark of the release before the split, up to what that release read
    got = _read_packed(backend, name, OLD_MAX_MARK_BYTES // _NAME_JSON)
    if got is None:
        return None
    mtime, digests, packs = got
    return Mark(name, mtime, _unpack(digests), _unpack(packs))


def load_all(backend: Backend) -> Iterator[Mark]:
    for name in backend.list(PREFIX):
        if NAME_RE.match(name):
            try:
                m = _read(backend, name)
            except MarkTooLargeError as e:
                log.warning("ignoring damaged gc mark %s: %s", name, e)
                continue
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
        self._unheld: set[str] = set()  # readable marks over the budget, or a held mark's
        # Damaged marks (a planted bomb) by name, with the identity they had: not read
        # again at each listing while it stays the same (marks are create-only).
        self._damaged: dict[str, tuple[int, float]] = {}
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
        self._damaged = {n: v for n, v in self._damaged.items() if n in names}
        for n in sorted(names - set(self._marks) - self._unheld):
            if n in self._damaged:
                info = self.backend.info(f"{PREFIX}/{n}")
                if info is None or (info.size, info.mtime) == self._damaged[n]:
                    continue
            try:
                got = _read_packed(self.backend, n)
            except MarkTooLargeError:
                got = None
            else:
                if got is None:
                    info = self.backend.info(f"{PREFIX}/{n}")
                    if info is not None:
                        self._damaged[n] = (info.size, info.mtime)
                    continue
            held = (len(got[1]) + len(got[2])) // 32 if got is not None else MAX_MARK_NAMES
            if got is None or self._held + held > MAX_HELD_NAMES:
                log.warning("gc mark %s: over %d names, or past the %d held: read again at"
                            " each publication", n, MAX_MARK_NAMES, MAX_HELD_NAMES)
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
            if self._unheld and wanted:
                keys = frozenset(wanted)
                for n in sorted(self._unheld):  # streamed: memory is one chunk's
                    out |= {wanted[b] for b in self._stream_match(n, keys)}
            return out

    def _stream_match(self, name: str, wanted: frozenset[bytes]) -> set[bytes]:
        try:
            with self.backend.open(f"{PREFIX}/{name}") as f:
                return _matching(f, wanted)
        except FileNotFoundError:
            return set()  # swept meanwhile
        except (ValueError, NotRegularFileError, zstandard.ZstdError) as e:
            log.warning("ignoring damaged gc mark %s: %s", name, e)
            return set()

    @staticmethod
    def _match(wanted: dict[bytes, str], packed: tuple[bytes, ...]) -> set[str]:
        out: set[str] = set()
        for p in packed:
            if len(wanted) * _SEARCH_STEPS > len(p) // 32:
                # a walk of the mark's names costs less than a search for each wanted one
                # (a review: 1.7 s for a publication of 100k digests, 0.13 s before)
                hits = set(wanted).intersection(p[i:i + 32] for i in range(0, len(p), 32))
            else:
                hits = {b for b in wanted if _has(p, b)}
            out |= {wanted[b] for b in hits}
        return out
