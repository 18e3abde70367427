"""casfs explain: this job's namespace against the root's, with the ingredients that differ."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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


def _nearest_is_known(cli: Cli, fam: str, *extra: str) -> dict[str, Any]:
    doc = cli("explain", "--family", fam, *extra, "--json", check=True).json()
    (near,) = doc["families"][0]["nearest"]
    assert near["ingredients_known"] is True, near
    assert near["differs"] == [{"ingredient": "build_key", "here": None, "there": "nightly"}]
    text = cli("explain", "--family", fam, *extra, check=True).out
    assert "no ingredients recorded" not in text and "build_key None here vs nightly" in text
    return dict(near)


def test_dir_mode_run_records_its_ingredients(cli: Cli, casfs_env: dict[str, Path],
                                              tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A dir-mode `casfs run` (one mount process per cache, no node host) publishes
    records with the job's ingredients, so explain can compare them."""
    monkeypatch.setenv("CASFS_MOUNT_BASE", str(tmp_path / "mnt"))
    monkeypatch.setenv("CASFS_BUILD_KEY", "nightly")
    script = "import os; open(os.environ['TRITON_CACHE_DIR'] + '/k.cubin', 'w').write('k')"
    cli("run", "--family", "triton", "--mode", "dir", "--python", sys.executable,
        "--stable-after", "0.2", "--", sys.executable, "-c", script, check=True)
    monkeypatch.delenv("CASFS_BUILD_KEY")
    _nearest_is_known(cli, "triton", "--python", sys.executable)


@pytest.mark.fuse
def test_configured_daemon_mount_records_its_ingredients(
        cli: Cli, casfs_env: dict[str, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A casfsd [[mounts]] entry with an auto namespace: its records carry the
    ingredients the daemon resolved the namespace from."""
    from casfs.daemon import config as dconfig
    from casfs.node.worker import spawn

    conf = tmp_path / "casfs.toml"
    conf.write_text(f'[store]\nroot = "{casfs_env["root"]}"\n[node]\nstate_dir = '
                    f'"{tmp_path}/dstate"\nmount_base = "{tmp_path}/dmnt"\n'
                    '[[mounts]]\nname = "kern"\nfamily = "triton"\nstable_after = 0.2\n')
    monkeypatch.setenv("CASFS_BUILD_KEY", "nightly")
    (mcfg,) = dconfig.load(conf).mount_configs()
    monkeypatch.delenv("CASFS_BUILD_KEY")
    assert mcfg.ingredients["build_key"] == "nightly"
    w = spawn(mcfg)
    try:
        (mcfg.mountpoint / "k.cubin").write_text("k")
    finally:
        w.stop()
    near = _nearest_is_known(cli, "triton")
    assert near["namespace"] == mcfg.namespace
