"""Node state of namespaces idle for a while is reclaimed; unpublished files go out first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from casfs.index.node_index import NodeIndex

from .test_host import casfs, published

pytestmark = [pytest.mark.fuse]


def namespaces_upper(node: dict[str, Any]) -> list[Path]:
    return sorted(p for p in (node["state"] / "upper").iterdir() if not p.name.startswith("."))


def run_job(node: dict[str, Any], ns: str, script: str) -> None:
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
                        "-n", ns, "--stable-after", "0.2", "--", sys.executable, "-c", script],
                       env=node["env"], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr


def reclaim(node: dict[str, Any]) -> list[dict[str, Any]]:
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "reclaim", "--idle", "0",
                        "--json"], env=node["env"], capture_output=True, text=True, timeout=120,
                       check=False)
    return list(json.loads(r.stdout))


def test_idle_namespace_is_published_then_reclaimed(node: dict[str, Any]) -> None:
    write = "import os; open(os.environ['CASFS_CACHE_DIR'] + '/a', 'w').write('A')"
    run_job(node, "old", write)
    uppers = namespaces_upper(node)
    assert len(uppers) == 1 and (uppers[0] / "a").exists()
    store_ns = uppers[0].name
    # A file the mount never published (its process died first, say).
    (uppers[0] / "b").write_text("B")
    # A namespace in use right now is not touched.
    busy = casfs(node, "run", "--family", "generic", "-n", "busy", "--", sys.executable, "-c",
                 "import os, time\n"
                 "open(os.environ['CASFS_CACHE_DIR'] + '/x', 'w').write('x')\n"
                 "time.sleep(600)")
    # Its job's file, not just its upper: the job writes once its lease is granted, so
    # the namespace is recorded as served by then (reclaim lists it, in use).
    wait_until(lambda: any((p / "x").exists() for p in namespaces_upper(node)),
               "the busy namespace's job writing")

    out = {r["namespace"]: r for r in reclaim(node)}
    assert out[store_ns]["reclaimed"] and out[store_ns]["published"] == 1
    busy_ns = next(k for k in out if k != store_ns)
    assert not out[busy_ns]["reclaimed"] and "in use" in out[busy_ns]["why"]
    assert published(node["root"], store_ns) == {"a": b"A", "b": b"B"}  # nothing lost
    assert not uppers[0].exists()
    with NodeIndex.open(node["state"]) as idx:
        assert idx.ns_state(store_ns) is None
        assert idx.count_pending(store_ns) == 0
    busy.kill()
    busy.wait()

    # Served again later: restored from the root, lazily, as on a fresh node.
    run_job(node, "old", "import os; d = os.environ['CASFS_CACHE_DIR'];"
            " assert open(d + '/a').read() == 'A' and open(d + '/b').read() == 'B'")


def test_unpublishable_content_keeps_the_state(node: dict[str, Any], tmp_path: Path) -> None:
    run_job(node, "kept", "import os; open(os.environ['CASFS_CACHE_DIR'] + '/a', 'w').write('A')")
    upper = namespaces_upper(node)[0]
    (upper / "b").write_text("B")
    node["root"].rename(tmp_path / "root-away")  # the shared root is unusable
    node["root"].write_text("not a root")
    try:
        out = reclaim(node)
    finally:
        node["root"].unlink()
        (tmp_path / "root-away").rename(node["root"])
    assert len(out) == 1 and not out[0]["reclaimed"]
    assert (upper / "b").read_text() == "B"  # kept for the next round
