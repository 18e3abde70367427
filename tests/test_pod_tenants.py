"""deploy/kubernetes/pod_tenants.py: a pod's ``casfs.io/tenant`` label, which anyone who
may create a pod writes as she likes, names a domain only from that domain's own
Kubernetes namespaces when DOMAIN_NAMESPACES says which (a review's note, 2026-12-06)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

PATH = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes" / "pod_tenants.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("casfs_pod_tenants", PATH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _pod(uid: str, ns: str, domain: str | None) -> dict[str, Any]:
    labels = {"casfs.io/tenant": domain} if domain is not None else {}
    return {"metadata": {"uid": uid, "namespace": ns, "labels": labels}}


PODS = [_pod("a", "ml-jobs", "ml"), _pod("b", "sandbox", "ml"), _pod("c", "bio", "bio"),
        _pod("d", "bio", None)]


def test_every_labelled_pod_without_an_allow_list() -> None:
    assert _module().tenants_of(PODS, None) == {"a": "ml", "b": "ml", "c": "bio"}


def test_a_domain_is_named_only_from_its_namespaces(capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    mod = _module()
    got = mod.tenants_of(PODS, {"ml": ["ml-jobs"], "bio": ["bio"]})
    assert got == {"a": "ml", "c": "bio"}  # b, in sandbox, claimed ml: left out
    err = capsys.readouterr().err
    assert "pods of namespace sandbox may not name domain 'ml'" in err
    mod.tenants_of(PODS, {"ml": ["ml-jobs"], "bio": ["bio"]})
    assert capsys.readouterr().err == ""  # said once


@pytest.mark.parametrize("text", ['["ml"]', '{"ml": "ml-jobs"}', '{"ml": [1]}'])
def test_a_bad_allow_list_stops_the_sidecar(text: str, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DOMAIN_NAMESPACES", text)
    monkeypatch.setenv("NODE_NAME", "n1")
    monkeypatch.setenv("OUT", "/nonexistent/tenants.json")
    assert _module().main() == 2
    assert "DOMAIN_NAMESPACES" in capsys.readouterr().err
