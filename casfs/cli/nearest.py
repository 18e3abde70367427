"""The namespaces of a job's family in the root, nearest first: which ingredients differ.

Generation records carry the fingerprint they were published with; ``related``
compares a job's against the newest generation of each namespace of its family.
Used by ``casfs explain``, ``casfs run``'s hint and its miss causes
(casfs.cli.misscause).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from casfs import families
from casfs.errors import CasfsError
from casfs.fingerprint import Fingerprint, differences

NEAREST = 3


@dataclass
class Related:
    namespace: str
    seq: int | None
    entries: int
    differs: list[tuple[str, Any, Any]] = field(default_factory=list)
    known: bool = True  # False: its records carry no ingredients (explicit namespace)
    record: Any = field(default=None, repr=False, compare=False)  # its newest generation

    def as_dict(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "seq": self.seq, "entries": self.entries,
                "ingredients_known": self.known,
                "differs": [{"ingredient": k, "here": a, "there": b}
                            for k, a, b in self.differs]}

    def describe(self) -> str:
        if not self.known:
            return f"{self.namespace} (no ingredients recorded)"
        what = ", ".join(f"{k} {a} here vs {b}" for k, a, b in self.differs) or "same ingredients"
        return f"{self.namespace} ({self.entries} files): {what}"


def related(gens: Any, fp: Fingerprint, tenant: str | None = None,
            limit: int = NEAREST, *, latest: dict[str, Any] | None = None,
            exclude: str | None = None) -> tuple[Related | None, list[Related]]:
    """(this job's namespace if it has generations, the nearest ``limit`` others of its
    family, nearest first).

    ``tenant``: only that tenant's namespaces (and legacy ones without a tenant).
    ``latest``: each namespace's newest record, already read (``casfs report``: no
    request per namespace again); ``exclude``: a store namespace taken as this one.
    """
    from casfs.tenants import split_store_namespace

    mine: Related | None = None
    others: list[Related] = []
    for ns in gens.namespaces() if latest is None else sorted(latest):
        owner, bare = split_store_namespace(ns)
        if bare.rsplit("-", 1)[0] != fp.family or (
                tenant is not None and owner not in (None, tenant)):
            continue
        try:
            rec = gens.latest(ns) if latest is None else latest[ns]
        except CasfsError:
            continue
        if rec is None:
            continue
        ingredients = {k: v for k, v in (rec.fingerprint or {}).items()
                       if k in families.get(fp.family).ingredients}
        r = Related(ns, rec.seq, rec.entries, differences(fp.ingredients, ingredients),
                    known=bool(ingredients), record=rec)
        if ns == exclude or (exclude is None and bare == fp.namespace):
            mine = r
        else:
            others.append(r)
    others.sort(key=lambda r: (not r.known, len(r.differs), -(r.seq or 0)))
    return mine, others[:limit]
