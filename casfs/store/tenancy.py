"""Who may have written a generation: the store's side of tenants (casfs.tenants).

Objects are shared by every tenant: they are named and verified by content,
so nobody can place bytes under a name they do not hash to. Records (and the
manifests they name by digest) are per tenant, and a node serves a tenant's
namespace only if that tenant, or a domain it trusts, could have written it.
Two ways to know, chosen by ``[tenants] trust``:

``owner`` (a POSIX root whose ownership is real: local disk, Lustre, NFS
without root squash). A tenant's namespace directory and its ``generations``
and ``pins`` directories are created 0700 (a user) or 2770 with the domain's
group (a group domain), owned by the tenant (or root). On every read the
directories are checked with lstat: owned by root or a member, never
writable by others, group-writable only by the domain's group. A namespace
that fails is not served and not published to (logged, counted as
``untrusted_namespaces``). Plain (legacy) names belong to root in ``uid`` mode.

``signature`` (wherever ownership cannot be trusted: root-squashed NFS,
shared credentials, object stores, containers running as root). Each record
carries ``"tenant"`` and ``"signature": {"key": <ed25519 public key, base64>,
"sig": <base64>}`` over the canonical JSON of the record without its
signature (sorted keys, no spaces). A record is served only if its tenant is
the namespace's and its key is trusted for that tenant in the node's config;
anything else is damage (skipped, the previous generation stays; counted as
``untrusted_records``). The record names its manifests by digest and they name
their objects by digest, so one signature covers every byte served.

``cluster`` mode trusts everything (no checks), as casfs did before tenants.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import stat
from pathlib import Path
from typing import Any, Protocol

from casfs.errors import ConfigError, HostileManifestError, UntrustedError
from casfs.tenants import CLUSTER, TenantPolicy, split_store_namespace
from casfs.util import beneath, jsonsafe
from casfs.util.counters import Counters

log = logging.getLogger(__name__)

# reads: casfs.store.reads (retention); outcomes: casfs.store.outcomes (casfs report)
SUBDIRS = ("generations", "pins", "reads", "outcomes")


def _rels(ns: str) -> list[str]:
    """A namespace's directories, relative to the root."""
    return [f"namespaces/{ns}", *(f"namespaces/{ns}/{s}" for s in SUBDIRS)]


class RecordTrust(Protocol):
    """What GenerationStore asks before reading and writing a namespace's records."""

    def check_namespace(self, ns: str) -> None:
        """Raise UntrustedError if ``ns``'s records may come from outside its tenant."""
        ...

    def prepare_namespace(self, ns: str) -> None:
        """Create ``ns``'s directories with its tenant's owner and mode (before publishing)."""
        ...

    def seal(self, ns: str, record: bytes) -> bytes:
        """The record as written: with its tenant and, if this node signs, a signature."""
        ...

    def check_record(self, ns: str, record: bytes) -> None:
        """Raise HostileManifestError if ``record`` may not be served for ``ns``."""
        ...

    def head_keys(self, ns: str) -> tuple[str, ...] | None:
        """Keys trusted on ``ns``'s statements (casfs.store.freshness); None: not checked."""
        ...

    def sign_head(self, doc: dict[str, Any]) -> bytes | None:
        """A statement as written, signed by this node; None if this node does not sign."""
        ...


class OpenTrust:
    """No tenants: every record is trusted (cluster mode, store tools, tests)."""

    def check_namespace(self, ns: str) -> None:
        pass

    def prepare_namespace(self, ns: str) -> None:
        pass

    def seal(self, ns: str, record: bytes) -> bytes:
        return record

    def check_record(self, ns: str, record: bytes) -> None:
        pass

    def head_keys(self, ns: str) -> tuple[str, ...] | None:
        return None

    def sign_head(self, doc: dict[str, Any]) -> bytes | None:
        return None


# --- ed25519 ------------------------------------------------------------------------
def canonical(doc: dict[str, Any]) -> bytes:
    """The signed bytes: the record without its signature, sorted keys, no spaces."""
    body = {k: v for k, v in doc.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def load_signing_key(path: Path) -> Any:
    """An ed25519 private key from a PEM (PKCS8) or raw 32-byte file; ConfigError if not."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"tenants.signing_key: cannot read {path}: {e.strerror}") from None
    try:
        if len(data) == 32:
            return Ed25519PrivateKey.from_private_bytes(data)
        key = serialization.load_pem_private_key(data, password=None)
    except ValueError as e:
        raise ConfigError(f"tenants.signing_key: {path} is not a key: {e}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"tenants.signing_key: {path} is not an ed25519 key")
    return key


def public_key_b64(private_key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    raw = private_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def check_public_key(text: str, key: str) -> str:
    """``text`` if it is a base64 ed25519 public key (32 bytes); ConfigError naming ``key``."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise ConfigError(f"{key}: expected an ed25519 public key (32 bytes, base64),"
                          f" got {text[:60]!r}")
    return text


def sign(doc: dict[str, Any], private_key: Any) -> dict[str, Any]:
    sig = private_key.sign(canonical(doc))
    return {**doc, "signature": {"key": public_key_b64(private_key),
                                 "sig": base64.b64encode(sig).decode()}}


def signature_ok(doc: dict[str, Any], keys: tuple[str, ...]) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    s = doc.get("signature")
    if not isinstance(s, dict) or s.get("key") not in keys or not isinstance(s.get("sig"), str):
        return False
    try:
        pub = Ed25519PublicKey.from_public_bytes(base64.b64decode(s["key"], validate=True))
        pub.verify(base64.b64decode(s["sig"], validate=True), canonical(doc))
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True


# --- the policy's trust ---------------------------------------------------------------
class TenantTrust:
    """RecordTrust from the node's TenantPolicy, over a POSIX root at ``root``.

    ``root`` None (an object store): ownership means nothing there, so only
    signatures are checked.
    """

    def __init__(self, policy: TenantPolicy, root: Path | None,
                 counters: Counters | None = None) -> None:
        self.policy = policy
        self.root = root
        self.counters = counters or Counters()
        self._key = (load_signing_key(policy.signing_key)
                     if policy.signing_key is not None else None)
        self._open = policy.mode == CLUSTER
        self._prepared: set[str] = set()  # namespaces whose directories this process made

    def _dir(self, ns: str) -> Path | None:
        return None if self.root is None else self.root / "namespaces" / ns

    def _root_fd(self) -> int:
        """The root's directory, every namespace path reached beneath it (casfs.util.beneath):
        a tenant owns her namespace directory and may mount a FUSE file system of her
        own on it, whose server need never answer an lstat or mkdir of root's there."""
        assert self.root is not None
        return os.open(self.root, beneath.DIR_FLAGS | os.O_CLOEXEC)

    # --- ownership ---------------------------------------------------------------
    def check_namespace(self, ns: str) -> None:
        d = self._dir(ns)
        if self._open or self.policy.trust != "owner" or d is None:
            return
        tenant, _ = split_store_namespace(ns)
        base = self._root_fd()
        try:
            for rel in _rels(ns):
                try:
                    st = beneath.lstat(base, rel)
                except FileNotFoundError:
                    continue  # nothing there yet: nothing to serve, nothing to distrust
                except OSError as e:
                    if e.errno not in beneath.REFUSED:
                        raise
                    problem: str | None = "is reached through a symbolic link or another mount"
                else:
                    problem = self._problem(tenant, st)
                if problem:
                    path = d.parent.parent / rel
                    self.counters.inc("untrusted_namespaces")
                    log.warning("not serving namespace %s: %s %s", ns, path, problem)
                    raise UntrustedError(f"namespace {ns}: {path} {problem}; not served")
        finally:
            os.close(base)

    def _problem(self, tenant: str | None, st: os.stat_result) -> str | None:
        if not stat.S_ISDIR(st.st_mode):
            return "is not a directory"
        if st.st_mode & stat.S_IWOTH:
            return "is writable by every user"
        if not self.policy.may_write(tenant, st.st_uid):
            return f"is owned by uid {st.st_uid}, outside tenant {tenant or 'root'}"
        if st.st_mode & stat.S_IWGRP and not self.policy.group_may_write(tenant, st.st_gid):
            return f"is writable by group {st.st_gid}, outside tenant {tenant or 'root'}"
        return None

    def prepare_namespace(self, ns: str) -> None:
        d = self._dir(ns)
        tenant, _ = split_store_namespace(ns)
        if d is None or self._open or self.policy.trust != "owner":
            return  # ownership means nothing: created on demand as before
        if tenant is None:  # a plain name is root's: created on demand as before
            self._quarantine_if_untrusted(ns, d)  # (one a user made before tenants: aside)
            return
        if ns in self._prepared:
            try:
                self.check_namespace(ns)  # made before: only look (no mkdir per publication)
                return
            except UntrustedError:
                self._prepared.discard(ns)  # replaced since: move it aside, make it again
        t = self.policy.tenant(tenant)
        mode = t.dir_mode
        self._quarantine_if_untrusted(ns, d)
        self.check_namespace(ns)  # never create anything inside someone else's directory
        base = self._root_fd()
        try:
            for rel in _rels(ns):
                try:
                    with beneath.parent(base, rel) as (pfd, leaf):
                        os.mkdir(leaf, 0o700, dir_fd=pfd)
                except FileExistsError:
                    continue
                try:
                    if os.geteuid() == 0:
                        beneath.chown(base, rel, t.uid, t.gid)
                    elif t.group_shared:  # a member may give its dir the domain's group
                        beneath.chown(base, rel, -1, t.gid)
                except OSError as e:  # root-squashed NFS: only signatures can tell then
                    log.warning("cannot give %s to tenant %s: %s", d.parent.parent / rel,
                                tenant, e)
                beneath.chmod(base, rel, mode)  # after chown: chown clears setgid
        finally:
            os.close(base)
        self._prepared.add(ns)

    def _quarantine_if_untrusted(self, ns: str, d: Path) -> None:
        """Root moves a namespace directory someone else planted out of the tenant's way.

        Without this, a user who creates another tenant's namespace directory
        first would stop that tenant's publications for good. Only root can, and
        only where ownership is trusted at all; the directory goes to tmp/, where
        gc removes it after its grace period.
        """
        if os.geteuid() != 0 or self.policy.trust != "owner" or self.root is None:
            return
        try:
            self.check_namespace(ns)
            return
        except UntrustedError:
            pass
        dest = self.root / "tmp" / f"untrusted-{ns}-{os.urandom(4).hex()}"
        try:
            os.rename(d, dest)
            log.warning("moved namespace directory %s, planted outside its tenant, to %s",
                        d, dest)
        except OSError as e:
            log.warning("cannot move untrusted %s aside: %s", d, e)

    # --- records -----------------------------------------------------------------
    def seal(self, ns: str, record: bytes) -> bytes:
        tenant, _ = split_store_namespace(ns)
        if tenant is None and self._key is None:
            return record
        doc = json.loads(record)
        # Optional keys make a version 2 record (docs/format.md, "Format versions").
        doc["casfs_generation"] = max(2, int(doc.get("casfs_generation", 1)))
        if tenant is not None:
            doc["tenant"] = tenant
        if self._key is not None:
            doc = sign(doc, self._key)
        return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"

    def check_record(self, ns: str, record: bytes) -> None:
        if self._open:
            return
        tenant, _ = split_store_namespace(ns)
        try:
            doc = jsonsafe.parse(record, "record")
        except HostileManifestError:
            return  # parse_record names the damage (200 KB of "[" is a RecursionError)
        if not isinstance(doc, dict):
            return
        if "tenant" in doc and doc["tenant"] != tenant:
            self._untrusted(ns, f"its record names tenant {doc['tenant']!r:.40}")
        if self.policy.trust == "signature" and not signature_ok(doc,
                                                                 self.policy.keys_for(tenant)):
            self._untrusted(ns, "its record has no signature by a key trusted for "
                                f"tenant {tenant or 'root'}")

    # --- statements of the newest generation (casfs.store.freshness) --------------
    @property
    def head_expiry(self) -> float:
        return self.policy.head_expiry

    def head_keys(self, ns: str) -> tuple[str, ...] | None:
        if self._open or self.policy.trust != "signature":
            return None
        tenant, _ = split_store_namespace(ns)
        return self.policy.keys_for(tenant)

    def sign_head(self, doc: dict[str, Any]) -> bytes | None:
        if self._key is None or self._open or self.policy.trust != "signature":
            return None
        return json.dumps(sign(doc, self._key), indent=1, sort_keys=True).encode() + b"\n"

    def _untrusted(self, ns: str, why: str) -> None:
        self.counters.inc("untrusted_records")
        raise HostileManifestError(f"namespace {ns}: {why}; not served")
