#!/usr/bin/env python3
"""casfs-pod-tenants: keep {pod uid: casfs.io/tenant label} for the pods of this node.

casfsd's ``[tenants] pod_tenants`` file (docs/configuration.md): a process in
a pod is served as the domain its pod's label names. Runs beside casfsd in
its DaemonSet (deploy/kubernetes/casfsd.yaml) with the pod's service account
(get/list pods); standard library only. The file is replaced atomically.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.parse
import urllib.request

SA = "/var/run/secrets/kubernetes.io/serviceaccount"
LABEL = "casfs.io/tenant"


def pods_of_node(node: str) -> dict[str, str]:
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node}",
                                    "labelSelector": LABEL})
    req = urllib.request.Request(f"https://{host}:{port}/api/v1/pods?{query}")
    with open(f"{SA}/token") as f:
        req.add_header("Authorization", f"Bearer {f.read().strip()}")
    ctx = ssl.create_default_context(cafile=f"{SA}/ca.crt")
    with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
        items = json.load(r)["items"]
    return {p["metadata"]["uid"]: p["metadata"]["labels"][LABEL] for p in items}


def main() -> int:
    node, out = os.environ["NODE_NAME"], os.environ["OUT"]
    interval = float(os.environ.get("INTERVAL", "5"))
    while True:
        try:
            data = json.dumps(pods_of_node(node), sort_keys=True).encode()
            tmp = f"{out}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, out)
        except Exception as e:  # keep the last good map; casfsd refuses unknown pods
            print(f"casfs-pod-tenants: {e}", file=sys.stderr, flush=True)
        time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main())
