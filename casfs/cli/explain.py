"""Misses that explain themselves: this job's keys against the namespaces in the root.

``casfs explain [--family F]`` lists, per family, whether this job's namespace
has generations and, if not (or anyway), the nearest namespaces of the same
family and which ingredients differ (generation records carry the
fingerprint they were published with). ``casfs run`` uses ``related`` for its
one-line hint when it restored nothing.

Then, per entry: the entries this namespace's jobs missed lately (its outcome
records of the last ``--days``, their most-missed entries: casfs.store.outcomes)
and where each exists among the family's other namespaces, with the
ingredients that differ, or that none holds it (casfs.cli.misscause).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from casfs import families
from casfs.cli.nearest import NEAREST, Related, related
from casfs.cli.output import emit_json
from casfs.fingerprint import Fingerprint

__all__ = ["NEAREST", "Related", "cmd_explain", "hint", "register", "related"]


def hint(gens: Any, fp: Fingerprint, tenant: str | None = None,
         latest: dict[str, Any] | None = None) -> str | None:
    """One line for ``casfs run`` when nothing was restored, or None if nothing is related.
    ``latest``: the newest records already read (casfs.cli.nearest.newest_records)."""
    _, others = related(gens, fp, tenant, latest=latest)
    if not others:
        return None
    return (f"{fp.family}: nothing restored: {fp.namespace} had no generation;"
            f" nearest: {others[0].describe()} (casfs explain)")


def cmd_explain(args: argparse.Namespace) -> int:
    from casfs.cli.misscause import causes
    from casfs.cli.store_cmds import open_root
    from casfs.fingerprint import fingerprint, job_env
    from casfs.node.tenant import load_tenants, own_tenant
    from casfs.store import outcomes
    from casfs.util.defaults import default_state_dir

    names = [families.check(f.strip()) for f in args.family.split(",") if f.strip()]
    job = job_env(python=args.python)
    root = open_root()
    gens = root.generations()
    tenant = own_tenant(load_tenants())
    out = []
    for name in names:
        fp = fingerprint(name, job)
        mine, others = related(gens, fp)
        # The misses of this job's namespace lately, by entry (its outcome records).
        recent = outcomes.read(root.backend, tenant.store_namespace(fp.namespace),
                               since=time.time() - args.days * 86400).missed
        mc = causes(gens, fp, [e for e, _ in recent.most_common()], tenant=tenant.id,
                    state_dir=default_state_dir().absolute())
        out.append({"family": name, "namespace": fp.namespace,
                    "published": mine.as_dict() if mine else None,
                    "nearest": [r.as_dict() for r in others],
                    "miss_causes": mc.as_dict() if mc.missed else None})
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
        line = mc.line(whose="the", when=f" of the last {args.days:g} days")
        if line is not None:
            print(f"  misses: {line.partition(': ')[2]}")
            for h in mc.held:
                print(f"    {len(h.entries)} in {h.describe()}: e.g. {', '.join(h.entries[:3])}")
            if mc.nowhere:
                print(f"    {len(mc.nowhere)} in no namespace: e.g. {', '.join(mc.nowhere[:3])}")
    if args.json:
        emit_json({"interpreter": job.interpreter, "families": out})
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("explain", help="why a job restores nothing: its namespaces against"
                                       " the root's (which ingredients differ)")
    p.add_argument("--family", default=",".join(families.default_run()),
                   help=f"comma list of {', '.join(families.names())}")
    p.add_argument("--python", metavar="PATH", help="the job's interpreter")
    p.add_argument("--days", type=float, default=7.0, metavar="N",
                   help="the misses of the namespace's last N days (outcome records) to"
                        " look for in the family's other namespaces (default 7)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_explain)
