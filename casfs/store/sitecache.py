"""Unsigned reads of objects and packs through a site HTTP cache (``?read_cache=URL``).

Objects and packs are immutable and named by their blake3 digest, and every
byte of them is verified before it is served (``ObjectStore``: a loose object
on first open, a pack member by ``decode_member``), so an ordinary HTTP cache
(nginx ``proxy_cache``, Squid, Varnish) in front of the endpoint can serve a
rack or a site. Signed requests are per node and per time, and such caches do
not (or must not) cache requests carrying ``Authorization``, so these reads go
unsigned, path-style: ``GET <cache>/<bucket>/<prefix>/objects/ab/<62 hex>``
(and ranged GETs of ``packs/...``). The bucket must let anonymous callers read
just those two prefixes (docs/fleet.md, "A site cache in front of the root").

Everything else goes signed straight to the endpoint, as without a cache:
records, statements, read and outcome records, manifests' forwards
(``repacked/``), the marker, every HEAD (a cached "exists" could make a
publisher name an object gc removed), every LIST, PUT and DELETE. Nothing a
reader must see fresh can be served stale by the cache.

The cache is never trusted, only used:

- a 404 from the cache is a cache miss: the same read goes to the endpoint;
- any other failure (refused, timed out, 403 from a bucket without anonymous
  reads, 5xx, a body cut short) also goes to the endpoint, and the cache is
  left alone for ``COOLDOWN_S`` (logged at INFO once per cooldown), so a cache
  that is down costs one failed request per process and cooldown, never a
  miss or an error to the job;
- an answer that cannot be what was asked (a body that does not start with an
  object header's magic, a range shorter than asked) is read again from the
  endpoint; a stream from the cache cut short continues from the endpoint at
  the same offset;
- bytes that pass those checks but fail verification (a cache serving a
  wrong or damaged object) are rejected by the object store, as any damaged
  object is, never served. The object store then calls ``distrust``: this
  process reads everything from the endpoint for ``DISTRUST_S`` (a WARNING),
  and the object store reads that object once more, from the endpoint, so the
  job gets the right bytes (or, where the output cannot be rewound, a miss).

Off by default; ``casfs verify`` and ``casfs gc`` never read through it (they
check the root itself). Layering: wraps casfs.store.s3backend's S3Backend;
casfs.store.root builds it; it imports nothing above casfs.store.
"""

from __future__ import annotations

import errno
import io
import logging
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

from casfs.store.backend import KeyInfo
from casfs.store.s3backend import STREAM_CHUNK, S3Backend, bounded
from casfs.util.counters import Counters

log = logging.getLogger(__name__)

# Keys under these prefixes (relative to the root) are read through the cache.
CACHED_PREFIXES = ("objects/", "packs/")
# Every object and every pack member starts with an object header (docs/format.md).
MAGIC = b"CASF"
COOLDOWN_S = 30.0  # a cache that failed is not asked again for this long
DISTRUST_S = 60.0  # after bytes read while the cache served failed verification
CONNECT_TIMEOUT_S = 1.0  # a cache is near the node: connecting should be quick


class SiteCacheError(Exception):
    """The cache's answer cannot be what was asked (the read goes to the endpoint)."""


def cacheable(key: str) -> bool:
    return key.startswith(CACHED_PREFIXES)


class SiteCachedBackend:
    """A Backend over an S3 root whose object and pack reads go through a site cache.

    Everything but ``open`` and ``read_range`` of ``CACHED_PREFIXES`` keys is the
    endpoint's signed backend, ``origin``, unchanged."""

    remote = True

    def __init__(self, origin: S3Backend, cache_url: str, *, timeout: float = 20.0,
                 counters: Counters | None = None) -> None:
        import obstore
        from obstore import exceptions as ox
        from obstore.store import S3Store

        self.origin = origin
        self.staging_dir: Path = origin.staging_dir
        self.cache_url = cache_url
        self.counters = counters or Counters()
        self._ob = obstore
        self._x = ox
        loc = origin.loc
        cfg: Any = {"endpoint": cache_url, "skip_signature": True,
                    "virtual_hosted_style_request": False,
                    "region": loc.region or "us-east-1"}
        client: Any = {"allow_http": cache_url.startswith("http://"),
                       "timeout": timedelta(seconds=timeout),
                       "connect_timeout": timedelta(seconds=min(CONNECT_TIMEOUT_S, timeout))}
        retry: Any = {"max_retries": 0, "retry_timeout": timedelta(seconds=timeout)}
        self.cache = S3Store(loc.bucket, prefix=loc.prefix or None, config=cfg,
                             client_options=client, retry_config=retry)
        self._lock = threading.Lock()
        self._off_until = 0.0  # monotonic: the cache is not asked before then
        self._last_served = float("-inf")  # monotonic: when the cache last answered

    def __repr__(self) -> str:
        return f"SiteCachedBackend({self.origin.loc}, cache={self.cache_url})"

    # --- when the cache is asked ---------------------------------------------
    def _usable(self, key: str) -> bool:
        return cacheable(key) and time.monotonic() >= self._off_until

    def _failed(self, key: str, why: object) -> None:
        """The cache failed: the endpoint answers, and the cache rests COOLDOWN_S."""
        self.counters.inc("site_cache_failures")
        with self._lock:
            now = time.monotonic()
            first = now >= self._off_until
            self._off_until = max(self._off_until, now + COOLDOWN_S)
        if first:
            log.info("site cache %s: %s (reading %s): reading from the endpoint for %.0f s",
                     self.cache_url, why, key, COOLDOWN_S)

    def _served(self) -> None:
        self.counters.inc("site_cache_reads")
        self._last_served = time.monotonic()

    def distrust(self) -> bool:
        """Bytes failed verification (ObjectStore): if the cache served reads lately, they
        may have come from it, so read everything from the endpoint for DISTRUST_S and
        say so (True: the object store reads that object once more)."""
        now = time.monotonic()
        if now - self._last_served > DISTRUST_S:
            return False  # the cache served nothing lately: the root's own damage
        with self._lock:
            first = now >= self._off_until
            self._off_until = max(self._off_until, now + DISTRUST_S)
        self.counters.inc("site_cache_distrusted")
        if first:
            log.warning("site cache %s: bytes read while it served failed verification:"
                        " reading from the endpoint for %.0f s", self.cache_url, DISTRUST_S)
        return True

    # --- reads -----------------------------------------------------------------
    def open(self, key: str) -> BinaryIO:
        if self._usable(key):
            try:
                return self._cache_open(key)
            except (FileNotFoundError, self._x.NotFoundError):
                self.counters.inc("site_cache_misses")
            except SiteCacheError as e:
                self.counters.inc("site_cache_refused")
                log.debug("site cache %s: %s: %s", self.cache_url, key, e)
            except Exception as e:
                self._failed(key, _text(e))
        return self.origin.open(key)

    def _cache_open(self, key: str) -> BinaryIO:
        res = self._ob.get(self.cache, key)
        size = int(res.meta["size"])
        stream = bounded(res.stream(min_chunk_size=STREAM_CHUNK), size, key)
        if size <= STREAM_CHUNK:
            data = b"".join(bytes(c) for c in stream)
            if len(data) != size or not data.startswith(MAGIC):
                raise SiteCacheError("not an object")
            self._served()
            return io.BytesIO(data)
        f = io.BufferedReader(_Resuming(self, key, stream, size), buffer_size=STREAM_CHUNK)
        if not f.peek(len(MAGIC)).startswith(MAGIC):
            f.close()
            raise SiteCacheError("not an object")
        self._served()
        return f

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        if length > 0 and self._usable(key):
            try:
                res = self._ob.get(self.cache, key, options={"range": (offset, offset + length)})
                raw = b"".join(bytes(c) for c in bounded(
                    res.stream(min_chunk_size=STREAM_CHUNK), length, key))
                # every read of a pack's members starts at a member: an object header
                if len(raw) == length and raw.startswith(MAGIC):
                    self._served()
                    return raw
                self.counters.inc("site_cache_refused")
            except (FileNotFoundError, self._x.NotFoundError):
                self.counters.inc("site_cache_misses")
            except Exception as e:
                self._failed(key, _text(e))
        return self.origin.read_range(key, offset, length)

    def _resume(self, key: str, offset: int, size: int, why: BaseException) -> Iterator[Any]:
        """The rest of ``key`` from ``offset``, from the endpoint (a cache stream broke)."""
        self._failed(key, f"stream cut at {offset}: {_text(why)}")
        try:
            res = self._ob.get(self.origin.store, key, options={"range": {"offset": offset}})
            return bounded(res.stream(min_chunk_size=STREAM_CHUNK), size - offset, key)
        except Exception as e:
            raise OSError(errno.EIO, f"object store: {_text(e)}") from None

    # --- everything else: the endpoint, signed ------------------------------------
    def put_if_absent(self, key: str, staged: Path) -> bool:
        return self.origin.put_if_absent(key, staged)

    def sync(self) -> None:
        self.origin.sync()

    def replace(self, key: str, staged: Path) -> None:
        self.origin.replace(key, staged)

    def create_exclusive(self, key: str, data: bytes) -> bool:
        return self.origin.create_exclusive(key, data)

    def info(self, key: str) -> KeyInfo | None:
        return self.origin.info(key)

    def touch(self, key: str) -> None:
        self.origin.touch(key)

    def list(self, prefix: str) -> Iterator[str]:
        return self.origin.list(prefix)

    def list_after(self, prefix: str, after: str) -> Iterator[str]:
        return self.origin.list_after(prefix, after)

    def delete(self, key: str) -> None:
        self.origin.delete(key)

    def staging_entries(self) -> Iterator[tuple[str, float]]:
        return self.origin.staging_entries()

    def close(self) -> None:
        self.origin.close()


class _Resuming(io.RawIOBase):
    """A cache's chunk stream that, cut short, continues from the endpoint where it broke."""

    def __init__(self, owner: SiteCachedBackend, key: str, stream: Any, size: int) -> None:
        self._owner = owner
        self._key = key
        self._size = size
        self._it: Iterator[Any] = iter(stream)
        self._buf = memoryview(b"")
        self._pos = 0
        self._resumed = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = memoryview(bytes(next(self._it)))
            except StopIteration:
                return 0
            except Exception as e:
                if self._resumed:
                    raise OSError(errno.EIO, f"object store: {_text(e)}") from None
                self._resumed = True
                self._it = self._owner._resume(self._key, self._pos, self._size, e)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        self._pos += n
        return n


def _text(e: BaseException) -> str:
    """A failure in one line (obstore's errors span several)."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first[:200]}" if first else type(e).__name__
