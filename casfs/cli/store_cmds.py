"""Store commands: init, import, export and the read-only queries over the shared root."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from casfs import families
from casfs.cli.output import emit_json, human_bytes, progress, table
from casfs.errors import CasfsError, NotFoundError, UsageError
from casfs.store import maintenance
from casfs.store.entry import Entry
from casfs.store.export import export_tree
from casfs.store.generations import GenerationStore, Record, Skipped, Snapshot, check_name
from casfs.store.root import SharedRoot
from casfs.util.defaults import default_root, default_state_dir


def open_root(create: bool = False, read_cache: bool = True) -> SharedRoot:
    """The default root; ``read_cache`` False reads an S3 root's objects and packs from
    its endpoint even where the root names a site cache (verify and gc check the root)."""
    return SharedRoot.open(default_root(), create=create, read_cache=read_cache)


def node_id() -> str:
    from casfs.index.node_index import NodeIndex

    with NodeIndex.open(default_state_dir()) as idx:
        return idx.node_id


def parse_ref(ref: str) -> tuple[str, int | None]:
    """'ns' or 'ns@seq' -> (ns, seq or None)."""
    ns, _, seq = ref.partition("@")
    check_name(ns)
    if not seq:
        return ns, None
    if not seq.isdigit():
        raise UsageError(f"bad generation {ref!r}: expected NAMESPACE@SEQ")
    return ns, int(seq)


def readable(gens: GenerationStore, ref: str) -> tuple[Snapshot, list[Skipped]]:
    """``ns@seq`` exactly, or the newest readable generation of ``ns`` (as a mount serves).

    A damaged, newer-format or unresolved newest record is passed over with one
    warning line on stderr naming it (GenerationStore.readable); ``ns@seq``
    naming it fails with its error.
    """
    ns, seq = parse_ref(ref)
    snap, skipped = gens.readable(ns, seq)
    if skipped:
        assert snap.record is not None
        print(f"casfs: warning: {ns}: skipped "
              + ", ".join(s.describe() for s in skipped)
              + f"; showing {ns}@{snap.record.seq}", file=sys.stderr)
    return snap, skipped


def skipped_json(skipped: list[Skipped]) -> list[dict[str, Any]]:
    return [s.to_json() for s in skipped]


def record_json(r: Record) -> dict[str, Any]:
    return {
        "namespace": r.namespace,
        "seq": r.seq,
        "parent": r.parent,
        "entries": r.entries,
        "bytes": r.logical_bytes,
        "created": r.created,
        "node": r.node,
        "casfs_version": r.casfs_version,
        "manifest_parts": len(r.parts),
    }


def entry_json(e: Entry) -> dict[str, Any]:
    return {"path": e.path, "digest": e.digest, "size": e.size, "mode": oct(e.mode),
            "mtime_ns": e.mtime_ns}


# --- commands -------------------------------------------------------------
def cmd_init(args: argparse.Namespace) -> int:
    root = SharedRoot.open(args.location or default_root(), create=True)
    if args.multi_user:
        from casfs.store.root import open_to_users

        open_to_users(root.path)
    print(f"casfs shared root ready at {root.location}"
          + (" (every user may publish: namespaces/, objects/ and tmp/ are 1777)"
             if args.multi_user else ""))
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from casfs.fingerprint import fingerprint
    from casfs.promote.importer import import_tree

    root = open_root(create=True)
    rules = families.rules(args.family, args.exclude or ())
    ns = args.namespace or fingerprint(args.family).namespace
    check_name(ns)
    with progress("import", enabled=not args.json) as bar:
        rep = import_tree(
            root, Path(args.src), ns, rules=rules, node=node_id(),
            progress=bar.advance, on_total=bar.set_total, packs=args.packs,
        )
    pub = rep.publish
    assert pub is not None
    out = {
        "namespace": ns, "seq": pub.seq, "files": rep.files, "bytes": rep.bytes,
        "new_objects": rep.new_objects, "packs": rep.packs, "added": pub.added,
        "already_published": pub.already,
        "conflicts": pub.conflicts, "skipped_scratch": rep.skipped_scratch,
        "skipped": rep.skipped_other,
    }
    if args.json:
        emit_json(out)
    else:
        print(f"{ns}@{pub.seq}: {rep.files} files ({human_bytes(rep.bytes)}), {pub.added} new,"
              f" {pub.already} already published, {pub.conflicts} conflicts,"
              f" {rep.new_objects} new objects, {rep.skipped_scratch} scratch skipped")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    root = open_root()
    ns, _ = parse_ref(args.ref)
    snap, skipped = readable(root.generations(), args.ref)
    rec = snap.record
    assert rec is not None
    from casfs.promote.retention import family_rules

    # Path-bearing files (Triton groups) are written with the destination's paths.
    relocator = families.Relocator(family_rules(ns), str(Path(args.dest).absolute()))
    with progress("export", total=rec.entries, enabled=not args.json) as bar:
        rep = export_tree(root, rec, Path(args.dest), progress=bar.advance,
                          present=relocator.content)
    if args.json:
        emit_json({"namespace": ns, "seq": rec.seq, "files": rep.files, "bytes": rep.bytes,
                   "failed": rep.failed, "skipped_generations": skipped_json(skipped)})
    else:
        print(f"{ns}@{rec.seq} -> {args.dest}: {rep.files} files ({human_bytes(rep.bytes)})")
        for f in rep.failed:
            print(f"failed: {f}", file=sys.stderr)
    return 1 if rep.failed else 0


def cmd_namespaces(args: argparse.Namespace) -> int:
    gens = open_root().generations()
    rows: list[dict[str, Any]] = []
    for ns in gens.namespaces():
        try:
            rec = gens.latest(ns)
            count = len(gens.seqs(ns))
        except CasfsError as e:  # one damaged or newer record must not hide the others
            print(f"casfs: warning: {e}", file=sys.stderr)
            rec, count = None, 0
        except PermissionError:
            continue  # another tenant's namespace (0700): not this user's to list
        rows.append({"namespace": ns, "latest": rec.seq if rec else None,
                     "entries": rec.entries if rec else 0,
                     "bytes": rec.logical_bytes if rec else 0,
                     "generations": count})
    if args.json:
        emit_json(rows)
    else:
        table([[r["namespace"], r["latest"], r["generations"], r["entries"],
                human_bytes(r["bytes"])] for r in rows],
              ["NAMESPACE", "LATEST", "GENERATIONS", "FILES", "SIZE"])
    return 0


def cmd_generations(args: argparse.Namespace) -> int:
    gens = open_root().generations()
    check_name(args.namespace)
    pins = gens.pins(args.namespace)
    rows = []
    for item in gens.records(args.namespace):
        if isinstance(item, Exception):
            print(f"casfs: warning: {item}", file=sys.stderr)
            continue
        d = record_json(item)
        d["pins"] = sorted(n for n, s in pins.items() if s == item.seq)
        rows.append(d)
    if not rows and not gens.seqs(args.namespace):
        raise NotFoundError(f"namespace {args.namespace!r} has no generations")
    if args.json:
        emit_json(rows)
    else:
        import time

        table([[r["seq"], time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created"])),
                r["entries"], human_bytes(r["bytes"]), r["node"], ",".join(r["pins"])]
               for r in rows], ["SEQ", "CREATED", "FILES", "SIZE", "NODE", "PINS"])
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    ns, _ = parse_ref(args.ref)
    snap, _skipped = readable(open_root().generations(), args.ref)
    prefix = args.path.strip("/")
    if prefix and prefix not in snap.dirs and prefix not in snap.entries:
        raise NotFoundError(f"no {prefix!r} in {ns}@{snap.record.seq if snap.record else '-'}")
    rows: dict[str, Any] = {}
    if prefix in snap.entries:
        rows[prefix] = entry_json(snap.entries[prefix])
    else:
        base = prefix + "/" if prefix else ""
        for p, e in snap.entries.items():
            if not p.startswith(base):
                continue
            rest = p[len(base):]
            if args.recursive or "/" not in rest:
                rows[p] = entry_json(e)
            else:
                d = base + rest.split("/", 1)[0]
                rows.setdefault(d + "/", {"path": d + "/", "type": "dir"})
    items = [rows[k] for k in sorted(rows)]
    if args.json:
        emit_json(items)
    else:
        for it in items:
            print(it["path"] if it.get("type") == "dir" else
                  f"{it['mode'][2:]:>4} {it['size']:>12}  {it['path']}")
    return 0


def _entry(args: argparse.Namespace) -> tuple[SharedRoot, Entry]:
    """The root and the entry: its objects know the entry's pack location (casfs.store.packs)."""
    root = open_root()
    snap, _ = readable(root.generations(), args.ref)
    e = snap.entries.get(args.path.strip("/"))
    if e is None:
        raise NotFoundError(f"no file {args.path!r} in {args.ref}")
    return root, e


def cmd_stat(args: argparse.Namespace) -> int:
    root, e = _entry(args)
    d = entry_json(e)
    d["stored_bytes"] = root.objects.stored_size(e.digest)
    d["codec"] = {0: "raw", 1: "zstd"}.get(root.objects.header(e.digest).codec, "?")
    if args.json:
        emit_json(d)
    else:
        for k, v in d.items():
            print(f"{k:>13}: {v}")
    return 0


def cmd_cat(args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    root, e = _entry(args)
    # Verify before writing anything: get_into only knows the hash at the end, and
    # a corrupt object must not put unverified bytes on stdout.
    with tempfile.TemporaryFile() as buf:
        root.objects.get_into(e.digest, e.size, buf)
        buf.seek(0)
        shutil.copyfileobj(buf, sys.stdout.buffer)
    sys.stdout.buffer.flush()
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    gens = open_root().generations()
    snap_a, skipped_a = readable(gens, args.a)
    a = dict(snap_a.entries)  # a snapshot of the store: the next read may advance it in place
    snap_b, skipped_b = readable(gens, args.b)
    b = snap_b.entries
    out: dict[str, Any] = {
        "added": sorted(set(b) - set(a)),
        "removed": sorted(set(a) - set(b)),
        "changed": sorted(p for p in set(a) & set(b) if a[p].digest != b[p].digest),
    }
    if args.json:
        out["skipped_generations"] = skipped_json(skipped_a + skipped_b)
    if args.json:
        emit_json(out)
    else:
        for kind, sign in (("added", "+"), ("removed", "-"), ("changed", "~")):
            for p in out[kind]:
                print(f"{sign} {p}")
    return 0


def cmd_du(args: argparse.Namespace) -> int:
    root = open_root()
    if args.namespace:
        check_name(args.namespace)
    skipped: list[Skipped] = []
    u: dict[str, Any] = dict(maintenance.usage(root, args.namespace, skipped=skipped).to_json())
    if skipped:
        print("casfs: warning: skipped " + ", ".join(s.describe() for s in skipped)
              + "; counted the newest readable generations", file=sys.stderr)
    if args.json:
        u["skipped_generations"] = [{"namespace": s.namespace, **s.to_json()} for s in skipped]
        emit_json(u)
    else:
        print(f"files {u['files']}, logical {human_bytes(u['logical_bytes'])},"
              f" unique {human_bytes(u['unique_bytes'])}, stored {human_bytes(u['stored_bytes'])};"
              f" dedup x{u['dedup_ratio']}, compression x{u['compression_ratio']}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    root = open_root(read_cache=False)
    with progress("verify", enabled=not args.json) as bar:
        rep = maintenance.verify(root, progress=bar.advance)
    if args.json:
        emit_json({"objects": rep.objects, "packs": rep.packs, "generations": rep.generations,
                   "problems": rep.problems, "repaired": rep.repaired, "ok": not rep.problems})
    else:
        for p in rep.repaired:
            print(f"repaired: {p}")
        for p in rep.problems:
            print(f"problem: {p}")
        print(f"verified {rep.objects} objects, {rep.packs} packs, {rep.generations} generations:"
              f" {len(rep.problems)} problems")
    return 1 if rep.problems else 0


def cmd_gc(args: argparse.Namespace) -> int:
    # A negative grace would delete what a writer staged a moment ago; no namespace
    # keeps less than its newest generation.
    if args.grace < 0 or args.grace != args.grace:
        raise UsageError("--grace must be a number of seconds >= 0")
    if args.keep < 1:
        raise UsageError("--keep must be at least 1 (the newest generation is always kept)")
    if not args.keep_outcomes >= 1:
        raise UsageError("--keep-outcomes must be at least 1 day")
    root = open_root(read_cache=False)
    if args.unused_for is not None:
        import time

        from casfs.node.tenant import load_tenants
        from casfs.promote.retention import drop_unused

        if args.unused_for <= 0:
            raise UsageError("--unused-for must be a positive number of days")
        # The generations it writes are sealed like casfsd's (tenant; signature when
        # this user can read the node's key), and untrusted namespaces are skipped.
        tenanted = SharedRoot.open(default_root(), tenants=load_tenants())
        ret = drop_unused(tenanted.generations(), unused_for_s=args.unused_for * 86400,
                          now=time.time(), node=node_id(), dry_run=args.dry_run)
        for ns, paths in sorted(ret.dropped.items()):
            if not args.json:
                verb = "would drop" if args.dry_run else f"dropped (now {ns}@{ret.seqs[ns]})"
                print(f"{ns}: {verb} {len(paths)} files unused for {args.unused_for:g} days")
    with progress("gc", enabled=not args.json) as bar:
        rep = maintenance.gc(root, keep=args.keep, grace=args.grace, dry_run=args.dry_run,
                             progress=bar.advance, keep_outcomes=args.keep_outcomes)
    d = rep.__dict__
    if args.json:
        emit_json(d)
    else:
        verb = "would remove" if args.dry_run else "removed"
        print(f"{verb} {rep.removed_objects} objects ({human_bytes(rep.removed_bytes)}),"
              f" {len(rep.removed_generations)} generations, {rep.removed_tmp} temp files;"
              f" {rep.live_objects} live objects, {rep.young_unreferenced} unreferenced"
              " within the grace period")
    return 0


def cmd_pin(args: argparse.Namespace) -> int:
    ns, seq = parse_ref(args.ref)
    if seq is None:
        raise UsageError("pin needs NAMESPACE@SEQ")
    open_root().generations().pin(ns, seq, args.name)
    print(f"pinned {ns}@{seq} as {args.name}")
    return 0


def cmd_unpin(args: argparse.Namespace) -> int:
    open_root().generations().unpin(args.namespace, args.name)
    print(f"unpinned {args.namespace}/{args.name}")
    return 0


def _load_keys(path: str) -> list[dict[str, Any]]:
    """The keys in a ``casfs key --json`` output (one object or a list); UsageError if not."""
    import json

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        doc = json.loads(text)
    except (OSError, ValueError) as e:
        raise UsageError(f"--compare {path}: not a casfs key --json output ({e})") from None
    keys = doc if isinstance(doc, list) else [doc]
    if not all(isinstance(k, dict) and isinstance(k.get("family"), str)
               and isinstance(k.get("namespace"), str) for k in keys):
        raise UsageError(f"--compare {path}: not a casfs key --json output")
    return keys


def cmd_key(args: argparse.Namespace) -> int:
    from casfs.fingerprint import differences, fingerprint, job_env

    fams = [families.check(f.strip()) for f in args.family.split(",") if f.strip()]
    job = job_env(python=args.python)
    fps = [fingerprint(f, job) for f in fams]
    if args.compare:
        return _compare_keys(fps, args.compare, args.json, differences)
    if args.json:
        out = [{**fp.as_dict(), "interpreter": job.interpreter} for fp in fps]
        emit_json(out[0] if len(out) == 1 else out)
        return 0
    for fp in fps:
        fam = families.get(fp.family)
        print(f"{fp.namespace}")
        print(f"  (from the interpreter {job.interpreter})")
        for k, v in sorted(fp.ingredients.items()):
            print(f"  {k}: {v}")
        print(f"  variables: {', '.join(fam.env_vars)}"
              + "".join(f"; opt-in {k}={v}" for k, v in fam.companions.items()))
        for r in families.rules(fp.family).replaced:
            print(f"  replaced: {r.pattern} ({r.rule.kind})")
    return 0


def _compare_keys(fps: list[Any], files: list[str], as_json: bool, differences: Any) -> int:
    """This node's keys against other nodes' (``casfs key --json`` files): 0 if all equal."""
    mine = {fp.family: fp for fp in fps}
    report = []
    for path in files:
        for key in _load_keys(path):
            fp = mine.get(key["family"])
            if fp is None:
                continue
            diff = differences(fp.ingredients, key.get("ingredients") or {})
            report.append({"file": path, "family": key["family"], "namespace": key["namespace"],
                           "same": key["namespace"] == fp.namespace,
                           "differs": [{"ingredient": k, "here": a, "there": b}
                                       for k, a, b in diff]})
    missing = [f for f in mine if not any(r["family"] == f for r in report)]
    ok = bool(report) and all(r["same"] for r in report) and not missing
    if as_json:
        emit_json({"same": ok, "keys": report, "missing": missing})
    else:
        for r in report:
            if r["same"]:
                continue
            what = ", ".join(f"{d['ingredient']} {d['here']} here vs {d['there']}"
                             for d in r["differs"]) or "ingredients not given"
            print(f"{r['family']}: {r['file']} has {r['namespace']}, this node"
                  f" {mine[r['family']].namespace}: {what}")
        for f in missing:
            print(f"{f}: no key in {', '.join(files)}")
        if ok:
            print(f"same key: {', '.join(fp.namespace for fp in fps)}"
                  f" ({len(report)} compared)")
    return 0 if ok else 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def add(name: str, fn: Any, help: str, json: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(func=fn)
        if json:
            p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

    p = add("init", cmd_init, "create the shared root", json=False)
    p.add_argument("--multi-user", action="store_true",
                   help="let every user publish directly (casfs run without casfsd):"
                        " shared directories become 1777, each tenant's stay its own")
    p.add_argument("location", nargs="?",
                   help="a directory or s3://bucket/prefix[?endpoint=URL&region=R]"
                        " (default: --root, $CASFS_ROOT or the user data dir)")
    p = add("import", cmd_import, "publish a plain cache directory as a new generation")
    p.add_argument("src")
    p.add_argument("--namespace", "-n")
    p.add_argument("--family", default=families.FALLBACK, help=", ".join(families.names()))
    p.add_argument("--exclude", action="append", help="extra scratch glob (repeatable)")
    p.add_argument("--packs", action=argparse.BooleanOptionalAction, default=None,
                   help="store small files in pack objects (default: on for s3:// roots)")
    p = add("export", cmd_export, "materialise a generation as a plain directory")
    p.add_argument("ref", metavar="NS[@SEQ]")
    p.add_argument("dest")
    add("namespaces", cmd_namespaces, "list namespaces")
    p = add("generations", cmd_generations, "list the generations of a namespace")
    p.add_argument("namespace")
    p = add("ls", cmd_ls, "list a generation's files")
    p.add_argument("ref", metavar="NS[@SEQ]")
    p.add_argument("path", nargs="?", default="")
    p.add_argument("-r", "--recursive", action="store_true")
    p = add("stat", cmd_stat, "show one file's entry")
    p.add_argument("ref", metavar="NS[@SEQ]")
    p.add_argument("path")
    p = add("cat", cmd_cat, "write one file's verified bytes to stdout", json=False)
    p.add_argument("ref", metavar="NS[@SEQ]")
    p.add_argument("path")
    p = add("diff", cmd_diff, "compare two generations")
    p.add_argument("a", metavar="NS@A")
    p.add_argument("b", metavar="NS@B")
    p = add("du", cmd_du, "logical vs stored bytes, dedup and compression ratios")
    p.add_argument("namespace", nargs="?")
    add("verify", cmd_verify, "re-hash every object and check every generation")
    p = add("gc", cmd_gc, "delete what no kept generation references")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--keep", type=int, default=16, help="newest generations kept per namespace")
    p.add_argument("--grace", type=float, default=24 * 3600, help="seconds (default 86400)")
    p.add_argument("--unused-for", type=float, metavar="DAYS",
                   help="first drop the files no node opened (or published) for DAYS days"
                        " from each namespace (a new generation without them)")
    p.add_argument("--keep-outcomes", type=float, default=90, metavar="DAYS",
                   help="days of daily outcome records kept for casfs report (default 90;"
                        " older rows are dropped, never younger ones)")
    p = add("pin", cmd_pin, "keep a generation from gc", json=False)
    p.add_argument("ref", metavar="NS@SEQ")
    p.add_argument("name")
    p = add("unpin", cmd_unpin, "remove a pin", json=False)
    p.add_argument("namespace")
    p.add_argument("name")
    p = add("key", cmd_key, "print the ingredients of the auto namespace (of the job's"
                            " interpreter); --compare: exit 1 unless other nodes' keys match")
    p.add_argument("--python", metavar="PATH",
                   help="the job's interpreter (default: $VIRTUAL_ENV's, else python3 on PATH)")
    p.add_argument("--compare", nargs="+", metavar="FILE",
                   help="casfs key --json outputs of other nodes ('-': stdin)")
    p.add_argument("--family", default=families.FALLBACK,
                   help=f"comma list of {', '.join(families.names())}")
