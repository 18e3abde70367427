"""Misses that explain themselves: this job's keys against the namespaces in the root.

``casfs explain [--family F]`` lists, per family, whether this job's namespace
has generations and, if not (or anyway), the nearest namespaces of the same
family and which ingredients differ (generation records carry the
fingerprint they were published with). ``casfs run`` uses ``related`` for its
one-line hint when it restored nothing, and ``run_report`` for ``--report``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from casfs import families
from casfs.cli.output import emit_json
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


def related(gens: Any, fp: Fingerprint,
            tenant: str | None = None) -> tuple[Related | None, list[Related]]:
    """(this job's namespace if it has generations, the nearest others of its family).

    ``tenant``: only that tenant's namespaces (and legacy ones without a tenant).
    """
    from casfs.tenants import split_store_namespace

    mine: Related | None = None
    others: list[Related] = []
    for ns in gens.namespaces():
        owner, bare = split_store_namespace(ns)
        if bare.rsplit("-", 1)[0] != fp.family or (
                tenant is not None and owner not in (None, tenant)):
            continue
        try:
            rec = gens.latest(ns)
        except CasfsError:
            continue
        if rec is None:
            continue
        ingredients = {k: v for k, v in (rec.fingerprint or {}).items()
                       if k in families.get(fp.family).ingredients}
        r = Related(ns, rec.seq, rec.entries, differences(fp.ingredients, ingredients),
                    known=bool(ingredients))
        if bare == fp.namespace:
            mine = r
        else:
            others.append(r)
    others.sort(key=lambda r: (not r.known, len(r.differs), -(r.seq or 0)))
    return mine, others[:NEAREST]


def hint(gens: Any, fp: Fingerprint, tenant: str | None = None) -> str | None:
    """One line for ``casfs run`` when nothing was restored, or None if nothing is related."""
    _, others = related(gens, fp, tenant)
    if not others:
        return None
    return (f"{fp.family}: nothing restored: {fp.namespace} had no generation;"
            f" nearest: {others[0].describe()} (casfs explain)")


def cmd_explain(args: argparse.Namespace) -> int:
    from casfs.cli.store_cmds import open_root
    from casfs.fingerprint import fingerprint, job_env

    names = [families.check(f.strip()) for f in args.family.split(",") if f.strip()]
    job = job_env(python=args.python)
    gens = open_root().generations()
    out = []
    for name in names:
        fp = fingerprint(name, job)
        mine, others = related(gens, fp)
        out.append({"family": name, "namespace": fp.namespace,
                    "published": mine.as_dict() if mine else None,
                    "nearest": [r.as_dict() for r in others]})
        if args.json:
            continue
        if mine is not None:
            print(f"{name}: {fp.namespace} has generation {mine.seq} ({mine.entries} files)")
        else:
            print(f"{name}: {fp.namespace} has no generation in this root")
        for r in others:
            print(f"  nearest: {r.describe()}")
        if mine is None and not others:
            print(f"  no namespace of family {name} in this root")
    if args.json:
        emit_json({"interpreter": job.interpreter, "families": out})
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("explain", help="why a job restores nothing: its namespaces against"
                                       " the root's (which ingredients differ)")
    p.add_argument("--family", default=",".join(families.default_run()),
                   help=f"comma list of {', '.join(families.names())}")
    p.add_argument("--python", metavar="PATH", help="the job's interpreter")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_explain)
