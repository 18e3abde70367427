"""The shared root: its marker file, layout, and the handles onto its parts.

    <root>/casfs.json                     {"format": "casfs", "version": "1.0", ...}
    <root>/objects/ab/<62 hex>            objects (casfs.store.objects)
    <root>/namespaces/<ns>/generations/<seq, 12 digits>   records (casfs.store.generations)
    <root>/namespaces/<ns>/pins/<name>    pins
    <root>/tmp/                           staging; old files here are garbage

A root whose casfs.json has an unknown major version is refused: an older
casfs must not misread, or gc away, what a newer one wrote.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from casfs import __version__
from casfs.errors import StoreFormatError
from casfs.store.backend import LocalBackend
from casfs.store.objects import ObjectStore
from casfs.util import atomic
from casfs.util.counters import Counters

if TYPE_CHECKING:
    from casfs.store.generations import GenerationStore
    from casfs.store.tenancy import RecordTrust
    from casfs.tenants import TenantPolicy

FORMAT_MAJOR = 1
FORMAT_VERSION = f"{FORMAT_MAJOR}.0"
MARKER = "casfs.json"


class SharedRoot:
    """An opened shared root."""

    def __init__(self, path: Path, counters: Counters | None = None, root_id: str = "",
                 tenants: TenantPolicy | None = None) -> None:
        from casfs.store.tenancy import OpenTrust, TenantTrust

        self.path = path
        # Identifies this root (not its path): a node index remembers which root
        # its lower entries came from, and starts over if pointed at another.
        self.root_id = root_id or str(path)
        self.backend = LocalBackend(path)
        self.counters = counters or Counters()
        self.objects = ObjectStore(self.backend, self.counters)
        # Who may have written each namespace's records (casfs.store.tenancy); store
        # tools (gc, verify, ls) open the root without a policy and see everything.
        self.trust: RecordTrust = (TenantTrust(tenants, path, self.counters)
                                   if tenants is not None else OpenTrust())

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, create: bool = False,
             counters: Counters | None = None,
             tenants: TenantPolicy | None = None) -> SharedRoot:
        """Open the root at ``path``; with ``create``, initialise it if it does not exist yet."""
        p = Path(path).expanduser().absolute()
        marker = p / MARKER
        if not marker.exists():
            if not create:
                if p.exists() and any(p.iterdir()):
                    raise StoreFormatError(f"{p} is not a casfs shared root (no {MARKER})")
                raise StoreFormatError(f"no casfs shared root at {p} (run `casfs init`)")
            init_root(p)
        doc = check_marker(marker)
        root_id = str(doc.get("id") or f"{doc.get('host', '')}@{doc.get('created', '')}")
        return cls(p, counters, root_id, tenants)

    def generations(self) -> GenerationStore:
        from casfs.store.generations import GenerationStore

        return GenerationStore(self)


def check_marker(marker: Path) -> dict[str, object]:
    try:
        doc = json.loads(marker.read_bytes())
        version = str(doc["version"])
        major = int(version.split(".")[0])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise StoreFormatError(f"{marker} is unreadable or damaged: {e}") from None
    if doc.get("format") != "casfs":
        raise StoreFormatError(f"{marker} does not describe a casfs root")
    if major != FORMAT_MAJOR:
        raise StoreFormatError(
            f"{marker.parent} has format version {version}; this casfs reads {FORMAT_MAJOR}.x"
        )
    return dict(doc)


def open_to_users(path: Path) -> None:
    """Let every user of the node publish here directly (``casfs init --multi-user``).

    ``namespaces``, ``tmp`` and ``objects`` with its 256 fan-out directories
    become 1777, like /tmp: anyone may add, only an entry's owner may remove or
    rename it. Each tenant's namespace directories are its own (0700/2770,
    casfs.store.tenancy), so sharing these parents lets users add objects,
    which are verified by content, but never write into each other's records.
    Not needed where only casfsd (root) writes the root.
    """
    for sub in ("namespaces", "tmp", "objects"):
        (path / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(path / sub, 0o1777)
    for i in range(256):
        d = path / "objects" / f"{i:02x}"
        d.mkdir(exist_ok=True)
        os.chmod(d, 0o1777)


def init_root(path: Path) -> bool:
    """Create the layout and marker; idempotent and safe against concurrent inits."""
    for sub in ("objects", "namespaces", "tmp"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    doc = {
        "format": "casfs",
        "version": FORMAT_VERSION,
        "created_by": f"casfs {__version__}",
        "created": time.time(),
        "host": socket.gethostname(),
        "id": uuid.uuid4().hex,
    }
    data = json.dumps(doc, indent=1).encode() + b"\n"
    return atomic.create_exclusive(path / MARKER, data, path / "tmp")
