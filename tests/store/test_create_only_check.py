"""A store that stopped honouring create-only writes is refused before a record is made.

``casfs init`` refuses a store whose racing creates both win, but a gateway or
proxy put in front of it later that drops ``If-None-Match`` makes every create
succeed: two nodes publishing one seq at once both said "published", and one's
generation was silently lost (a review, 2026-12-06). Emulated here by a proxy that
answers 200 to the creates the server refuses (``accept_refused_creates``). Now each process checks,
beside its first manifest upload on a remote root, that a second create of one
key is refused; if not, publication fails in one line and nothing is overwritten.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from netem import NetProxy

from casfs.errors import PublishError
from casfs.store import createonly
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot
from casfs.util.location import S3Location, parse_location


def _entry(root: SharedRoot, path: str, data: bytes) -> Entry:
    res = root.objects.put_bytes(data)
    return Entry(path, res.digest, res.size, 0o644, 0)


def test_publication_through_a_gateway_that_drops_if_none_match_is_refused(
        s3_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(createonly, "_honoured", {})  # no check remembered from before
    direct = SharedRoot.open(s3_url, create=True)
    first = direct.generations().publish("ns", [_entry(direct, "a", b"a")], node="n1")
    assert first.seq == 1
    loc = parse_location(s3_url)
    assert isinstance(loc, S3Location) and loc.endpoint
    with NetProxy(loc.endpoint, delay=0.0, accept_refused_creates=True) as net:
        root = SharedRoot.open(s3_url.replace(loc.endpoint, net.endpoint))
        gens = root.generations()
        # Built on seq 1, as a node that lost the race to a seq-2 record would be.
        direct.generations().publish("ns", [_entry(direct, "b", b"b")], node="n2")
        with pytest.raises(PublishError, match=r"drops the header\? Not publishing"):
            gens.publish("ns", [_entry(root, "c", b"c")], node="n3")
        assert net.counts()["creates_faked"] == 2  # the check's two creates (the key exists)
    # Nothing was overwritten: the other node's generation 2 stands, as it was.
    snap = SharedRoot.open(s3_url).generations().newest_snapshot("ns")
    assert set(snap.entries) == {"a", "b"}
    # The same store, reached without the gateway: checked once, then published.
    again = direct.generations().publish("ns", [_entry(direct, "c", b"c")], node="n3")
    assert again.seq == 3


def test_a_local_root_is_not_checked(tmp_path: Path) -> None:
    root = SharedRoot.open(tmp_path / "root", create=True)
    assert createonly.refusal(root.backend) is None
    assert not (tmp_path / "root" / "probes").exists()
