"""The shared root: its marker file, layout, and the handles onto its parts.

    <root>/casfs.json                     {"format": "casfs", "version": "1.0", ...}
    <root>/objects/ab/<62 hex>            objects (casfs.store.objects)
    <root>/packs/ab/<62 hex>              packs of small objects (casfs.store.packs)
    <root>/repacked/ab/<62 hex>           forwards of packs gc repacked (casfs.store.packs)
    <root>/namespaces/<ns>/generations/<seq, 12 digits>   records (casfs.store.record)
    <root>/namespaces/<ns>/pins/<name>    pins (casfs.store.generations)
    <root>/namespaces/<ns>/heads/<seq>-<issued>   statements of the newest generation
                                          (casfs.store.freshness)
    <root>/namespaces/<ns>/reads/<time>-<node>-<8 hex>   read records (casfs.store.reads)
    <root>/gc/marks/<created>-<32 hex>    gc marks (casfs.store.marks)
    <root>/probes/<32 hex>/<n>            create-only probes (``probe_create_only``); removed
                                          after each probe
    <root>/probes/create-only             kept: the check before a process's first record
                                          (casfs.store.createonly)
    <root>/tmp/                           staging; old files here are garbage

docs/format.md ("Shared root" and the sections after it) has each of them in full.

A root is a POSIX directory or ``s3://bucket/prefix`` (casfs.util.location):
the same keys under the prefix, through S3Backend; staging is node-local there.
Before creating an S3 root, and in ``casfs doctor``, ``probe_create_only``
checks that the server really refuses the second of two racing creates:
publication is lock-free only because of it.

A root whose casfs.json has an unknown major version is refused: an older
casfs must not misread, or gc away, what a newer one wrote.

Layering: SharedRoot builds the handles onto a root's parts, so this module
is above them all: the backend (casfs.store.backend, casfs.store.s3backend, and
casfs.store.sitecache where the root names a site cache),
the object store, the record trust (casfs.store.tenancy) and GenerationStore
(casfs.store.generations, which sees a root only as the protocol
casfs.store.rootlike.RootLike). Only the tools that work on a whole root
(casfs.store.maintenance, casfs.store.export) and the layers above casfs.store
import it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from casfs import __version__
from casfs.errors import CasfsError, HostileManifestError, StoreFormatError
from casfs.store.backend import Backend, LocalBackend
from casfs.store.generations import GenerationStore
from casfs.store.objects import ObjectStore, read_regular
from casfs.store.s3backend import S3Backend
from casfs.store.sitecache import SiteCachedBackend
from casfs.store.tenancy import OpenTrust, RecordTrust, TenantTrust
from casfs.tenants import TenantPolicy
from casfs.util import atomic, jsonsafe
from casfs.util.counters import Counters
from casfs.util.fsinfo import unmounted_fstab_mount
from casfs.util.location import RootLocation, S3Location, parse_location

log = logging.getLogger(__name__)

FORMAT_MAJOR = 1
FORMAT_VERSION = f"{FORMAT_MAJOR}.0"
MARKER = "casfs.json"
MAX_MARKER_BYTES = 1 << 20
# Seconds an open waits, after the marker, for the read it ran beside it (then the
# caller reads again itself: a slow LIST must not make the root look down).
BESIDE_WAIT = 1.0


class SharedRoot:
    """An opened shared root."""

    def __init__(self, path: RootLocation, counters: Counters | None = None, root_id: str = "",
                 tenants: TenantPolicy | None = None, backend: Backend | None = None) -> None:
        self.location = path
        # Identifies this root (not its path): a node index remembers which root
        # its lower entries came from, and starts over if pointed at another.
        self.root_id = root_id or str(path)
        self.marker: dict[str, object] = {}  # casfs.json as read at open
        # What ``open(beside=...)`` got while the marker was read (None: nothing, or
        # it failed: the caller asks again).
        self.beside: object = None
        self.backend: Backend = backend or LocalBackend(self.path)
        self.counters = counters or Counters()
        self.objects = ObjectStore(self.backend, self.counters)
        # Who may have written each namespace's records (casfs.store.tenancy); store
        # tools (gc, verify, ls) open the root without a policy and see everything.
        # On an object store ownership means nothing: only signatures count there.
        local = path if isinstance(path, Path) else None
        self.trust: RecordTrust = (TenantTrust(tenants, local, self.counters)
                                   if tenants is not None else OpenTrust())

    @property
    def path(self) -> Path:
        """The directory of a POSIX root (an S3 root has none: use ``location``)."""
        if not isinstance(self.location, Path):
            raise CasfsError(f"{self.location} is not a directory")
        return self.location

    @property
    def is_local(self) -> bool:
        return isinstance(self.location, Path)

    @classmethod
    def open(cls, path: str | os.PathLike[str] | RootLocation, *, create: bool = False,
             counters: Counters | None = None, tenants: TenantPolicy | None = None,
             timeout: float = 20.0, open_timeout: float | None = None,
             read_cache: bool = True, marker: dict[str, object] | None = None,
             beside: Callable[[Backend], object] | None = None) -> SharedRoot:
        """Open the root at ``path``; with ``create``, initialise it if it does not exist yet.

        ``timeout`` bounds each request to an object store (a fetch slower than
        that is a miss); ``open_timeout``, if shorter, bounds the opening read of the
        marker (a mount's start must not wait a whole fetch timeout on a hung server).
        ``read_cache`` False ignores an S3 root's ``read_cache`` (tools that check the
        root itself: verify, gc). ``marker``: an object store root's marker as another
        process of this node read it (``SharedRoot.marker``), checked again, not fetched
        again (a node's mount, fetch and promotion processes read it once, not thrice).
        ``beside``: the caller's first read of an object store root, run on its backend
        while the marker is read (a round trip, not two, before a mount serves); its
        result is ``root.beside``, kept only if the marker says the root is casfs's.
        """
        loc = path if isinstance(path, S3Location) else parse_location(path)
        if isinstance(loc, S3Location):
            if not read_cache:
                loc = dataclasses.replace(loc, read_cache="")
            return cls._open_s3(loc, create=create, counters=counters, tenants=tenants,
                                timeout=timeout, open_timeout=open_timeout, marker=marker,
                                beside=beside)
        p = loc
        marker_path = p / MARKER  # a local read: read again (cheap), not trusted from others
        if not marker_path.exists():
            if not create:
                if p.exists() and any(p.iterdir()):
                    raise StoreFormatError(f"{p} is not a casfs shared root (no {MARKER})")
                raise StoreFormatError(f"no casfs shared root at {p} (run `casfs init`)")
            init_root(p)
        doc = check_marker(marker_path)
        root_id = str(doc.get("id") or f"{doc.get('host', '')}@{doc.get('created', '')}")
        root = cls(p, counters, root_id, tenants)
        root.marker = doc
        return root

    @classmethod
    def _open_s3(cls, loc: S3Location, *, create: bool, counters: Counters | None,
                 tenants: TenantPolicy | None, timeout: float,
                 open_timeout: float | None = None,
                 marker: dict[str, object] | None = None,
                 beside: Callable[[Backend], object] | None = None) -> SharedRoot:
        backend = S3Backend(loc, timeout=timeout)
        if marker is not None:  # read by another process of this node: checked again
            doc = parse_marker(json.dumps(marker).encode(), str(loc))
            return cls._with_cache(loc, doc, counters, tenants, backend, timeout)
        # The marker is one small GET: a server that cannot answer it within
        # open_timeout is treated as down now (the caller retries later); a 503 or a
        # reset is retried within that bound: one SlowDown must not make a fresh node
        # serve nothing until its next retry. On the root's own client (the bound is a
        # wait here, not a second client): its connection is then a warm one in the
        # pool the next requests share (two requests can go together without a
        # handshake, the marker's and the LIST's beside it).
        bound = open_timeout if open_timeout is not None and open_timeout < timeout \
            else None
        got = _Beside(beside, backend) if beside is not None else None
        try:
            raw = _read_marker(backend, bound)
        except FileNotFoundError:
            if not create:
                raise StoreFormatError(f"no casfs shared root at {loc} (run `casfs init`)") \
                    from None
            probe_create_only(backend, str(loc))
            backend.create_exclusive(MARKER, _marker_doc())
            with backend.open(MARKER) as f:
                raw = f.read(1 << 16)
        except OSError as e:
            raise StoreFormatError(f"cannot reach the shared root {loc}: {e.strerror or e}") \
                from None
        root = cls._with_cache(loc, parse_marker(raw, str(loc)), counters, tenants, backend,
                               timeout)
        if got is not None:
            root.beside = got.result(BESIDE_WAIT)
        return root

    @classmethod
    def _with_cache(cls, loc: S3Location, doc: dict[str, object], counters: Counters | None,
                    tenants: TenantPolicy | None, backend: S3Backend,
                    timeout: float) -> SharedRoot:
        root_id = str(doc.get("id") or str(loc))
        if not loc.read_cache:
            root = cls(loc, counters, root_id, tenants, backend)
        else:
            # Objects' and packs' GETs through a site cache, unsigned; the marker and
            # everything else signed to the endpoint (casfs.store.sitecache).
            counters = counters or Counters()
            cached = SiteCachedBackend(backend, loc.read_cache, timeout=timeout,
                                       counters=counters)
            root = cls(loc, counters, root_id, tenants, cached)
        root.marker = doc
        return root

    def generations(self) -> GenerationStore:
        return GenerationStore(self)


def _read_marker(backend: Backend, bound: float | None) -> bytes:
    """The marker's bytes; with ``bound``, TimeoutError after that many seconds (the
    read goes on in its thread until the client's own timeout, harmlessly)."""
    def read() -> bytes:
        with backend.open(MARKER) as f:
            return f.read(1 << 16)

    if bound is None:
        return read()
    out: list[bytes] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            out.append(read())
        except BaseException as e:  # raised to the caller below
            err.append(e)

    t = threading.Thread(target=run, name="casfs-open-marker", daemon=True)
    t.start()
    t.join(bound)
    if err:
        raise err[0]
    if not out:
        raise TimeoutError(f"no answer within {bound:g}s")
    return out[0]


class _Beside:
    """``fn(backend)`` in a thread; ``result(timeout)`` waits for it at most that long
    (None if it raised or is still running)."""

    def __init__(self, fn: Callable[[Backend], object], backend: Backend) -> None:
        self.value: object = None

        def run() -> None:
            try:
                self.value = fn(backend)
            except Exception as e:  # the caller asks again, and sees it then
                log.debug("read beside the marker: %s", e)

        self.thread = threading.Thread(target=run, name="casfs-open-beside", daemon=True)
        self.thread.start()

    def result(self, timeout: float) -> object:
        self.thread.join(timeout)
        return None if self.thread.is_alive() else self.value


def check_marker(marker: Path) -> dict[str, object]:
    try:
        # Never blocking, never followed: a FIFO planted as the marker hung every
        # command and every mount start on this root.
        raw = read_regular(marker, MAX_MARKER_BYTES)
    except OSError as e:
        raise StoreFormatError(f"{marker} is unreadable or damaged: {e}") from None
    return parse_marker(raw, str(marker.parent), str(marker))


def parse_marker(raw: bytes, where: str, name: str = "") -> dict[str, object]:
    name = name or f"{where}/{MARKER}"
    try:
        doc = jsonsafe.parse(raw, "marker")
        version = str(doc["version"])
        major = int(version.split(".")[0])
    except (ValueError, KeyError, TypeError, AttributeError, HostileManifestError) as e:
        raise StoreFormatError(f"{name} is unreadable or damaged: {e}") from None
    if doc.get("format") != "casfs":
        raise StoreFormatError(f"{name} does not describe a casfs root")
    if major != FORMAT_MAJOR:
        raise StoreFormatError(
            f"{where} has format version {version}; this casfs reads {FORMAT_MAJOR}.x"
        )
    return dict(doc)


def open_to_users(path: Path) -> None:
    """Let every user of the node publish here directly (``casfs init --multi-user``).

    ``namespaces``, ``tmp``, ``objects`` and ``packs`` with their 256 fan-out
    directories become 1777, like /tmp: anyone may add, only an entry's owner may
    remove or rename it. Each tenant's namespace directories are its own
    (0700/2770, casfs.store.tenancy), so sharing these parents lets users add
    objects and packs, which are verified by content, but never write into
    each other's records.
    Not needed where only casfsd (root) writes the root.
    """
    for sub in ("namespaces", "tmp", "objects", "packs"):
        (path / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(path / sub, 0o1777)
    for fanned in ("objects", "packs"):
        for i in range(256):
            d = path / fanned / f"{i:02x}"
            d.mkdir(exist_ok=True)
            os.chmod(d, 0o1777)


def init_root(path: Path) -> bool:
    """Create the layout and marker; idempotent and safe against concurrent inits.

    Refused (StoreFormatError) under a filesystem ``/etc/fstab`` lists that is not
    mounted: the root would be made on the local disk beneath it.
    """
    if (down := unmounted_fstab_mount(path)) is not None:
        raise StoreFormatError(f"not creating a shared root at {path}: {down} is in the "
                               "fstab but not mounted (is the shared filesystem down?)")
    for sub in ("objects", "namespaces", "tmp"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    return atomic.create_exclusive(path / MARKER, _marker_doc(), path / "tmp")


def _marker_doc() -> bytes:
    doc = {
        "format": "casfs",
        "version": FORMAT_VERSION,
        "created_by": f"casfs {__version__}",
        "created": time.time(),
        "host": socket.gethostname(),
        "id": uuid.uuid4().hex,
    }
    return json.dumps(doc, indent=1).encode() + b"\n"


def probe_create_only(backend: Backend, where: str, writers: int = 8, rounds: int = 3) -> None:
    """Refuse storage whose create-only writes are not atomic (StoreFormatError, one line).

    Writers race on one key from threads: some servers check, then put, so two
    sequential creates would pass while concurrent ones both "win". Exactly one
    winner per round, whose bytes are what a read returns, is required.
    """
    base = f"probes/{uuid.uuid4().hex}"
    try:
        for r in range(rounds):
            key = f"{base}/{r}"
            wins: list[int] = []
            errors: list[BaseException] = []
            barrier = threading.Barrier(writers)

            def create(i: int, key: str = key, wins: list[int] = wins,
                       errors: list[BaseException] = errors,
                       barrier: threading.Barrier = barrier) -> None:
                try:
                    barrier.wait(30)
                    if backend.create_exclusive(key, f"writer {i}".encode()):
                        wins.append(i)
                except BaseException as exc:  # reported below
                    errors.append(exc)

            threads = [threading.Thread(target=create, args=(i,)) for i in range(writers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                e = errors[0]
                raise StoreFormatError(f"{where}: create-only writes (If-None-Match: *) failed:"
                                       f" {getattr(e, 'strerror', None) or e}")
            with backend.open(key) as f:
                stored = f.read()
            if len(wins) != 1 or stored != f"writer {wins[0]}".encode():
                raise StoreFormatError(
                    f"{where}: the server does not honour create-only writes (If-None-Match: *):"
                    f" {len(wins)} of {writers} racing creates of one key succeeded;"
                    " casfs cannot publish safely there"
                )
    finally:
        for r in range(rounds):
            with contextlib.suppress(OSError):
                backend.delete(f"{base}/{r}")

