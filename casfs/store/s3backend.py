"""A Backend on S3-compatible object storage, through obstore (Rust object_store).

Why obstore and not boto3 (bench/s3_clients.py, docs/architecture.md): it
releases the GIL for the whole request, speaks create-only PUT natively
(``mode="create"`` = ``If-None-Match: *``), and on the reads that sit under a
lazy fetch (GET, ranged GET, HEAD) it did 1.3-4.7x boto3's requests/s here.
boto3 stays for two things. It resolves credentials through the standard AWS
chain (environment, ``~/.aws`` profiles, SSO, instance and container roles),
which obstore then uses through its credential-provider hook; not when the
environment holds the keys and the region or endpoint is known: that is where
the chain would stop anyway, and importing boto3 costs ~0.4 CPU-seconds in each
of a node's processes (mount, fetch and promotion workers, `casfs run`), on a
fresh node's critical path (issue 23). And it pages the top-level listings
(below), which no mount process makes.

Mapping of the verbs:
- put_if_absent / create_exclusive: PUT with ``If-None-Match: *``; 412 or 409
  means another writer created the key first (False), exactly like EEXIST.
  A staged file over ``MULTIPART_OVER`` (a large object or pack) is streamed
  up in parts instead (``_upload``: memory stays about PART_SIZE x
  (PART_CONCURRENCY + 1) whatever its size; a single PUT holds the whole
  object in memory, and obstore's create-only PUT cannot be multipart). Its
  create-only check is a HEAD just before: such keys are content-addressed,
  so a writer racing through that window uploads the same bytes under the
  same name (readers verify them either way). The object appears whole when
  the upload completes, or not at all: a failed upload is aborted, and one
  cut by a crash stays an incomplete multipart upload, which no GET or LIST
  sees (a bucket lifecycle rule ``AbortIncompleteMultipartUpload`` frees its
  parts).
- sync: nothing (a PUT is durable once it returns).
- list: a leaf prefix (a namespace's records, a fan-out dir: what a mount
  process lists) is walked a page at a time through obstore; the layout's top
  levels (``namespaces``, ``objects``, ``packs``: the CLI and gc) by a LIST
  with a delimiter through boto3, since obstore's follows every page into
  memory. Both are bounded (MAX_LISTED). Listing may lag on some servers;
  callers never depend on it for correctness (records are found by probing
  forward).
- touch: nothing. gc does not rely on mtimes being refreshed (maintenance.py).
- Every other failure (server down, timeout, 5xx, auth) is an OSError, which
  the fetch path turns into a miss and publication into a retry.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import logging
import os
import random
import threading
from collections import OrderedDict
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

from casfs.store.backend import KeyInfo
from casfs.util.crashpoint import crashpoint
from casfs.util.defaults import default_state_dir
from casfs.util.location import S3Location
from casfs.util.owned import check_dir

log = logging.getLogger(__name__)

STREAM_CHUNK = 1 << 20
# Keys one listing of a leaf prefix (a namespace's records, a fan-out dir) may read
# before it is refused: a bound on a server whose pages never end.
MAX_LISTED = 1_000_000
# Staged files larger than this are uploaded in parts of PART_SIZE, at most
# PART_CONCURRENCY in flight (S3's smallest part is 5 MiB, the last one excepted).
MULTIPART_OVER = 16 << 20
PART_SIZE = 8 << 20
PART_CONCURRENCY = 2


# The first retry of a failed request waits INIT_BACKOFF, drawn per backend (per node)
# from this range: obstore's backoff (Rust object_store's BackoffConfig) jitters every
# later wait (decorrelated jitter: random between init_backoff and base x the last
# one) but waits exactly init_backoff the first time, so a fleet of nodes meeting one
# 503 burst or one server restart would otherwise all retry at the same instant.
INIT_BACKOFF_S = (0.05, 0.15)
MAX_BACKOFF_S = 2.0


def retry_backoff(rng: random.Random | None = None) -> dict[str, Any]:
    """obstore's ``backoff`` config for one backend, its first wait jittered."""
    lo, hi = INIT_BACKOFF_S
    return {"init_backoff": timedelta(seconds=(rng or random).uniform(lo, hi)),
            "max_backoff": timedelta(seconds=MAX_BACKOFF_S), "base": 2}


class S3UnavailableError(OSError):
    """The object store did not answer, or refused the request."""


def _check_key(key: str) -> str:
    if key.startswith("/") or ".." in key.split("/") or "\0" in key or key.endswith("/"):
        raise ValueError(f"storage key escapes the root: {key!r:.120}")
    return key


def staging_dir_for(loc: S3Location) -> Path:
    """Where this process stages objects, packs and records before an upload: the node
    state dir's ``s3-staging``, its user's alone (checked and made like the state dir,
    casfs.util.owned). Never a fixed name in /tmp, which another user can make first
    and watch: what root stages there she could read, or swap for bytes of her own
    before the upload (found by a review on 2026-12-06)."""
    return check_dir(default_state_dir() / "s3-staging", "S3 staging directory",
                     create_mode=0o700)


def bounded(stream: Any, limit: int, key: str) -> Iterator[Any]:
    """obstore's chunks of ``key``, refused (OSError) once more than ``limit`` bytes came.

    hyper lets a chunked body win over its Content-Length while obstore's size is the
    Content-Length, and get_range gathers a 206's body whatever its length: a review's
    hostile server sent 768 MiB as a 100-byte record (the node's host at 1.5 GB) and as
    pack ranges (fetch workers at 9 GB). What the server declared, or asked for, is all
    that is read."""
    n = 0
    for chunk in stream:
        n += len(chunk)
        if n > limit:
            raise S3UnavailableError(errno.EIO, f"object store: {key}: the server sent more"
                                                f" than the {limit} bytes it declared")
        yield chunk


def read_bounded(stream: Any, limit: int, key: str) -> bytes:
    """The whole of a bounded stream (see ``bounded``)."""
    try:
        return b"".join(bytes(c) for c in bounded(stream, limit, key))
    except S3UnavailableError:
        raise
    except Exception as e:
        raise _oserror(e) from None


class _StreamRaw(io.RawIOBase):
    """A read-only raw file over obstore's chunk stream, at most ``limit`` bytes long."""

    def __init__(self, stream: Any, limit: int, key: str) -> None:
        self._it = bounded(stream, limit, key)
        self._buf = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = memoryview(bytes(next(self._it)))
            except StopIteration:
                return 0
            except S3UnavailableError:
                raise
            except Exception as e:
                raise _oserror(e) from None
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def _oserror(e: BaseException) -> OSError:
    """An obstore failure as an OSError whose text holds no credentials."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return S3UnavailableError(errno.EIO, f"object store: {type(e).__name__}: {first[:300]}")


def _env_has_keys() -> bool:
    return bool(os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"))


def _credential_provider() -> Any:
    """boto3's credential chain for obstore, or None to let obstore read the environment."""
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        return None
    session = boto3.Session()
    if session.get_credentials() is None:
        return None
    return Boto3CredentialProvider(session)


def _profile_endpoint() -> str:
    """The AWS profile's endpoint (``~/.aws/config``: ``endpoint_url``, or in an ``s3 =``
    section), which AWS's own SDKs and CLI use after the environment's; "" if none."""
    if os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true":
        return ""
    if not os.path.exists(os.environ.get("AWS_CONFIG_FILE") or os.path.expanduser(
            "~/.aws/config")):
        return ""  # no profile to name one (and no boto3 import for nothing)
    try:
        import boto3

        cfg = boto3.Session()._session.get_scoped_config()  # holds secrets: never logged
    except Exception:  # no boto3, no such profile: AWS's default endpoint
        return ""
    s3 = cfg.get("s3")
    ep = (s3.get("endpoint_url") if isinstance(s3, dict) else None) or cfg.get("endpoint_url")
    return ep if isinstance(ep, str) else ""


def _endpoint_region(loc: S3Location) -> tuple[str, str]:
    """The endpoint ("" for AWS's own) and region ("" if none named) ``loc`` resolves to."""
    endpoint = (loc.endpoint or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL") or _profile_endpoint())
    region = loc.region or os.environ.get("AWS_REGION") \
        or os.environ.get("AWS_DEFAULT_REGION") or ""
    return endpoint, region


def _lister(loc: S3Location, timeout: float, retries: int) -> Any:
    """A boto3 S3 client for the top-level listings (``_by_name``), which obstore cannot
    page: built on first use only, since importing boto3 costs ~0.4 CPU-seconds."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    endpoint, region = _endpoint_region(loc)
    session = boto3.Session()
    cfg = Config(connect_timeout=min(5.0, timeout), read_timeout=timeout,
                 retries={"max_attempts": retries + 1, "mode": "standard"},
                 s3={"addressing_style": "path"} if endpoint else None,
                 signature_version=UNSIGNED if session.get_credentials() is None else None)
    return session.client("s3", endpoint_url=endpoint or None,
                          region_name=region or session.region_name or "us-east-1", config=cfg)


# One client, with its connection pool, per process for each root, timeout and
# environment: a host's namespaces and a worker's requests reuse warm connections (a
# new one costs a round trip before its first request, two more with TLS), and the
# credential chain is resolved once. Keyed on all that builds it, the AWS_* variables
# and the AWS files' mtimes included: credentials or an endpoint changed in the
# environment or in ~/.aws make a new client.
_CLIENTS: OrderedDict[str, tuple[Any, dict[str, Any]]] = OrderedDict()
_CLIENTS_KEPT = 16
_CLIENTS_LOCK = threading.Lock()


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _client(loc: S3Location, timeout: float, retries: int) -> tuple[Any, dict[str, Any]]:
    """The process's obstore S3Store for ``loc`` and its retry config (built once)."""
    from obstore.store import S3Store

    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_") or k == "HOME")
    files = [_mtime(os.environ.get(var) or os.path.expanduser(f"~/.aws/{name}"))
             for var, name in (("AWS_CONFIG_FILE", "config"),
                               ("AWS_SHARED_CREDENTIALS_FILE", "credentials"))]
    key = hashlib.sha256(json.dumps([os.getpid(), loc.bucket, loc.prefix, loc.endpoint,
                                     loc.region, timeout, retries, env, files]
                                    ).encode()).hexdigest()
    with _CLIENTS_LOCK:
        kept = _CLIENTS.get(key)
        if kept is not None:
            _CLIENTS.move_to_end(key)
            return kept
    endpoint, region = _endpoint_region(loc)
    cfg: Any = {}
    if endpoint:
        cfg["endpoint"] = endpoint
        cfg["virtual_hosted_style_request"] = False
    # keys in the environment come first in boto3's chain too; a region only a
    # ~/.aws profile names (AWS itself, no endpoint) still needs boto3
    provider = None if _env_has_keys() and (region or endpoint) else _credential_provider()
    if region:
        cfg["region"] = region
    elif provider is None or "region" not in provider.config:
        cfg["region"] = "us-east-1"
    client: Any = {"allow_http": endpoint.startswith("http://"),
                   "timeout": timedelta(seconds=timeout),
                   "connect_timeout": timedelta(seconds=min(5.0, timeout))}
    retry: Any = {"max_retries": retries, "retry_timeout": timedelta(seconds=timeout),
                  "backoff": retry_backoff()}
    try:
        store = S3Store(loc.bucket, prefix=loc.prefix or None, config=cfg,
                        client_options=client, retry_config=retry,
                        credential_provider=provider)
    except Exception as e:
        raise _oserror(e) from None
    with _CLIENTS_LOCK:
        _CLIENTS[key] = (store, retry)
        while len(_CLIENTS) > _CLIENTS_KEPT:
            _CLIENTS.popitem(last=False)
    return store, retry


class S3Backend:
    """A Backend over ``s3://bucket/prefix``."""

    remote = True

    def __init__(self, loc: S3Location, *, timeout: float = 20.0, retries: int = 2,
                 staging_dir: Path | None = None) -> None:
        import obstore
        from obstore import exceptions as ox

        self.loc = loc
        self.staging_dir = staging_dir or staging_dir_for(loc)
        self._ob = obstore
        self._x = ox
        self.store, self.retry_config = _client(loc, timeout, retries)
        self.timeout, self.retries = timeout, retries
        self._boto: Any = None  # (_by_name's client, made on its first use)

    def __repr__(self) -> str:
        return f"S3Backend({self.loc})"  # never the credentials

    # --- writing ----------------------------------------------------------
    def _create(self, key: str, data: Any) -> bool:
        _check_key(key)
        try:
            self._ob.put(self.store, key, data, mode="create", use_multipart=False)
            return True
        except (self._x.AlreadyExistsError, self._x.PreconditionError):
            return False
        except Exception as e:
            raise _oserror(e) from None

    def put_if_absent(self, key: str, staged: Path) -> bool:
        try:
            if staged.stat().st_size <= MULTIPART_OVER:
                return self._create(key, staged.read_bytes())
            if self.info(key) is not None:  # see the module's docstring
                return False
            self._upload(key, staged)
            return True
        finally:
            staged.unlink(missing_ok=True)

    def _upload(self, key: str, staged: Path) -> None:
        """Stream ``staged`` into ``key`` as a multipart upload (overwrites), aborted on
        any failure: the object is there whole, or not at all."""
        _check_key(key)
        try:
            with open(staged, "rb") as f, self._ob.open_writer(
                    self.store, key, buffer_size=PART_SIZE,
                    max_concurrency=PART_CONCURRENCY) as w:
                # leaving the block by an exception aborts the upload; normally it completes
                while chunk := f.read(PART_SIZE):
                    w.write(chunk)
                    crashpoint("s3-part-sent")
        except S3UnavailableError:
            raise
        except Exception as e:  # the writer's errors may be OSErrors: none keeps its text
            raise _oserror(e) from None

    def sync(self) -> None:
        pass  # a completed PUT is durable

    def replace(self, key: str, staged: Path) -> None:
        _check_key(key)
        try:
            if staged.stat().st_size > MULTIPART_OVER:
                self._upload(key, staged)
            else:
                self._ob.put(self.store, key, staged.read_bytes(), use_multipart=False)
        except S3UnavailableError:
            raise
        except Exception as e:
            raise _oserror(e) from None
        finally:
            staged.unlink(missing_ok=True)

    def create_exclusive(self, key: str, data: bytes) -> bool:
        return self._create(key, data)

    # --- reading ----------------------------------------------------------
    def open(self, key: str) -> BinaryIO:
        _check_key(key)
        try:
            res = self._ob.get(self.store, key)
        except (FileNotFoundError, self._x.NotFoundError):
            raise FileNotFoundError(errno.ENOENT, "no such key", key) from None
        except Exception as e:
            raise _oserror(e) from None
        size = int(res.meta["size"])
        stream = res.stream(min_chunk_size=STREAM_CHUNK)
        if size <= STREAM_CHUNK:
            return io.BytesIO(read_bounded(stream, size, key))
        return io.BufferedReader(_StreamRaw(stream, size, key))

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        _check_key(key)
        try:
            res = self._ob.get(self.store, key, options={"range": (offset, offset + length)})
            return read_bounded(res.stream(min_chunk_size=STREAM_CHUNK), length, key)
        except S3UnavailableError:
            raise
        except (FileNotFoundError, self._x.NotFoundError):
            raise FileNotFoundError(errno.ENOENT, "no such key", key) from None
        except Exception as e:
            raise _oserror(e) from None

    def info(self, key: str) -> KeyInfo | None:
        _check_key(key)
        try:
            meta = self._ob.head(self.store, key)
        except (FileNotFoundError, self._x.NotFoundError):
            return None
        except Exception as e:
            raise _oserror(e) from None
        return KeyInfo(int(meta["size"]), meta["last_modified"].timestamp())

    def touch(self, key: str) -> None:
        pass  # objects cannot be touched; gc does not need it (two-phase, maintenance.py)

    def list(self, prefix: str) -> Iterator[str]:
        p = prefix.strip("/")
        if p:
            _check_key(p)
        if "/" in p:
            # Below the layout's top levels every listed prefix is a leaf directory (a
            # namespace's records, pins, reads; a fan-out of objects or packs): walked
            # page by page, bounded (MAX_LISTED), never followed into memory for good.
            return self._walk(p, None)
        return self._by_name(p)

    def _by_name(self, p: str) -> Iterator[str]:
        """The names directly under ``p/`` (the layout's top levels: ``namespaces``,
        ``objects``, ``packs``), from a LIST with a delimiter, a page at a time. obstore's
        own delimiter listing follows every page into memory: a server whose pages never
        end grew a process for good. Refused (OSError) past MAX_LISTED names, or at a
        page whose continuation token repeats the one before."""
        if self._boto is None:
            try:
                self._boto = _lister(self.loc, self.timeout, self.retries)
            except Exception as e:
                raise _oserror(e) from None
        full = "/".join(x for x in (self.loc.prefix.strip("/"), p) if x)
        full = full + "/" if full else ""
        names: set[str] = set()
        seen, token = 0, ""
        while True:
            kw: dict[str, Any] = {"Bucket": self.loc.bucket, "Prefix": full, "Delimiter": "/"}
            if token:
                kw["ContinuationToken"] = token
            try:
                page = self._boto.list_objects_v2(**kw)
            except Exception as e:
                if type(e).__name__ == "NoSuchBucket" or "NoSuchBucket" in str(e):
                    return iter(())
                raise _oserror(e) from None
            cps = page.get("CommonPrefixes") or []
            objs = page.get("Contents") or []
            # a page counts as at least 100 names (S3 gives 1,000): a server paging one
            # name at a time, or none, cannot make a million requests of one listing
            seen += max(len(cps) + len(objs), 100)
            if seen > MAX_LISTED:
                raise OSError(errno.EOVERFLOW, f"listing {p or '/'}: more than {MAX_LISTED}"
                              " names (a broken or hostile listing?)")
            names.update(str(c.get("Prefix", ""))[len(full):].rstrip("/") for c in cps)
            names.update(str(o.get("Key", ""))[len(full):] for o in objs)
            nxt = str(page.get("NextContinuationToken") or "")
            if not page.get("IsTruncated") or not nxt:
                break
            if nxt == token:
                raise OSError(errno.EPROTO, f"listing {p or '/'}: the server repeats its"
                              " continuation token (a broken or hostile listing?)")
            token = nxt
        return iter(sorted(n for n in names if n and "/" not in n))

    def list_after(self, prefix: str, after: str) -> Iterator[str]:
        p = _check_key(prefix.strip("/"))
        return iter([n for n in self._walk(p, f"{p}/{after}") if n > after])

    def _walk(self, p: str, offset: str | None) -> Iterator[str]:
        """The first segments of the keys under ``p/`` (from ``offset`` on), sorted: a
        recursive listing read a page at a time. A server whose pages never end (a
        continuation token repeated, IsTruncated for ever) or a prefix holding more
        than MAX_LISTED keys is refused (OSError) once that many are read: obstore's
        own paging held every page in memory for as long as the server went on. One
        whose pages hold nothing for ever is refused once no key came for
        ``2 x timeout``: obstore's stream hands nothing back until it holds a key,
        so it is read asynchronously, and dropping it stops its requests."""
        import asyncio  # (here: ~30 ms of a process's start, for its first listing only)

        names: set[str] = set()
        seen, starved = 0, False
        wait = 2 * max(self.timeout, 5.0)

        async def pages() -> None:
            nonlocal seen, starved
            stream = self._ob.list(self.store, p + "/", offset=offset, chunk_size=1000)
            while True:
                try:
                    chunk = await asyncio.wait_for(stream.__anext__(), wait)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    starved = True  # (wait_for's own: the stream is dropped with it)
                    return
                seen += len(chunk)
                if seen > MAX_LISTED:
                    return  # (the stream is dropped: no page more is asked for)
                names.update(o["path"][len(p) + 1:].split("/", 1)[0] for o in chunk)

        try:
            asyncio.run(pages())
        except (FileNotFoundError, self._x.NotFoundError):
            return iter(())
        except Exception as e:
            raise _oserror(e) from None
        if starved:
            raise OSError(errno.ETIMEDOUT, f"listing {p}/: no key in {wait:.0f} s (a broken or"
                          " hostile listing?)")
        if seen > MAX_LISTED:
            raise OSError(errno.EOVERFLOW, f"listing {p}/: more than {MAX_LISTED} keys (a"
                          " broken or hostile listing?)")
        return iter(sorted(n for n in names if n))

    def delete(self, key: str) -> None:
        _check_key(key)
        try:
            self._ob.delete(self.store, key)
        except (FileNotFoundError, self._x.NotFoundError):
            pass
        except Exception as e:
            raise _oserror(e) from None

    def staging_entries(self) -> Iterator[tuple[str, float]]:
        return iter(())  # staging is node-local here: nothing shared to collect

    def close(self) -> None:
        with contextlib.suppress(Exception):
            del self.store
