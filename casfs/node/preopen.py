"""A namespace's first reads of an object store root, begun before its mount exists.

``casfs run`` knows the namespaces its job will lease when it starts the node's
mount process (casfs.node.host), which then spends ~0.15 s importing what
serving needs before it can take the lease. ``begin`` does meanwhile, in a
thread, what the namespace's attach does first, each a round trip across a
real network: the root's marker beside its generations' LIST, a HEAD past
the newest, and (a node with no index yet: nothing of it is local) the
newest record and its manifest.

The namespace's mount takes the result once (``take``, casfs.node.rootlink):
the opened root with its connection, its GenerationStore with what it read,
and the newest generation (``Opened.newest``), which the lower feed serves
instead of finding it again. Counts of those reads are the mount's
(``counters``). A result not taken within FRESH seconds of its end is not
used; a mount that takes none opens the root as before. POSIX roots are not
pre-opened: nothing to overlap, and a dead NFS mount is call_bounded's business.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

# Imported here, not in the thread: in the host's first moments a thread's imports
# share the interpreter with the main thread's, and took 3x as long.
from casfs.errors import CasfsError
from casfs.index.lmdbenv import index_path
from casfs.store.generations import GenerationStore
from casfs.store.root import SharedRoot
from casfs.tenants import TenantPolicy
from casfs.util.counters import Counters

if TYPE_CHECKING:
    from casfs.node.config import MountConfig
    from casfs.store.record import Record
    from casfs.store.snapshot import Snapshot

log = logging.getLogger(__name__)

# The longest opening the root may hold a mount's start (or a refresh): the marker is
# one small read, and a job must not wait a whole fetch timeout on a hung server (I4).
ROOT_OPEN_TIMEOUT = 3.0
FRESH = 5.0  # seconds a finished pre-open stays usable

Key = tuple[str, str, str]  # (root, namespace on the root, tenant)
# (newest seq or None, (its record, snapshot) or None when not read)
Newest = tuple["int | None", "tuple[Record | None, Snapshot] | None"]


@dataclass
class Opened:
    key: Key
    counters: Counters = field(default_factory=Counters)
    done: threading.Event = field(default_factory=threading.Event)
    ended: float = 0.0  # monotonic, once done
    root: SharedRoot | None = None
    gens: GenerationStore | None = None
    newest: Newest | None = None
    error: BaseException | None = None

    def result(self, timeout: float) -> SharedRoot:
        """The opened root; its opening's error, or TimeoutError after ``timeout``."""
        if not self.done.wait(timeout):
            # worded as the bounded open's (rootlink): one line for an operator to grep
            root, ns, tenant = self.key
            raise TimeoutError(f"root-open:{root}:{tenant}:{ns}: no answer within {timeout:g} s")
        if self.error is not None:
            raise self.error
        assert self.root is not None
        return self.root


_opened: dict[Key, Opened] = {}
_lock = threading.Lock()


def _key(cfg: MountConfig) -> Key:
    return (str(cfg.root), cfg.namespace, cfg.tenant or "")


def begin(cfg: MountConfig) -> bool:
    """Start opening ``cfg``'s root and reading its namespace's newest generation in a
    thread (an object store root only); whether it was started."""
    if isinstance(cfg.root, Path):
        return False
    o = Opened(_key(cfg))
    with _lock:
        if o.key in _opened:
            return False
        _opened[o.key] = o
    # A node with an index may hold this generation already: its manifest (MBs for a
    # large namespace) is read only if the feed needs it. (Looked at now: the host
    # creates the index as it starts.)
    whole = not index_path(cfg.state_dir).exists()
    threading.Thread(target=_run, args=(o, cfg, whole), name=f"casfs-preopen-{cfg.namespace}",
                     daemon=True).start()
    return True


def _run(o: Opened, cfg: MountConfig, whole: bool) -> None:
    ns = cfg.namespace
    try:
        root = SharedRoot.open(
            cfg.root, create=True, counters=o.counters,
            tenants=TenantPolicy.from_dict(cfg.tenants) if cfg.tenant else None,
            timeout=cfg.fetch_timeout, open_timeout=min(cfg.fetch_timeout, ROOT_OPEN_TIMEOUT),
            beside=lambda b: GenerationStore.list_names(b, ns))
        gens = root.generations()
        if isinstance(root.beside, list):
            gens.seed_listing(ns, root.beside)
        o.root, o.gens = root, gens
        try:
            # The listed newest's record read beside the HEAD past it (a second
            # connection, warm from the marker's read): a round trip of a fresh start.
            guess = gens.read_listed_newest(ns, cfg.fetch_timeout) if whole else None
            newest = gens.latest_seq(ns)
            got = None
            if newest is not None and whole:
                listed = guess() if guess else None  # (newest_valid takes it if newest)
                if cfg.prefetch:  # the profile is the prefetch's
                    read_profile_ahead(root, gens, ns, newest, listed)
                _, rec, snap = gens.newest_valid(ns, newest=newest)
                got = (rec, snap)
            o.newest = (newest, got)
        except (CasfsError, OSError) as e:  # the feed reads again, and says what failed
            log.debug("%s: reading the newest generation ahead: %s", cfg.name, e)
    except BaseException as e:  # the mount's connect raises it as its own
        o.error = e
    finally:
        o.ended = time.monotonic()
        o.done.set()
        # Never taken (the lease failed, or asked for other namespaces): not kept, with
        # its client and what it parsed, for the life of the process.
        t = threading.Timer(FRESH + 1.0, _drop, args=(o,))
        t.daemon = True
        t.start()


def read_profile_ahead(root: SharedRoot, gens: GenerationStore, ns: str, seq: int,
                        rec: Record | None) -> None:
    """Record ``seq`` now (``rec`` if that is it; newest_valid takes it), and its access
    profile read beside its manifest parts: the prefetch's plan, which a job's first
    opens wait for, reads it next (a round trip after the parts). A damaged record is
    newest_valid's to skip."""
    if rec is None or rec.seq != seq:
        try:
            rec = gens.record(ns, seq)
        except (CasfsError, OSError):
            return
    digest = rec.options.get("profile")
    if isinstance(digest, str):
        root.objects.read_ahead(digest)


def _drop(o: Opened) -> None:
    with _lock:
        if _opened.get(o.key) is o:
            del _opened[o.key]


def counters(cfg: MountConfig) -> Counters:
    """The counters a mount of ``cfg`` keeps: its pre-open's, which count what it read."""
    with _lock:
        o = _opened.get(_key(cfg))
    return o.counters if o is not None else Counters()


def take(cfg: MountConfig) -> Opened | None:
    """The pre-open of ``cfg``'s namespace, once; None if there is none, or it ended more
    than FRESH seconds ago."""
    with _lock:
        o = _opened.pop(_key(cfg), None)
    if o is None or (o.done.is_set() and time.monotonic() - o.ended > FRESH):
        return None
    return o
