"""A mount's link to the shared root: the handle, its failures, and the object source.

The root may be missing, slow or hostile (docs/architecture.md, failure
policy): ``RootLink.open`` is bounded, a failure is remembered for
``ROOT_RETRY_AFTER`` seconds (so a release's promotion and publication do not
each wait a fetch timeout on a stalled root) and the mount serves local state
meanwhile. ``RootSource`` is what the local object cache fetches through: in
this process, or through the fetch worker process, always following the
current handle.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from casfs.errors import CasfsError, CorruptObjectError, ObjectMissingError
from casfs.index.node_index import NodeIndex
from casfs.node import fetchproc, preopen
from casfs.node.config import HostConfig, MountConfig
from casfs.node.preopen import ROOT_OPEN_TIMEOUT
from casfs.store.generations import GenerationStore
from casfs.store.root import SharedRoot
from casfs.tenants import TenantPolicy
from casfs.util.bounded import call_bounded
from casfs.util.counters import Counters

log = logging.getLogger(__name__)

ROOT_RETRY_AFTER = 5.0  # seconds before a root that failed to open is tried again


class RootLink:
    """The current SharedRoot handle of one namespace's mount (None while unavailable)."""

    def __init__(self, cfg: MountConfig, policy: TenantPolicy | None, index: NodeIndex,
                 counters: Counters) -> None:
        self.cfg = cfg
        self.policy = policy
        self.index = index
        self.counters = counters
        self.root: SharedRoot | None = None
        self.error: str | None = None
        self._failed_at = -math.inf  # monotonic end of the last failed open
        self._gens: GenerationStore | None = None
        self._newest: preopen.Newest | None = None  # read ahead by a pre-open: take_newest
        # How a worker process opens the same root (sent over a socket, never on argv).
        self.spec: dict[str, Any] = {"root": str(cfg.root), "tenant": cfg.tenant,
                                     "tenants": cfg.tenants, "timeout": cfg.fetch_timeout}

    def connect(self, *, last_chance: bool = False) -> None:
        """Open the root (bounded); on failure log, count, and serve local state.

        ``last_chance``: a release's final publication, tried once more even within
        ROOT_RETRY_AFTER of a failure (a slow first open, e.g. creating an S3 root on
        a loaded node, had left a short job's files unpublished)."""
        # A root that just failed to open (after up to fetch_timeout) is not tried again
        # at once: a release's promotion and publication each tried, so a stalled root
        # held `casfs run` twice fetch_timeout after its job had ended.
        if not last_chance and time.monotonic() - self._failed_at < ROOT_RETRY_AFTER:
            return
        cfg = self.cfg
        bound = min(cfg.fetch_timeout, ROOT_OPEN_TIMEOUT)
        ns = cfg.namespace
        try:
            pre = preopen.take(cfg)  # begun by the host before it could attach us
            if pre is not None:
                self.root = pre.result(bound + 1.0)
                self._gens, self._newest = pre.gens, pre.newest
                self.counters.inc("root_preopened")
            else:
                # In a thread: a POSIX root on a dead hard NFS mount blocks in the kernel
                # for good, and a job's start must not wait for it (I4).
                self.root = call_bounded(
                    # per namespace: namespaces attached at once must not refuse each other
                    f"root-open:{cfg.root}:{cfg.tenant}:{cfg.namespace}",
                    lambda: SharedRoot.open(cfg.root, create=True, counters=self.counters,
                                            tenants=self.policy, timeout=cfg.fetch_timeout,
                                            open_timeout=bound,
                                            # the lower feed's first LIST, beside the marker
                                            beside=lambda b: GenerationStore.list_names(b, ns)),
                    bound + 1.0)
                if isinstance(self.root.beside, list):
                    self.gens().seed_listing(ns, self.root.beside)
            self.error = None
            if not self.root.is_local:  # the fetch worker's open need not GET it again
                self.spec["marker"] = self.root.marker
                self._prepare_worker()
            # A packed object fetched before any manifest was read this run (a
            # restarted mount serving its indexed generation): learn where packs
            # hold it from the namespace's newest generation, once.
            self.root.objects.locator = self._load_pack_locations
            root_id, index = self.root.root_id, self.index
            # The packs this node's promotion wrote (named in the index before any record).
            self.root.objects.lookup = lambda digest: index.pack_location(root_id, digest)
        except (CasfsError, OSError) as e:
            self.root = None
            self.error = str(e)
            self._failed_at = time.monotonic()
            self.counters.inc("root_unavailable")
            log.error("%s: shared root unavailable, serving local state only: %s",
                      cfg.name, e)

    def _prepare_worker(self) -> None:
        """Have the fetch worker open this object store root now, in the background,
        while the mount builds and plans (its client's setup, no request: the marker
        goes with the spec); a fresh node's first whole-namespace fetch waited for it.
        A failure is only logged: the first fill opens it again."""
        if not fetchproc.enabled():
            return
        msg = {"op": "prepare", "root": self.spec, "ns": self.cfg.namespace}

        def run() -> None:
            try:
                fetch_worker(self.cfg).call(msg, lambda: None, self.counters)
            except (CasfsError, OSError) as e:
                log.debug("%s: preparing the fetch worker: %s", self.cfg.name, e)

        threading.Thread(target=run, name=f"casfs-fetch-prepare-{self.cfg.namespace}",
                         daemon=True).start()

    def ensure(self) -> SharedRoot | None:
        """The handle, opened again first if it is not there (and may be retried)."""
        if self.root is None:
            self.connect()
        return self.root

    def take_newest(self) -> preopen.Newest | None:
        """The namespace's newest generation as a pre-open read it, once (else None)."""
        got, self._newest = self._newest, None
        return got

    def gens(self) -> GenerationStore:
        """One GenerationStore per root handle: it caches parsed manifests."""
        assert self.root is not None
        if self._gens is None or self._gens.root is not self.root:
            self._gens = self.root.generations()
        return self._gens

    def _load_pack_locations(self) -> None:
        try:
            if self.root is not None:
                self.gens().newest_snapshot(self.cfg.namespace)  # registers pack locations
        except (CasfsError, OSError) as e:
            log.warning("%s: cannot read pack locations: %s", self.cfg.name, e)


class _NoSource:
    """Object source while the shared root is unreachable: every fetch is a miss."""

    def get_into(self, digest: str, expected_size: int | None, out: Any) -> int:
        raise ObjectMissingError("the shared root is unavailable")


def _ident(raw: object) -> tuple[int, int, int] | None:
    """A cache file's identity as the fetch worker reports it (a list of 3 ints)."""
    if isinstance(raw, list) and len(raw) == 3 and all(type(v) is int for v in raw):
        return (raw[0], raw[1], raw[2])
    return None


def fetch_worker(cfg: MountConfig | HostConfig) -> fetchproc.FetchWorker:
    """The fetch worker of ``cfg``'s node state dir, started now if it is not yet: a
    mount starts it before its first round trips to the root, so that its imports
    overlap them (at 20 ms RTT a fresh node's first fetch waited ~0.6 s for them)."""
    return fetchproc.shared(cfg.state_dir / "objects", hang_after=max(2 * cfg.fetch_timeout, 5.0))


class RootSource:
    """The object source (and cache filler) that follows the link's current handle.

    ``ondemand`` marks a fetch a job waits for (prefetch yields to those).
    """

    def __init__(self, link: RootLink, counters: Counters,
                 ondemand: Callable[[], AbstractContextManager[None]]) -> None:
        self._link = link
        self._counters = counters
        self._ondemand = ondemand

    def get_into(self, digest: str, expected_size: int | None, out: Any) -> int:
        root = self._link.root
        if root is None:
            return _NoSource().get_into(digest, expected_size, out)
        self._counters.inc("objects_fetched")
        with self._ondemand():
            n = root.objects.get_into(digest, expected_size, out)
        self._counters.inc("bytes_fetched", n)
        return n

    def worker(self) -> fetchproc.FetchWorker:
        """This process's fetch worker (started at once, so a first fetch does not wait)."""
        return fetch_worker(self._link.cfg)

    def pack_of(self, digest: str) -> tuple[str, int, int] | None:
        """Where a pack holds ``digest``, if this process knows: from a manifest it read,
        or from the index (packs this node's promotion wrote, maybe unpublished yet)."""
        objects = self._link.root.objects if self._link.root is not None else None
        if objects is None:
            return None
        loc = objects.locations.get(digest)
        if loc is None and objects.lookup is not None:
            loc = objects.lookup(digest)
        return loc

    def fill_many(self, items: list[tuple[str, int]], progressed: Callable[[], None],
                  done: Callable[[str, tuple[int, int, int] | None, BaseException | None], None],
                  packs: list[str] | None = None,
                  adopt: Callable[[str, int, tuple[int, int, int]], bool] | None = None
                  ) -> None:
        """casfs.index.objcache.CacheFiller: several objects in one request (read-ahead);
        ``done`` is called once per object answered (identity or error), ``adopt`` for
        each other member of ``packs`` the worker added (digest, size, identity)."""
        counters, spec = self._counters, self._spec()
        sizes = dict(items)

        def one(msg: dict[str, Any]) -> None:
            digest, ident = msg.get("one"), _ident(msg.get("ident"))
            if isinstance(digest, str) and digest not in sizes:  # a pack member it added
                size = msg.get("size")
                # Counted only if adopted: a member a job's open is fetching meanwhile
                # (the missed file of a one-member pack) is that fetch's, not a second.
                if (ident is not None and adopt is not None and type(size) is int
                        and size >= 0 and adopt(digest, size, ident)):
                    counters.inc("objects_fetched")
                    counters.inc("bytes_fetched", size)
                return
            if not isinstance(digest, str):
                return
            if ident is not None:
                counters.inc("bytes_fetched", sizes[digest])
                done(digest, ident, None)
            else:
                kind = msg.get("kind")
                cls = (CorruptObjectError if kind == "corrupt" else
                       ObjectMissingError if kind == "missing" else CasfsError)
                done(digest, None, cls(str(msg.get("error", "fetch failed"))))

        counters.inc("objects_fetched", len(items))
        try:
            with self._ondemand():
                self.worker().fill_many([(d, n, self.pack_of(d)) for d, n in items], spec,
                                        self._link.cfg.namespace, progressed, counters, one,
                                        packs)
        except fetchproc.FetchWorkerError:
            counters.inc("fetch_worker_lost")
            raise

    def fill_packs(self, items: list[tuple[str, int]], progressed: Callable[[], None],
                   done: Callable[[list[tuple[str, tuple[int, int, int]]],
                                   list[tuple[str, BaseException]]], None],
                   stop: threading.Event | None = None) -> None:
        """casfs.index.objcache: a whole-namespace prefetch's wave in one request (the
        worker reads each pack once, all at once, and installs the objects in this
        order); ``done`` gets each batch of answers (identities, errors). ``stop`` set:
        the worker is told to install no more of it, and answers at once."""
        counters, spec = self._counters, self._spec()
        sizes = dict(items)

        def batch(msg: dict[str, Any]) -> None:
            ok: list[tuple[str, tuple[int, int, int]]] = []
            for row in msg.get("many") or []:
                if (isinstance(row, list) and len(row) == 4 and isinstance(row[0], str)
                        and row[0] in sizes and (ident := _ident(row[1:])) is not None):
                    ok.append((row[0], ident))
            bad: list[tuple[str, BaseException]] = []
            for row in msg.get("failed") or []:
                if isinstance(row, list) and len(row) == 3 and isinstance(row[0], str):
                    cls = (CorruptObjectError if row[1] == "corrupt" else
                           ObjectMissingError if row[1] == "missing" else CasfsError)
                    bad.append((row[0], cls(str(row[2]))))
            if ok:
                counters.inc("objects_fetched", len(ok))
                counters.inc("bytes_fetched", sum(sizes[d] for d, _ in ok))
            done(ok, bad)

        try:
            self.worker().call({"op": "fill_packs", "root": spec, "ns": self._link.cfg.namespace,
                                "objects": [[d, n, self.pack_of(d)] for d, n in items]},
                               progressed, counters, batch, cancel=stop)
        except fetchproc.FetchWorkerError:
            counters.inc("fetch_worker_lost")
            raise

    def fill_cache(self, digest: str, size: int, progressed: Callable[[], None]
                   ) -> tuple[int, int, int] | None:
        """casfs.index.objcache.CacheFiller: the fetch worker process fills the cache."""
        counters, spec = self._counters, self._spec()
        worker = self.worker()
        counters.inc("objects_fetched")
        try:
            with self._ondemand():
                reply = worker.fill(digest, size, spec, self._link.cfg.namespace,
                                    self.pack_of(digest), progressed, counters)
        except fetchproc.FetchWorkerError:
            counters.inc("fetch_worker_lost")
            raise
        counters.inc("bytes_fetched", int(reply.get("n", 0)))
        return _ident(reply.get("ident"))

    def _spec(self) -> dict[str, Any]:
        if self._link.root is None:
            raise ObjectMissingError("the shared root is unavailable")
        return self._link.spec
