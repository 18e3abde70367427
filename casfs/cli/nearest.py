"""The namespaces of a job's family in the root, nearest first: which ingredients differ.

Generation records carry the fingerprint they were published with; ``related``
compares a job's against the newest generation of each namespace of its family.
Used by ``casfs explain``, ``casfs run``'s hint and its miss causes
(casfs.cli.misscause).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from casfs import families
from casfs.errors import CasfsError
from casfs.fingerprint import Fingerprint, differences

NEAREST = 3
READS = 8  # namespaces' newest records read at once (each a LIST, a HEAD and a GET)


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

    if latest is None:
        latest = newest_records(gens, {fp.family}, tenant)
    mine: Related | None = None
    others: list[Related] = []
    for ns in sorted(latest):
        if not _ours(ns, {fp.family}, tenant) or (rec := latest[ns]) is None:
            continue
        ingredients = {k: v for k, v in (rec.fingerprint or {}).items()
                       if k in families.get(fp.family).ingredients}
        r = Related(ns, rec.seq, rec.entries, differences(fp.ingredients, ingredients),
                    known=bool(ingredients), record=rec)
        if ns == exclude or (exclude is None and split_store_namespace(ns)[1] == fp.namespace):
            mine = r
        else:
            others.append(r)
    others.sort(key=lambda r: (not r.known, len(r.differs), -(r.seq or 0)))
    return mine, others[:limit]


def _ours(ns: str, fams: set[str], tenant: str | None) -> bool:
    from casfs.tenants import split_store_namespace

    owner, bare = split_store_namespace(ns)
    return bare.rsplit("-", 1)[0] in fams and (tenant is None or owner in (None, tenant))


def newest_records(gens: Any, fams: set[str], tenant: str | None = None
                   ) -> dict[str, Any]:
    """The newest record of each namespace of ``fams`` (``tenant``'s and legacy ones; None
    where it has none or cannot be read), from one LIST of the root's namespaces.

    Read ``READS`` at a time: ``casfs run`` asks after its job (its summary's hints and
    miss causes), and one after the other a root of tens of namespaces cost a second
    per 15 of them at 20 ms RTT."""
    names = [ns for ns in gens.namespaces() if _ours(ns, fams, tenant)]

    def one(ns: str) -> Any:
        try:
            return gens.latest(ns)
        except (CasfsError, OSError):  # damaged, gone, or not ours to read (0700): left out
            return None

    if len(names) < 2:
        return {ns: one(ns) for ns in names}
    with ThreadPoolExecutor(min(READS, len(names)), thread_name_prefix="casfs-newest") as pool:
        return dict(zip(names, pool.map(one, names), strict=True))
