"""What tenant checks cost: publish and read generations with no policy, with
ownership checks (trust = "owner") and with ed25519-signed records (trust =
"signature"), on one local root; and each check alone, in microseconds.
Standalone: ``python -m bench.tenants [N]``; prints JSON with seconds per
operation and ratios against no policy (publication is dominated by syncfs,
so its ratios are noisy on a loaded machine; ``checks_us`` are not).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from casfs.store.entry import Entry
from casfs.store.root import SharedRoot
from casfs.tenants import TenantPolicy


def _run(root_path: Path, policy: TenantPolicy | None, ns: str, n: int) -> dict[str, float]:
    root = SharedRoot.open(root_path, tenants=policy)
    gens = root.generations()
    digest = root.objects.put_bytes(b"kernel").digest
    t0 = time.perf_counter()
    for i in range(n):  # each publication: read newest, check, write one record
        gens.publish(ns, [Entry(f"k{i}/kernel.so", digest, 6, 0o644, 0)], node="bench")
    t1 = time.perf_counter()
    for seq in range(1, n + 1):  # each read: namespace check, record check, parse
        gens.latest_seq(ns)
        gens.record(ns, seq)
    t2 = time.perf_counter()
    return {"publish_s": (t1 - t0) / n, "read_s": (t2 - t1) / n}


def _checks(root_path: Path, signed: TenantPolicy, n: int) -> dict[str, float]:
    """Microseconds per check alone: the noise of syncfs is not in these."""
    from casfs.store.tenancy import TenantTrust

    data = (root_path / "namespaces" / "u4242~signed" / "generations" / "000000000001"
            ).read_bytes()
    sig, own = TenantTrust(signed, root_path), TenantTrust(TenantPolicy(), root_path)
    out = {}
    for name, fn in (("verify_record", lambda: sig.check_record("u4242~signed", data)),
                     ("sign_record", lambda: sig.seal("u4242~signed", data)),
                     ("owner_check", lambda: own.check_namespace("u4242~owner"))):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = round((time.perf_counter() - t0) / n * 1e6, 1)
    return out


def main() -> int:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from casfs.store.tenancy import public_key_b64

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with tempfile.TemporaryDirectory() as d:
        root_path = Path(d) / "root"
        SharedRoot.open(root_path, create=True)
        key = Ed25519PrivateKey.generate()
        (Path(d) / "node.key").write_bytes(key.private_bytes_raw())
        signed = TenantPolicy(trust="signature", signing_key=Path(d) / "node.key",
                              trusted_keys=(public_key_b64(key),))
        out = {
            "open": _run(root_path, None, "u0000-open", n),
            "owner": _run(root_path, TenantPolicy(), "u4242~owner", n),
            "signature": _run(root_path, signed, "u4242~signed", n),
        }
        out["checks_us"] = _checks(root_path, signed, n * 10)
    base = out["open"]
    for name in ("owner", "signature"):
        for k in ("publish_s", "read_s"):
            out[name][k.replace("_s", "_ratio")] = round(out[name][k] / base[k], 3)
    print(json.dumps({"generations": n, **out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
