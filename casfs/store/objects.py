"""Content-addressed objects in the shared root.

An object is named by the blake3-256 hex digest of its *uncompressed* bytes
(compression comes after hashing, so codecs can change without renaming), and
stored at ``objects/<2 hex>/<62 hex>`` as a 16-byte header plus payload:

    offset size  field
    0      4     magic b"CASF"
    4      1     format version (1)
    5      1     codec (0 raw, 1 zstd)
    6      2     reserved, 0
    8      8     uncompressed size, u64 little-endian

Reading never trusts the file: the header is checked, decompression output is
bounded by the header's size *and* the size the caller expects (a zstd frame
can lie), and the result is hashed and compared with the name. Any mismatch is
a rejection: logged, counted, raised as CorruptObjectError for the caller to
turn into a miss.

Layering: above casfs.store.backend, casfs.store.digests (names and hashing,
re-exported here) and casfs.store.packloc (where a packed object lives: a read
follows a row's pack location and gc's forwards); casfs.store.packs, which
writes packs through an ObjectStore, is above this module.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import stat
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import blake3
import zstandard

from casfs.errors import CorruptObjectError, ObjectMissingError
from casfs.store.backend import Backend, NotRegularFileError
from casfs.store.digests import DIGEST_RE, check_digest, digest_bytes, object_key
from casfs.store.packloc import MAX_HOPS, Location, load_forward, pack_key, parse_location
from casfs.util import atomic
from casfs.util.counters import Counters
from casfs.util.crashpoint import crashpoint
from casfs.util.envnum import env_int
from casfs.util.noatime import open_noatime

log = logging.getLogger(__name__)

MAGIC = b"CASF"
VERSION = 1
CODEC_RAW = 0
CODEC_ZSTD = 1
HEADER = struct.Struct("<4sBBHQ")
HEADER_SIZE = HEADER.size  # 16
ZSTD_LEVEL = 3
# Compression must save at least this fraction, else the object is stored raw
# (already-compressed cubins and .so sections gain nothing; raw reads are cheaper).
MIN_SAVING = 0.05
# Files up to this size are compressed in memory; larger ones stream through a
# temp file so memory stays bounded whatever the cache holds.
IN_MEMORY_LIMIT = 16 << 20
CHUNK = 1 << 20
# A hostile frame may ask for a huge window; casfs writes level 3 (2 MiB windows).
MAX_WINDOW = 8 << 20
# The largest object (uncompressed) a reader accepts and a writer stores: what a
# cache entry may reasonably be. Bounds the disk a lying manifest can make a
# node fill. CASFS_MAX_OBJECT_BYTES changes it (every node should agree).
DEFAULT_MAX_OBJECT_BYTES = 1 << 30
RECENT_BYTES = 8 << 20  # ObjectStore.remember's bound
AHEAD_WAIT = 30.0  # the longest a read waits for the same object's read_ahead
PACKED_BUFFER = 1 << 20  # a pack member up to this size is verified before it is served
PUT_FIRST_MAX = 1 << 20  # on a remote root, objects up to this size skip the HEAD (_put_known)
# A key this process stored (or found sound) this recently needs no HEAD before a
# record names it (casfs.promote.publisher): gc removes only what a mark condemned at
# least its grace (24 h by default) before, and a publication checks the marks anyway.
STORED_FRESH_S = 300.0
STORED_KEPT = 100_000


def _boottime() -> float:
    """Seconds since boot, suspend included (a node suspended for a day has been away)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _tell(out: BinaryIO) -> int | None:
    """Where ``out`` stands, if it can go back there (None: it cannot)."""
    try:
        return int(out.tell())
    except (AttributeError, OSError, ValueError):
        return None


def _rewind(out: BinaryIO, start: int | None) -> bool:
    """Drop what was written to ``out`` since ``start``; False if it cannot be."""
    if start is None:
        return False
    try:
        out.seek(start)
        out.truncate()
    except (AttributeError, OSError, ValueError):
        return False
    return True


def max_object_bytes() -> int:
    return env_int("CASFS_MAX_OBJECT_BYTES", DEFAULT_MAX_OBJECT_BYTES)


class ObjectTooLargeError(CorruptObjectError):
    """An object is larger than the configured object size limit."""


def check_object_size(size: int, what: str) -> None:
    limit = max_object_bytes()
    if size > limit:
        raise ObjectTooLargeError(
            f"{what}: {size} bytes is over the object size limit of {limit} bytes"
            " (CASFS_MAX_OBJECT_BYTES)")


@dataclass(frozen=True, slots=True)
class PutResult:
    digest: str
    size: int
    created: bool


@dataclass(frozen=True, slots=True)
class Header:
    codec: int
    size: int


def parse_header(raw: bytes, digest: str) -> Header:
    if len(raw) < HEADER_SIZE:
        raise CorruptObjectError(f"object {digest}: truncated header")
    magic, version, codec, reserved, size = HEADER.unpack(raw[:HEADER_SIZE])
    if magic != MAGIC:
        raise CorruptObjectError(f"object {digest}: bad magic")
    if version != VERSION:
        raise CorruptObjectError(f"object {digest}: unknown object format version {version}")
    if codec not in (CODEC_RAW, CODEC_ZSTD):
        raise CorruptObjectError(f"object {digest}: unknown codec {codec}")
    if reserved != 0:
        raise CorruptObjectError(f"object {digest}: reserved header bits set")
    return Header(codec, size)


Source = str | os.PathLike[str] | int  # a path, or an fd opened already (from its start)


def _open_source(path: Source) -> int:
    """An fd of its own: a path opened (its last component not followed), or a dup of
    an fd the caller opened (casfs.util.beneath, in a tenant's directory) rewound."""
    if isinstance(path, int):
        fd = os.dup(path)
        os.lseek(fd, 0, os.SEEK_SET)
        return fd
    return open_noatime(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)


def open_regular(path: Source) -> BinaryIO:
    """Open a local file to store it: no link following, no blocking, regular files only.

    A job can leave a FIFO or a symlink where a file was; storing must refuse
    it (OSError), never hang on it or store what it points at.
    """
    fd = _open_source(path)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return os.fdopen(fd, "rb")


def read_regular(path: Source, limit: int, size: int | None = None) -> bytes:
    """Up to ``limit`` bytes of a local file, with open_regular's checks (no buffered
    file object: promotion reads thousands of few-KB files). ``size``: the size the
    caller expects (once read, no second read to find the end; it checks the size)."""
    return read_regular_stat(path, limit, size)[0]


def read_regular_stat(path: Source, limit: int, size: int | None = None,
                      ) -> tuple[bytes, os.stat_result]:
    """read_regular's bytes and the file's fstat taken after reading them (what was read
    is what the file held at that size and mtime, unless it changed in the same clock
    tick: promotion's writers are tracked too); no second lookup of the path."""
    fd = _open_source(path)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        data = os.read(fd, limit)
        while (len(data) < limit and (size is None or len(data) < size)
               and (more := os.read(fd, limit - len(data)))):
            data += more
        return data, os.fstat(fd)
    finally:
        os.close(fd)


class ObjectStore:
    """Put, get and verify objects through a Backend."""

    def __init__(
        self, backend: Backend, counters: Counters | None = None, level: int = ZSTD_LEVEL
    ) -> None:
        self.backend = backend
        self.counters = counters or Counters()
        self._level = level
        # digest -> (pack digest, offset, length) of packed objects, learnt from
        # manifests (casfs.store.packs); ``locator`` may fill it on a miss.
        self.locations: dict[str, tuple[str, int, int]] = {}
        self.locator: Callable[[], None] | None = None
        # digest -> pack location from the node's own records (promotion's packs).
        self.lookup: Callable[[str], tuple[str, int, int] | None] | None = None
        # pack -> its forward record's moved members (gc repacked it), None: no forward.
        self.forwards: dict[str, dict[str, tuple[str, int, int]] | None] = {}
        self._tls = threading.local()
        self._recent: OrderedDict[str, bytes] = OrderedDict()  # see remember()
        self._recent_bytes = 0
        self._recent_lock = threading.Lock()
        self._ahead: dict[str, threading.Event] = {}  # see read_ahead()
        self._stored: OrderedDict[str, float] = OrderedDict()  # see stored()
        self._located = False
        self._locate_lock = threading.RLock()  # the locator reads manifests: it may miss too

    # --- writing ----------------------------------------------------------
    def has(self, digest: str) -> bool:
        return self.backend.info(object_key(digest)) is not None

    def has_sound(self, digest: str, size: int) -> bool:
        """Whether an intact loose object ``digest`` exists (dedup; touched for gc, as put)."""
        return self.backend.info(object_key(digest)) is not None and self._sound(digest, size)

    def put_bytes(self, data: bytes) -> PutResult:
        digest = digest_bytes(data)
        return self._put_known(digest, data)

    def encode(self, data: bytes, level: int | None = None) -> bytes:
        """The stored form of ``data``: header + payload (zstd unless it saves too little);
        ``level``: zstd's (the store's by default; any level reads the same)."""
        payload = self._compressor(level).compress(data)
        codec = CODEC_ZSTD
        if len(payload) > len(data) * (1 - MIN_SAVING):
            payload, codec = data, CODEC_RAW
        return HEADER.pack(MAGIC, VERSION, codec, 0, len(data)) + payload

    def encode_many(self, datas: list[bytes], threads: int = 1,
                    level: int | None = None) -> list[bytes]:
        """``encode`` of each of ``datas``, compressed in ``threads`` native threads.

        One call for the whole batch: zstd's own threads run outside the GIL and
        without a Python task per object, which cost more than it saved on these
        few-KB objects (a pool of 4 Python threads: +50% CPU, no faster here).
        """
        multi = getattr(self._compressor(level), "multi_compress_to_buffer", None)
        # Empty objects (lock files, empty modules) are stored raw, never compressed:
        # python-zstandard 0.25's multi-threaded call drops the segment of an empty
        # input in some thread splits ([b"abc", b""] gives one segment), and its
        # result would pair the wrong bytes with an object.
        full = [d for d in datas if d]
        if threads <= 1 or len(full) < 2 or multi is None:  # the cffi backend lacks it
            return [self.encode(d, level) for d in datas]
        segs = [seg.tobytes() for seg in multi(full, threads=threads)]
        if len(segs) != len(full):  # never seen for non-empty inputs; a wrong pairing costs
            return [self.encode(d, level) for d in datas]  # far more than this fallback
        compressed = iter(segs)
        out = []
        for data in datas:
            payload, codec = (next(compressed), CODEC_ZSTD) if data else (data, CODEC_RAW)
            if len(payload) > len(data) * (1 - MIN_SAVING):
                payload, codec = data, CODEC_RAW
            out.append(HEADER.pack(MAGIC, VERSION, codec, 0, len(data)) + payload)
        return out

    def put_stored(self, digest: str, stored: bytes) -> bool:
        """Store ``stored`` (what ``encode`` made of the object ``digest``) loose, create-only;
        whether this call created it."""
        with atomic.staged_file(self.backend.staging_dir, "obj-", 0o444, sync=False) as (f, tmp):
            f.write(stored)
        return self._install(object_key(digest), tmp, repair=False)

    def _compressor(self, level: int | None = None) -> zstandard.ZstdCompressor:
        # One per thread and level (a compressor is not thread-safe), re-used: making one
        # per object cost ~20% of compressing a few-KB compiler artefact.
        level = self._level if level is None else level
        cctxs: dict[int, zstandard.ZstdCompressor] | None = getattr(self._tls, "cctxs", None)
        if cctxs is None:
            cctxs = self._tls.cctxs = {}
        c = cctxs.get(level)
        if c is None:
            c = cctxs[level] = zstandard.ZstdCompressor(level=level)
        return c

    def remember(self, digest: str, data: bytes) -> None:
        """Keep the bytes of a small object this process just hashed and stored, so
        publication reading it back (group files: relocation count, group check) costs no
        request. Bounded; they were hashed here, so they need no verification."""
        with self._recent_lock:
            self._recent[digest] = data
            self._recent_bytes += len(data)
            while self._recent_bytes > RECENT_BYTES:
                _, old = self._recent.popitem(last=False)
                self._recent_bytes -= len(old)

    def read_ahead(self, digest: str) -> None:
        """Start reading small object ``digest`` in a thread (a profile beside the
        manifest parts it comes with, not after them: a round trip); a read of it
        meanwhile waits for that one instead of sending its own, then takes its verified
        bytes (kept as ``remember`` keeps them). A failure only leaves the read to it."""
        with self._recent_lock:
            if digest in self._recent or digest in self._ahead:
                return
            done = self._ahead[digest] = threading.Event()

        def run() -> None:
            try:
                buf = io.BytesIO()
                self._get_into(digest, None, buf)
                self.remember(digest, buf.getvalue())
            except Exception as e:  # (CasfsError, OSError, a bad digest): the reader's
                log.debug("read ahead of %s: %s", digest, e)
            finally:
                with self._recent_lock:
                    self._ahead.pop(digest, None)
                done.set()

        threading.Thread(target=run, name="casfs-read-ahead", daemon=True).start()

    def stored(self, key: str) -> None:
        """Note that this process just stored ``key`` (or found it sound)."""
        with self._recent_lock:
            self._stored[key] = _boottime()
            self._stored.move_to_end(key)
            while len(self._stored) > STORED_KEPT:
                self._stored.popitem(last=False)

    def recently_stored(self, key: str) -> bool:
        """Whether ``key`` was stored or found sound here within STORED_FRESH_S."""
        at = self._stored.get(key)
        return at is not None and _boottime() - at < STORED_FRESH_S

    def _put_known(self, digest: str, data: bytes) -> PutResult:
        key = object_key(digest)
        if len(data) <= PUT_FIRST_MAX and getattr(self.backend, "remote", False):
            # Over a network a HEAD is a round trip: new bytes (what publication mostly
            # stores) go up at once as a create-only PUT, which finds an existing name
            # itself; only then is that object checked, and repaired, as after a HEAD.
            # (On a POSIX root the stat is cheap and spares compressing stored bytes.)
            blob = self.encode(data)
            if self._install(key, self._stage(blob), repair=False):
                return PutResult(digest, len(data), True)
            if self._sound(digest, len(data)):
                return PutResult(digest, len(data), False)
            return PutResult(digest, len(data), self._install(key, self._stage(blob),
                                                              repair=True))
        exists = self.backend.info(key) is not None
        if exists and self._sound(digest, len(data)):
            return PutResult(digest, len(data), False)
        return PutResult(digest, len(data),
                         self._install(key, self._stage(self.encode(data)), repair=exists))

    def _stage(self, blob: bytes) -> Path:
        with atomic.staged_file(self.backend.staging_dir, "obj-", 0o444, sync=False) as (f, tmp):
            f.write(blob)
        return tmp

    def put_file(self, path: Source) -> PutResult:
        """Store a local file's content. The caller checks the file did not change meanwhile."""
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            check_object_size(size, str(path))
            data = f.read() if size <= IN_MEMORY_LIMIT else b""
        if size <= IN_MEMORY_LIMIT:
            return self._put_known(digest_bytes(data), data)
        return self._put_large(path)

    def _put_large(self, path: Source) -> PutResult:
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)  # multi-MB: threads pay here
        hashed = 0
        with open_regular(path) as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
                hashed += len(chunk)
        digest = h.hexdigest()
        key = object_key(digest)
        exists = self.backend.info(key) is not None
        if exists and self._sound(digest, hashed):
            return PutResult(digest, hashed, False)
        size = 0
        # What is stored is hashed as it is written: the file may change between the
        # passes (its owner can put its size and mtime back), and an object must never
        # be named by bytes other than its own.
        stored = blake3.blake3(max_threads=blake3.blake3.AUTO)
        with atomic.staged_file(self.backend.staging_dir, "obj-", 0o444, sync=False) as (out, tmp):
            out.write(b"\0" * HEADER_SIZE)
            cctx = zstandard.ZstdCompressor(level=self._level)
            with open_regular(path) as f, cctx.stream_writer(out, closefd=False) as zw:
                while chunk := f.read(CHUNK):
                    size += len(chunk)
                    stored.update(chunk)
                    zw.write(chunk)
            codec = CODEC_ZSTD
            if out.tell() - HEADER_SIZE > size * (1 - MIN_SAVING):
                codec = CODEC_RAW
                out.seek(HEADER_SIZE)
                out.truncate()
                size = 0
                stored = blake3.blake3(max_threads=blake3.blake3.AUTO)
                with open_regular(path) as f:
                    while chunk := f.read(CHUNK):
                        size += len(chunk)
                        stored.update(chunk)
                        out.write(chunk)
            check_object_size(size, str(path))
            out.seek(0)
            out.write(HEADER.pack(MAGIC, VERSION, codec, 0, size))
        if (got := stored.hexdigest()) != digest:  # changed meanwhile: named by what it holds
            return PutResult(got, size, self._install(object_key(got), tmp, repair=False))
        return PutResult(digest, size, self._install(key, tmp, repair=exists))

    def _sound(self, digest: str, size: int) -> bool:
        """Whether an existing object is intact; touches it so a concurrent gc keeps it.

        Dedup must not trust an object blindly: a node that crashed between
        linking an object and syncing it leaves a torn file under a valid name,
        and every later writer of the same bytes would publish a record naming
        it. Re-verifying costs a read, cheaper than the compress + write it saves.
        """
        try:
            self.verify(digest, size)
        except CorruptObjectError:
            return False
        except ObjectMissingError:
            return False  # gc removed it meanwhile: write it again
        self.backend.touch(object_key(digest))
        self.stored(object_key(digest))
        return True

    def _install(self, key: str, tmp: Path, *, repair: bool) -> bool:
        crashpoint("object-staged")
        if not repair:
            created = self.backend.put_if_absent(key, tmp)
            if created:
                self.stored(key)
            return created
        # A torn or corrupt object under this name: the name is content-addressed,
        # so replacing it with verified bytes is a repair, never a change.
        self.backend.replace(key, tmp)
        self.stored(key)
        self.counters.inc("objects_repaired")
        log.warning("repaired damaged object %s", key)
        return True

    def rewrite(self, digest: str) -> bytes:
        """Write an existing object again with its verified bytes (a new mtime).

        The name is content-addressed, so this changes no byte a reader sees; a
        gc mark naming the object then spares it (casfs.store.maintenance).
        """
        data = self.get_bytes(digest)
        with atomic.staged_file(self.backend.staging_dir, "obj-", 0o444, sync=False) as (f, tmp):
            payload = zstandard.ZstdCompressor(level=self._level).compress(data)
            codec = CODEC_ZSTD
            if len(payload) > len(data) * (1 - MIN_SAVING):
                payload, codec = data, CODEC_RAW
            f.write(HEADER.pack(MAGIC, VERSION, codec, 0, len(data)))
            f.write(payload)
        self.backend.replace(object_key(digest), tmp)
        self.counters.inc("objects_rewritten_for_gc")
        return data

    # --- reading ----------------------------------------------------------
    def header(self, digest: str) -> Header:
        check_digest(digest)
        try:
            with self._open(digest) as f:
                return parse_header(f.read(HEADER_SIZE), digest)
        except CorruptObjectError:
            loose = self._loose_copy(digest)  # a damaged pack: a loose copy repairs it
            if loose is None:
                raise
            with loose as f:
                return parse_header(f.read(HEADER_SIZE), digest)

    def locate(self, digest: str, pack: object) -> None:
        """Remember where a packed object lives (a manifest row's ``pack`` extras)."""
        loc = parse_location(pack)
        if loc is not None:
            self.locations[digest] = loc

    @contextlib.contextmanager
    def loose_only(self) -> Iterator[None]:
        """Reads in this thread never run the locator: for objects that are never packed
        (manifests), read by helper threads of a caller that may itself be the locator
        (waiting for it there, on its lock, would never end)."""
        self._tls.loose_only = True
        try:
            yield
        finally:
            self._tls.loose_only = False

    def _locate_once(self) -> bool:
        """Run the locator (reads manifests) once per handle; True once it has run.

        A miss racing the first one waits for it to finish: the locations it is
        reading may be the ones this miss needs (a fetch worker's prefetch and a
        job's open of another packed object were both misses, and the second one
        saw the flag set, found no location yet and reported the object missing).
        """
        if self.locator is None:
            return False
        with self._locate_lock:
            if not self._located:
                self._located = True  # once: a later miss must not re-read manifests
                self.locator()
        return True

    def _open_packed(self, digest: str) -> BinaryIO | None:
        loc = self.locations.get(digest)
        if loc is None and self.lookup is not None:
            loc = self.lookup(digest)  # a pack this node's promotion wrote
        if loc is None:
            return None
        pack, off, length = loc
        for _ in range(MAX_HOPS):
            try:
                raw = self.backend.read_range(pack_key(pack), off, length)
            except (FileNotFoundError, NotADirectoryError):
                moved = self.forwarded(pack, digest)  # gc repacked it: follow the forward
                if moved is None:
                    return None  # the pack is gone: try a loose copy
                pack, off, length = moved
                continue
            except NotRegularFileError:
                raise CorruptObjectError(
                    f"object {digest}: pack {pack} is not a regular file") from None
            if len(raw) != length:
                raise CorruptObjectError(f"object {digest}: pack {pack} is truncated")
            self.counters.inc("packed_reads")
            return io.BytesIO(raw)
        return None

    def forwarded(self, pack: str, digest: str) -> Location | None:
        """Where ``digest`` went when gc repacked ``pack`` (cached per pack), or None."""
        if pack not in self.forwards:
            self.forwards[pack] = load_forward(self.backend, pack)
        moved = self.forwards[pack]
        return moved.get(digest) if moved else None

    def _loose_copy(self, digest: str) -> BinaryIO | None:
        """The loose object ``digest`` when one is there (None: none, or not a regular file).

        A packed object whose pack is damaged falls back to it: ``casfs import`` of the
        same files writes one (the documented repair), and rows naming the pack are
        immutable, so this is how they read the repaired bytes.
        """
        try:
            return self.backend.open(object_key(digest))
        except (FileNotFoundError, NotADirectoryError, NotRegularFileError):
            return None

    def _open(self, digest: str) -> BinaryIO:
        return self._open_src(digest)[0]

    def _open_src(self, digest: str) -> tuple[BinaryIO, bool]:
        """(the stored bytes of ``digest``, whether they come from a pack)."""
        packed = self._open_packed(digest)
        if packed is not None:
            return packed, True
        try:
            return self.backend.open(object_key(digest)), False
        except (FileNotFoundError, NotADirectoryError):
            # Not loose: maybe packed where no manifest read so far said. The locator
            # runs only here, on a miss, so reading a manifest (loose) never triggers it.
            if (not getattr(self._tls, "loose_only", False) and self._locate_once()
                    and (packed := self._open_packed(digest)) is not None):
                return packed, True
            self.counters.inc("objects_missing")
            raise ObjectMissingError(f"object {digest} is missing") from None
        except NotRegularFileError:
            raise CorruptObjectError(f"object {digest}: not a regular file") from None

    def get_into(self, digest: str, expected_size: int | None, out: BinaryIO) -> int:
        """Stream the verified content of ``digest`` into ``out``; return its size.

        ``out`` may hold a prefix of unverified bytes when this raises: callers
        write to a temp file and discard it on error.
        """
        with self._recent_lock:
            known = self._recent.get(digest)
            ahead = self._ahead.get(digest) if known is None else None
        if ahead is not None and ahead.wait(AHEAD_WAIT):  # bounded: its GET is
            with self._recent_lock:
                known = self._recent.get(digest)
        if known is not None and (expected_size is None or expected_size == len(known)):
            out.write(known)
            return len(known)
        start = _tell(out)
        try:
            return self._get_into(digest, expected_size, out)
        except CorruptObjectError as e:
            if not (self._rejected(e) and _rewind(out, start)):
                raise
        return self._again(digest, expected_size, out)

    def _again(self, digest: str, expected_size: int | None, out: BinaryIO) -> int:
        """Read ``digest`` once more: the rejected bytes may have been a site cache's, and
        the backend now reads from the endpoint (casfs.store.sitecache)."""
        try:
            return self._get_into(digest, expected_size, out)
        except CorruptObjectError as e:
            self._rejected(e)
            raise

    def read_members(self, wanted: dict[str, tuple[str, int, int]], max_span: int
                     ) -> dict[str, bytes]:
        """The stored bytes of several pack members, one range read per pack.

        ``wanted``: digest -> its (pack, offset, length). Members of one pack
        whose span is at most ``max_span`` bytes come from one read (one GET on
        an object store instead of one per member); anything else (a lone
        member, a wide span, a pack gone or short) is left out: the caller
        reads those one by one (``get_into`` follows forwards). Nothing here is
        verified yet: pass each to ``get_stored_into``.
        """
        by_pack: dict[str, list[tuple[str, int, int]]] = {}
        for digest, (pack, off, length) in wanted.items():
            by_pack.setdefault(pack, []).append((digest, off, length))
        out: dict[str, bytes] = {}
        for pack, members in by_pack.items():
            lo = min(off for _, off, _ in members)
            hi = max(off + length for _, off, length in members)
            if len(members) < 2 or hi - lo > max_span:
                continue
            try:
                raw = self.backend.read_range(pack_key(pack), lo, hi - lo)
            except (OSError, NotRegularFileError):  # gone (repacked), unreadable: one by one
                continue
            if len(raw) != hi - lo:
                continue
            self.counters.inc("pack_span_reads")
            for digest, off, length in members:
                out[digest] = raw[off - lo:off - lo + length]
        return out

    def get_stored_into(self, digest: str, expected_size: int | None, stored: bytes,
                        out: BinaryIO) -> int:
        """``get_into`` for an object's stored bytes read already (``read_members``)."""
        start = _tell(out)
        try:
            n = self._packed_into(digest, expected_size, out, io.BytesIO(stored))
        except CorruptObjectError as e:
            if not (self._rejected(e) and _rewind(out, start)):
                raise
            return self._again(digest, expected_size, out)
        self.counters.inc("packed_reads")
        return n

    def decode_member(self, digest: str, size: int, stored: bytes) -> bytes:
        """The verified content of a small object (a pack member) from its stored bytes,
        in memory: header checked, output bounded by ``size`` (what the manifest
        says), blake3 compared with the name. One call per object and no stream
        (the whole-namespace fetch decodes thousands of few-KB members);
        CorruptObjectError (counted as a rejection) on any mismatch."""
        try:
            hdr = parse_header(stored[:HEADER_SIZE], digest)
            if hdr.size != size:
                raise CorruptObjectError(
                    f"object {digest}: header says {hdr.size} bytes, manifest says {size}")
            check_object_size(size, f"object {digest}")
            payload = memoryview(stored)[HEADER_SIZE:]
            if hdr.codec == CODEC_RAW:
                data = bytes(payload)
            else:
                dctx = getattr(self._tls, "dctx", None)
                if dctx is None:
                    dctx = self._tls.dctx = zstandard.ZstdDecompressor(
                        max_window_size=MAX_WINDOW)
                try:
                    # A frame declaring its content size gets that much memory: never
                    # more than the manifest's size; one without is bounded by
                    # max_output_size.
                    declared = zstandard.frame_content_size(payload)
                    if declared > size:
                        raise CorruptObjectError(f"object {digest}: frame declares {declared}"
                                                 f" bytes, header says {size}")
                    data = dctx.decompress(payload, max_output_size=max(size, 1))
                except zstandard.ZstdError as e:
                    raise CorruptObjectError(f"object {digest}: bad zstd data ({e})") from None
            if len(data) != size:
                raise CorruptObjectError(f"object {digest}: {len(data)} bytes, header says"
                                         f" {size}")
            if blake3.blake3(data).hexdigest() != digest:
                raise CorruptObjectError(f"object {digest}: content does not match its name")
        except CorruptObjectError as e:
            self._rejected(e)
            raise
        return data

    def _rejected(self, e: CorruptObjectError) -> bool:
        """Count and log a rejection. A backend reading through a site cache
        (casfs.store.sitecache) then stops using it for a while: True if the rejected
        bytes may have come from it (worth one more read, from the endpoint)."""
        self.counters.inc("rejections")
        log.warning("rejected object: %s", e)
        distrust = getattr(self.backend, "distrust", None)
        return bool(distrust()) if distrust is not None else False

    def verify_stored(self, digest: str, stored: bytes) -> int:
        """Verify ``stored`` (a loose object's or pack member's bytes) as object ``digest``."""

        class _Null:
            def write(self, b: bytes) -> int:
                return len(b)

        try:
            return self._get_into(digest, None, _Null(), io.BytesIO(stored))  # type: ignore[arg-type]
        except CorruptObjectError:
            self.counters.inc("rejections")
            raise

    def _get_into(self, digest: str, expected_size: int | None, out: BinaryIO,
                  source: BinaryIO | None = None) -> int:
        check_digest(digest)
        if expected_size is not None:
            check_object_size(expected_size, f"object {digest}")  # before any I/O
        if source is not None:
            return self._decode(digest, expected_size, out, source)
        try:
            src, packed = self._open_src(digest)
        except CorruptObjectError as e:  # its pack is not a regular file
            return self._from_loose(digest, expected_size, out, e)
        if packed:
            return self._packed_into(digest, expected_size, out, src)
        return self._decode(digest, expected_size, out, src)

    def _packed_into(self, digest: str, expected_size: int | None, out: BinaryIO,
                     src: BinaryIO) -> int:
        """A pack member (small, in memory) verified whole before ``out`` sees a byte, so
        a damaged one can still be served from a loose copy."""
        buf = io.BytesIO()
        try:
            head = src.read(HEADER_SIZE)
            src.seek(0)
            big = parse_header(head, digest).size > PACKED_BUFFER
            if not big:
                n = self._decode(digest, expected_size, buf, src)
        except CorruptObjectError as e:
            return self._from_loose(digest, expected_size, out, e)
        if big:  # never buffer a bomb; ``out`` may then hold a prefix when this raises
            return self._decode(digest, expected_size, out, src)
        out.write(buf.getbuffer())
        return n

    def _from_loose(self, digest: str, expected_size: int | None, out: BinaryIO,
                    why: CorruptObjectError) -> int:
        loose = self._loose_copy(digest)
        if loose is None:
            raise why
        log.warning("%s: reading its loose copy", why)
        return self._decode(digest, expected_size, out, loose)

    def _decode(self, digest: str, expected_size: int | None, out: BinaryIO,
                source: BinaryIO) -> int:
        with source as f:
            hdr = parse_header(f.read(HEADER_SIZE), digest)
            check_object_size(hdr.size, f"object {digest}")
            if expected_size is not None and hdr.size != expected_size:
                raise CorruptObjectError(
                    f"object {digest}: header says {hdr.size} bytes, manifest says {expected_size}"
                )
            h = blake3.blake3()
            n = 0
            if hdr.codec == CODEC_RAW:
                reader: BinaryIO = f
            else:
                reader = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW).stream_reader(
                    f, read_across_frames=True
                )
            try:
                while True:
                    # Never read past the declared size + 1 byte: a lying frame
                    # cannot make us allocate more than one chunk.
                    chunk = reader.read(min(CHUNK, hdr.size - n + 1))
                    if not chunk:
                        break
                    n += len(chunk)
                    if n > hdr.size:
                        raise CorruptObjectError(f"object {digest}: longer than its header says")
                    h.update(chunk)
                    out.write(chunk)
            except zstandard.ZstdError as e:
                raise CorruptObjectError(f"object {digest}: bad zstd data ({e})") from None
        if n != hdr.size:
            raise CorruptObjectError(f"object {digest}: {n} bytes, header says {hdr.size}")
        if h.hexdigest() != digest:
            raise CorruptObjectError(f"object {digest}: content does not match its name")
        return n

    def get_bytes(self, digest: str, expected_size: int | None = None) -> bytes:
        buf = io.BytesIO()
        self.get_into(digest, expected_size, buf)
        return buf.getvalue()

    def verify(self, digest: str, expected_size: int | None = None) -> int:
        """Re-hash one object; raise CorruptObjectError/ObjectMissingError on a problem."""

        class _Null:
            def write(self, b: bytes) -> int:
                return len(b)

        return self.get_into(digest, expected_size, _Null())  # type: ignore[arg-type]

    # --- enumeration (gc, verify, du) -------------------------------------
    def iter_digests(self) -> Iterator[str]:
        """Every well-named object in the store; stray names are skipped."""
        for fan in self.backend.list("objects"):
            if len(fan) != 2:
                continue
            for rest in self.backend.list(f"objects/{fan}"):
                d = fan + rest
                if DIGEST_RE.match(d):
                    yield d

    def forget_pack(self, pack: str) -> None:
        """Forget every location inside ``pack`` (it is gone: gc removed it)."""
        for d in [d for d, loc in self.locations.items() if loc[0] == pack]:
            del self.locations[d]

    def stored_size(self, digest: str) -> int:
        loc = self.locations.get(digest)
        if loc is not None:
            return loc[2]  # its share of a pack
        info = self.backend.info(object_key(digest))
        return info.size if info else 0

    def delete(self, digest: str) -> None:
        """Remove an object (gc only: objects are otherwise never removed)."""
        with contextlib.suppress(FileNotFoundError):
            self.backend.delete(object_key(check_digest(digest)))
