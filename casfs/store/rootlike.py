"""``RootLike``: the part of a shared root that GenerationStore uses.

casfs.store.root's SharedRoot is one (``SharedRoot.generations()`` makes the
GenerationStore of a root); typing GenerationStore against this protocol
instead of SharedRoot keeps casfs.store.generations below casfs.store.root.

Layering: above casfs.store.backend, casfs.store.objects and
casfs.store.tenancy; below casfs.store.generations and casfs.store.root.
"""

from __future__ import annotations

from typing import Protocol

from casfs.store.backend import Backend
from casfs.store.objects import ObjectStore
from casfs.store.tenancy import RecordTrust


class RootLike(Protocol):
    """A shared root as GenerationStore sees it: its storage, objects and record trust,
    and its identity (callers holding a GenerationStore read ``gens.root.root_id``)."""

    @property
    def root_id(self) -> str: ...

    @property
    def backend(self) -> Backend: ...

    @property
    def objects(self) -> ObjectStore: ...

    @property
    def trust(self) -> RecordTrust: ...
