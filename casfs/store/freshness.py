"""Freshness in signature mode: signed, expiring statements of a namespace's newest generation.

A record's signature says a trusted node wrote it, not that it is the newest:
on a root where others can write (root-squashed NFS, shared S3 credentials)
someone who deletes the newest record rolls the namespace back, and nothing
in the older records says so. So each publication in signature mode also
writes a *statement* (as CernVM-FS's ``.cvmfspublished`` and TUF's timestamp
role do), create-only, next to the records:

    namespaces/<ns>/heads/<12-digit seq>-<issued, unix seconds, >= 10 digits>

    {"casfs_head": 1, "namespace": ns, "tenant": t | null, "seq": N,
     "record": <blake3 hex of record N's bytes, as created>,
     "published": <record N's created time>, "issued": t, "expires": t + expiry,
     "node": id, "signature": {"key", "sig"}}

signed by the publishing node's key like a record (casfs.store.tenancy). It is
never rewritten: a newer statement is a new name (a new seq, or the same seq
issued later), and readers take the newest valid one among the
``HEAD_SCAN`` newest names (bounded work, whatever an attacker plants).

What a reader does with it (``GenerationStore.newest_valid``):

- The statement's seq is a *floor*: generation N existed and was the newest
  when it was issued. Records above N (a publication whose statement is not
  written yet, an older release's publication) are examined newest first,
  at most ``JUNK_SCAN`` of them, then N itself, whose bytes must hash to the
  statement's ``record``. Junk above the head (unsigned, another tenant's,
  mis-signed) thus costs at most ``JUNK_SCAN`` reads and freezes nothing.
- N missing or not the record the statement names: *rolled back*. Logged once
  as a WARNING ("rolled back: ..."), counted (``rolled_back_generations``).
  A store that already served N (or newer) keeps serving it; one that did not
  serves nothing from the namespace (a miss, with the reason) rather than an
  older generation. Publishers are not frozen: they publish above N (on the
  newest snapshot they have, or the newest valid record below N), and that
  publication's statement ends the miss. While the statement is younger than
  ``MISSING_GRACE`` (NFS may hide a fresh record) N counts as unresolved
  instead: readers serve the newest valid older record, publishers defer.
- An expired statement still sets the floor, but no longer vouches that N is
  the newest: logged once, counted (``expired_heads``), and the namespace is
  served as above. Statements are renewed by publication only (a node that
  merely reads cannot know nothing newer was withheld), so an idle namespace's
  statement expires; see docs/security.md for the trade-off.
- No valid statement among the names examined (a namespace from an older
  release, or only junk): read exactly as before statements existed.

Only ``trust = "signature"`` writes and checks statements; other modes and
older releases ignore ``heads/`` entirely (docs/format.md).

Layering: above casfs.store.backend, casfs.store.digests and
casfs.store.tenancy (signatures); below casfs.store.generations.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from casfs.errors import HostileManifestError
from casfs.store.backend import Backend
from casfs.store.digests import digest_bytes
from casfs.store.tenancy import RecordTrust, signature_ok
from casfs.tenants import split_store_namespace
from casfs.util import jsonsafe
from casfs.util.counters import Counters

log = logging.getLogger(__name__)

HEAD_VERSION = 1
HEAD_EXPIRY = 7 * 86400.0  # default; [tenants] head_expiry (TenantPolicy.head_expiry)
HEAD_SCAN = 8  # statement names examined per read, newest first
JUNK_SCAN = 16  # records above the statement's seq examined per read, newest first
MAX_HEAD_BYTES = 4096
SEQ_WIDTH = 12
HEAD_NAME_RE = re.compile(r"^([0-9]{12,})-([0-9]{10,})\Z")


class RolledBackError(HostileManifestError):
    """A namespace's signed statement names a generation that is gone or not the one named."""


@dataclass(frozen=True)
class Head:
    """One verified statement."""

    name: str
    namespace: str
    tenant: str | None
    seq: int
    record: str  # blake3 hex of the record's bytes
    published: float
    issued: float
    expires: float
    key: str  # the public key that signed it

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.expires

    def describe(self) -> str:
        return (f"its statement {self.name} (signed by {self.key[:12]}..., issued"
                f" {_when(self.issued)}, expires {_when(self.expires)}) names generation"
                f" {self.seq}")


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def heads_prefix(ns: str) -> str:
    return f"namespaces/{ns}/heads"


def head_name(seq: int, issued: float) -> str:
    return f"{seq:0{SEQ_WIDTH}d}-{int(issued):010d}"


def parse_head_name(name: str) -> tuple[int, int] | None:
    """(seq, issued) of a statement's name, None for any other name (ignored)."""
    m = HEAD_NAME_RE.match(name)
    if m is None:
        return None
    seq, issued = int(m.group(1)), int(m.group(2))
    if m.group(1) != f"{seq:0{SEQ_WIDTH}d}" or m.group(2) != f"{issued:010d}":
        return None  # one spelling per (seq, issued): no aliases
    return seq, issued


def record_digest(data: bytes) -> str:
    return digest_bytes(data)


class Heads:
    """Statements of one shared root, checked and written per the root's RecordTrust."""

    def __init__(self, backend: Backend, trust: RecordTrust, counters: Counters) -> None:
        self.backend = backend
        self.trust = trust
        self.counters = counters
        self._verified: dict[str, Head] = {}  # name -> statement (names are create-only)
        self._noted: set[tuple[str, str]] = set()

    def enabled(self, ns: str) -> bool:
        """Whether statements are checked for ``ns`` (``trust = "signature"``)."""
        return _keys(self.trust, ns) is not None

    # --- reading ------------------------------------------------------------------
    def newest(self, ns: str) -> Head | None:
        """The newest valid statement of ``ns`` among the HEAD_SCAN newest names; None if none.

        Invalid ones (unsigned, mis-signed, another namespace's or tenant's, a
        name that disagrees with the content) are counted (``untrusted_heads``)
        and logged once each.
        """
        keys = _keys(self.trust, ns)
        if keys is None:
            return None
        names = []
        for name in self.backend.list(heads_prefix(ns)):
            parsed = parse_head_name(name)
            if parsed is not None:
                names.append((parsed, name))
        names.sort(reverse=True)
        for (seq, issued), name in names[:HEAD_SCAN]:
            head = self._verified.get(name)
            if head is not None and head.key in keys:
                return head
            try:
                head = self._read(ns, name, seq, issued, keys)
            except FileNotFoundError:
                continue  # removed since the listing (gc)
            except (OSError, HostileManifestError, ValueError, ArithmeticError) as e:
                # ValueError/ArithmeticError too: one junk statement a check missed must
                # cost a skip, not every mount and publication of the namespace.
                self.counters.inc("untrusted_heads")
                self._note(ns, name, f"skipping statement {ns}/{name}: {e}")
                continue
            if len(self._verified) > 4096:
                self._verified.clear()
            self._verified[name] = head
            return head
        return None

    def _read(self, ns: str, name: str, seq: int, issued: int, keys: tuple[str, ...]) -> Head:
        with self.backend.open(f"{heads_prefix(ns)}/{name}") as f:
            data = f.read(MAX_HEAD_BYTES + 1)
        if len(data) > MAX_HEAD_BYTES:
            raise HostileManifestError("too large")
        doc = jsonsafe.parse(data, "statement")  # refuses NaN/Infinity: int() below
        if not isinstance(doc, dict) or doc.get("casfs_head") != HEAD_VERSION:
            raise HostileManifestError("not a version 1 statement")
        tenant, _ = split_store_namespace(ns)
        if doc.get("namespace") != ns or doc.get("tenant") != tenant:
            raise HostileManifestError("names another namespace or tenant")
        if doc.get("seq") != seq or type(seq) is not int:
            raise HostileManifestError("names another generation than its file name")
        # Bounded before int()/float(): a 4300-digit int overflows float() (unsigned junk
        # must be skipped like any other, not raise out of newest()).
        published, issued_at, expires = (jsonsafe.real(doc.get(k))
                                          for k in ("published", "issued", "expires"))
        if published is None or issued_at is None or expires is None:
            raise HostileManifestError("bad times")
        if int(issued_at) != issued or expires < issued_at:
            raise HostileManifestError("times disagree with its name")
        rec = doc.get("record")
        if not isinstance(rec, str) or not re.fullmatch(r"[0-9a-f]{64}", rec):
            raise HostileManifestError("bad record digest")
        if not signature_ok(doc, keys):
            raise HostileManifestError(f"no signature by a key trusted for tenant"
                                       f" {tenant or 'root'}")
        return Head(name, ns, tenant, seq, rec, published, issued_at, expires,
                    doc["signature"]["key"])

    # --- writing ------------------------------------------------------------------
    def publish(self, ns: str, seq: int, record: bytes, published: float,
                node: str = "") -> str | None:
        """Write the statement that ``record`` (as created) is ``ns``'s newest, if this node
        signs; its name, or None. A failure is logged, never raised: the record exists."""
        sign = getattr(self.trust, "sign_head", None)
        if sign is None or _keys(self.trust, ns) is None:
            return None
        now = time.time()
        tenant, _ = split_store_namespace(ns)
        doc: dict[str, Any] = {
            "casfs_head": HEAD_VERSION, "namespace": ns, "tenant": tenant, "seq": seq,
            "record": record_digest(record), "published": published, "issued": float(int(now)),
            "expires": float(int(now)) + _expiry(self.trust), "node": node[:128]}
        data = sign(doc)
        if data is None:
            return None
        name = head_name(seq, now)
        try:
            if not self.backend.create_exclusive(f"{heads_prefix(ns)}/{name}", data):
                return None  # this node wrote it already this second
        except OSError as e:
            self.counters.inc("head_write_errors")
            log.warning("cannot write the statement of %s@%d: %s (readers fall back to the"
                        " records; the next publication writes one)", ns, seq, e)
            return None
        return name

    def _note(self, ns: str, what: str, msg: str) -> None:
        if (ns, what) not in self._noted:
            self._noted.add((ns, what))
            log.warning("%s", msg)


def _keys(trust: RecordTrust, ns: str) -> tuple[str, ...] | None:
    fn = getattr(trust, "head_keys", None)
    return None if fn is None else fn(ns)


def _expiry(trust: RecordTrust) -> float:
    return float(getattr(trust, "head_expiry", HEAD_EXPIRY))
