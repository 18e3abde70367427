"""Namespace fingerprints: stable, sensitive to the build key, validated."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from casfs import families
from casfs.errors import UsageError
from casfs.fingerprint import (
    Fingerprint,
    check_namespace,
    fingerprint,
    resolve_namespace,
)


def test_same_host_gives_same_namespace() -> None:
    for family in families.names():
        assert fingerprint(family).namespace == fingerprint(family).namespace


def test_namespace_format_and_key_order_independence() -> None:
    a = Fingerprint("triton", {"python": "cpython-3.11", "torch": None})
    b = Fingerprint("triton", {"torch": None, "python": "cpython-3.11"})
    assert a.namespace == b.namespace
    family, _, digest = a.namespace.partition("-")
    assert family == "triton"
    assert len(digest) == 16 and int(digest, 16) >= 0
    c = Fingerprint("triton", {"python": "cpython-3.12", "torch": None})
    assert c.namespace != a.namespace


def test_build_key_changes_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CASFS_BUILD_KEY", raising=False)
    base = fingerprint("inductor")
    assert base.ingredients["build_key"] is None
    monkeypatch.setenv("CASFS_BUILD_KEY", "image-1234")
    keyed = fingerprint("inductor")
    assert keyed.ingredients["build_key"] == "image-1234"
    assert keyed.namespace != base.namespace
    monkeypatch.setenv("CASFS_BUILD_KEY", "image-5678")
    assert fingerprint("inductor").namespace not in (base.namespace, keyed.namespace)


def test_family_ingredients() -> None:
    full = fingerprint("triton").ingredients
    for key in (
        "python",
        "platform",
        "arch",
        "libc",
        "torch",
        "triton",
        "cuda",
        "nvidia_driver",
        "gpu",
        "build_key",
    ):
        assert key in full
    assert set(fingerprint("generic").ingredients) == {"python", "platform", "arch", "build_key"}
    assert fingerprint("triton").namespace.startswith("triton-")
    assert fingerprint("generic").namespace.startswith("generic-")


def test_versions_come_from_metadata() -> None:
    from importlib.metadata import version

    ingredients = fingerprint("inductor").ingredients
    assert ingredients["torch"] == version("torch")
    assert ingredients["triton"] == version("triton")


def test_explicit_namespace_overrides() -> None:
    assert resolve_namespace("triton", "team-a.v2") == "team-a.v2"
    assert resolve_namespace("triton", None) == fingerprint("triton").namespace
    assert resolve_namespace("triton", "auto") == fingerprint("triton").namespace


@pytest.mark.parametrize("bad", ["", ".hidden", "a/b", "..", "a b", "x" * 129, "ns\n", "é", "a\0b"])
def test_bad_namespaces_rejected(bad: str) -> None:
    with pytest.raises(UsageError) as info:
        check_namespace(bad)
    assert "\n" not in info.value.message
    with pytest.raises(UsageError):
        resolve_namespace("generic", bad)


def test_good_namespaces_accepted() -> None:
    for good in ("a", "x" * 128, "triton-0123abcd", "A.b_c-9"):
        assert check_namespace(good) == good


def test_unknown_family_rejected() -> None:
    with pytest.raises(UsageError):
        fingerprint("rustc")
    with pytest.raises(UsageError):
        resolve_namespace("rustc", "explicit")


def test_does_not_import_torch_or_triton() -> None:
    code = (
        "import json, sys\n"
        "from casfs.fingerprint import fingerprint\n"
        "ns = [fingerprint(f).namespace for f in ('triton', 'inductor', 'generic')]\n"
        "mods = [m for m in ('torch', 'triton') if m in sys.modules]\n"
        "print(json.dumps({'ns': ns, 'mods': mods}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    result = json.loads(out.stdout)
    assert result["mods"] == []
    assert result["ns"][0] == fingerprint("triton").namespace
