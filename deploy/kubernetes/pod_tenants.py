#!/usr/bin/env python3
"""casfs-pod-tenants: keep {pod uid: casfs.io/tenant label} for the pods of this node.

casfsd's ``[tenants] pod_tenants`` file (docs/configuration.md): a process in
a pod is served as the domain its pod's label names. Runs beside casfsd in
its DaemonSet (deploy/kubernetes/casfsd.yaml) with the pod's service account
(get/list pods); standard library only. The file is replaced atomically.

Anyone who may create a pod may write any label on it: set DOMAIN_NAMESPACES
(each domain's Kubernetes namespaces) so that only pods of a domain's own
namespaces are served as that domain, or restrict the label by an admission
policy (docs/security.md).
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.parse
import urllib.request
from typing import Any

SA = "/var/run/secrets/kubernetes.io/serviceaccount"
LABEL = "casfs.io/tenant"
_SAID: set[tuple[Any, str]] = set()


def tenants_of(items: list[dict[str, Any]], allowed: dict[str, list[str]] | None
               ) -> dict[str, str]:
    """{pod uid: domain} from the pods' labels. The label is whatever the pod's author
    wrote: with ``allowed`` ({domain: [Kubernetes namespace, ...]}, DOMAIN_NAMESPACES)
    a pod names a domain only from one of that domain's namespaces; others are left
    out (casfsd then serves that pod nothing) and said once each."""
    out = {}
    for p in items:
        meta = p.get("metadata") or {}
        domain = (meta.get("labels") or {}).get(LABEL)
        if not isinstance(domain, str) or "uid" not in meta:
            continue
        if allowed is not None and meta.get("namespace") not in allowed.get(domain, ()):
            key = (meta.get("namespace"), domain)
            if key not in _SAID:
                _SAID.add(key)
                print(f"casfs-pod-tenants: pods of namespace {key[0]} may not name domain"
                      f" {domain!r:.60} (DOMAIN_NAMESPACES): left out", file=sys.stderr,
                      flush=True)
            continue
        out[meta["uid"]] = domain
    return out


def pods_of_node(node: str) -> list[dict[str, Any]]:
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node}",
                                    "labelSelector": LABEL})
    req = urllib.request.Request(f"https://{host}:{port}/api/v1/pods?{query}")
    with open(f"{SA}/token") as f:
        req.add_header("Authorization", f"Bearer {f.read().strip()}")
    ctx = ssl.create_default_context(cafile=f"{SA}/ca.crt")
    with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
        items: list[dict[str, Any]] = json.load(r)["items"]
    return items


def allowed_namespaces() -> dict[str, list[str]] | None:
    """DOMAIN_NAMESPACES, e.g. '{"ml": ["ml-jobs", "ml-dev"]}'; unset: any namespace."""
    text = os.environ.get("DOMAIN_NAMESPACES")
    if not text:
        return None
    doc = json.loads(text)
    if not isinstance(doc, dict) or not all(
            isinstance(v, list) and all(isinstance(n, str) for n in v) for v in doc.values()):
        raise ValueError("DOMAIN_NAMESPACES: not a JSON object of lists of namespaces")
    return doc


def main() -> int:
    node, out = os.environ["NODE_NAME"], os.environ["OUT"]
    interval = float(os.environ.get("INTERVAL", "5"))
    try:
        allowed = allowed_namespaces()
    except ValueError as e:
        print(f"casfs-pod-tenants: {e}", file=sys.stderr, flush=True)
        return 2
    while True:
        try:
            data = json.dumps(tenants_of(pods_of_node(node), allowed), sort_keys=True).encode()
            tmp = f"{out}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, out)
        except Exception as e:  # keep the last good map; casfsd refuses unknown pods
            print(f"casfs-pod-tenants: {e}", file=sys.stderr, flush=True)
        time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main())
