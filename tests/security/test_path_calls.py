"""No new path-string file operation in the node, view and promotion layers (issue 21).

Every file operation casfs makes inside a directory a tenant can write must go
through casfs/util/beneath.py (resolved beneath a directory fd, no symlink
followed, with the tenant's credentials where casfs acts for it). This test
scans casfs/node, casfs/view and casfs/promote for calls that take a path
string: ``open``, ``os.open``/``mkdir``/``makedirs``/``rename``/``replace``/
``link``/``symlink``/``unlink``/``remove``/``rmdir``/``chmod``/``chown``/
``lchown``/``utime``/``truncate``, any ``shutil`` call, and the same through
``pathlib.Path`` methods. Each one present today is listed in
``path_calls_allowed.txt`` as ``file<TAB>function<TAB>call`` (counted), and
the test fails on any call not listed there: a new one must either use
beneath.py or be added to the list in review, with the reason it touches no
tenant directory (the state dir, the shared root, a run dir, an fd-relative
call) in the commit that adds it.

``CASFS_REGEN_PATH_CALLS=1`` rewrites the list from the tree (then review the diff).
"""

from __future__ import annotations

import ast
import collections
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("casfs/node", "casfs/view", "casfs/promote")
ALLOWED = Path(__file__).with_name("path_calls_allowed.txt")
OS_CALLS = {"open", "mkdir", "makedirs", "rename", "replace", "renames", "link", "symlink",
            "unlink", "remove", "rmdir", "removedirs", "chmod", "lchmod", "chown", "lchown",
            "utime", "truncate", "mknod", "mkfifo"}
PATH_METHODS = {"mkdir", "rename", "unlink", "rmdir", "chmod", "lchmod", "symlink_to",
                "hardlink_to", "touch", "write_bytes", "write_text", "read_bytes", "read_text"}


def _flagged(call: ast.Call) -> bool:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id == "open"
    if not isinstance(f, ast.Attribute):
        return False
    base = f.value
    if isinstance(base, ast.Name) and base.id == "beneath":
        return False  # the one sanctioned way
    if isinstance(base, ast.Name) and base.id == "os":
        return f.attr in OS_CALLS
    if isinstance(base, ast.Name) and base.id == "shutil":
        return True
    if f.attr == "replace":  # Path.replace(target); str.replace takes two arguments
        return len(call.args) == 1 and not call.keywords
    if f.attr == "open":  # Path.open(mode): not os.open, not an object's own open(path, ...)
        return (not call.args or isinstance(call.args[0], ast.Constant)) and not (
            isinstance(base, ast.Name) and base.id in ("beneath", "gzip", "io", "tarfile"))
    return f.attr in PATH_METHODS


def scan() -> collections.Counter[str]:
    found: collections.Counter[str] = collections.Counter()
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            tree = ast.parse(path.read_text(), rel)
            stack: list[str] = []

            def visit(node: ast.AST, rel: str = rel, stack: list[str] = stack) -> None:
                named = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    stack.append(node.name)
                if isinstance(node, ast.Call) and _flagged(node):
                    text = " ".join(ast.unparse(node.func).split())
                    found[f"{rel}\t{'.'.join(stack) or '<module>'}\t{text}"] += 1
                for child in ast.iter_child_nodes(node):
                    visit(child)
                if named:
                    stack.pop()

            visit(tree)
    return found


def _read_allowed() -> collections.Counter[str]:
    out: collections.Counter[str] = collections.Counter()
    for line in ALLOWED.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        key, _, n = line.rpartition("\t")
        out[key] = int(n)
    return out


def test_no_new_path_string_file_operation_outside_beneath() -> None:
    found = scan()
    if os.environ.get("CASFS_REGEN_PATH_CALLS") == "1":
        header = ("# Path-string file operations in casfs/node, casfs/view, casfs/promote\n"
                  "# (tests/security/test_path_calls.py): file, function, call, count. Those\n"
                  "# present on 2026-12-01 act in root-only state, run and overlay dirs, on the\n"
                  "# mount-base path checked by casfs/util/owned.py, relative to the upper's\n"
                  "# fd (view/layers.py), or as the user itself (importer); a new one uses\n"
                  "# casfs/util/beneath.py or is added here with its reason in the commit.\n")
        ALLOWED.write_text(header + "".join(f"{k}\t{n}\n" for k, n in sorted(found.items())))
    allowed = _read_allowed()
    new = {k: n - allowed.get(k, 0) for k, n in found.items() if n > allowed.get(k, 0)}
    assert not new, (
        "path-string file operations not reviewed (use casfs/util/beneath.py for anything in a"
        " directory a tenant can write, or add them to tests/security/path_calls_allowed.txt"
        " with the reason they touch none):\n" + "\n".join(f"  {k} (+{n})" for k, n in
                                                         sorted(new.items())))


def test_the_scan_sees_what_it_must() -> None:
    """The scanner flags each kind of call it claims to (a scanner that saw nothing
    would pass the test above on any tree)."""
    src = ("import os, shutil\nfrom pathlib import Path\n"
           "def f(p):\n    open(p)\n    os.rename(p, p)\n    shutil.rmtree(p)\n"
           "    Path(p).unlink()\n    Path(p).replace(p)\n    'a'.replace('a', 'b')\n"
           "    Path(p).open('rb')\n    Path(p).write_bytes(b'')\n")
    calls = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call)]
    flagged = [" ".join(ast.unparse(c.func).split()) for c in calls if _flagged(c)]
    assert flagged == ["open", "os.rename", "shutil.rmtree", "Path(p).unlink",
                       "Path(p).replace", "Path(p).open", "Path(p).write_bytes"]
    assert sum(scan().values()) > 50  # today's tree has many, listed and reviewed
