"""casfs explain: this job's namespace against the root's, with the ingredients that differ."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from casfs.fingerprint import Fingerprint, fingerprint, job_env
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot

Cli = Callable[..., Any]


def publish_as(root: SharedRoot, fp: Fingerprint, files: int = 2) -> None:
    entries = []
    for i in range(files):
        put = root.objects.put_bytes(f"{fp.namespace}/{i}".encode())
        entries.append(Entry(f"K{i}/k.cubin", put.digest, put.size, 0o644, 1))
    root.generations().publish(fp.namespace, entries, node="n", fingerprint=fp.ingredients)


def test_explain_names_the_ingredients_that_differ(cli: Cli,
                                                    casfs_env: dict[str, Path]) -> None:
    mine = fingerprint("triton", job_env(python=sys.executable))
    root = SharedRoot.open(casfs_env["root"], create=True)
    near = Fingerprint("triton", {**mine.ingredients, "torch": "2.14.0"})
    far = Fingerprint("triton", {**mine.ingredients, "torch": "2.14.0", "gpu": "NVIDIA H200/9.0"})
    publish_as(root, far)
    publish_as(root, near, files=3)
    publish_as(root, Fingerprint("inductor", {**mine.ingredients}))  # another family
    doc = cli("explain", "--family", "triton", "--python", sys.executable, "--json",
              check=True).json()
    fam = doc["families"][0]
    assert fam["namespace"] == mine.namespace and fam["published"] is None
    assert [r["namespace"] for r in fam["nearest"]] == [near.namespace, far.namespace]
    assert fam["nearest"][0]["differs"] == [
        {"ingredient": "torch", "here": mine.ingredients["torch"], "there": "2.14.0"}]
    text = cli("explain", "--family", "triton", "--python", sys.executable, check=True).out
    assert f"{mine.namespace} has no generation" in text
    assert f"torch {mine.ingredients['torch']} here vs 2.14.0" in text
    # Once this job's namespace has a generation, explain says so.
    publish_as(root, mine)
    doc = cli("explain", "--family", "triton", "--python", sys.executable, "--json",
              check=True).json()
    assert doc["families"][0]["published"]["entries"] == 2
