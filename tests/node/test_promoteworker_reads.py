"""What the promotion worker reads for a round and the publication after it
(casfs.node.promoteworker._Namespace): the served record as the mount sent it, and
the access profile that publication merges onto, read beside the record's parts."""

from __future__ import annotations

import time
from pathlib import Path

from casfs.node.promoteworker import _Activity, _Namespace
from casfs.store import profile
from casfs.store.digests import object_key
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot


def _published(tmp_path: Path) -> tuple[Path, str]:
    root = SharedRoot.open(tmp_path / "root", create=True)
    put = root.objects.put_bytes(b"kernel")
    prof = root.objects.put_bytes(profile.encode([("k/a", 1)], 1))
    root.generations().publish("ns", [Entry("k/a", put.digest, put.size, 0o644, 1)],
                               node="n", options={"profile": prof.digest})
    return tmp_path / "root", prof.digest


def _opens(sp: _Namespace) -> list[str]:
    """The keys ``sp``'s backend reads from now on."""
    opened: list[str] = []
    real = sp.root.backend.open

    def counting(key: str) -> object:
        opened.append(key)
        return real(key)

    sp.root.backend.open = counting  # type: ignore[method-assign]
    return opened


def test_the_profile_is_read_while_the_parts_are(tmp_path: Path) -> None:
    path, digest = _published(tmp_path)
    sp = _Namespace({"root": str(path)}, "ns", _Activity())
    opened = _opens(sp)
    sp.locate(1)
    deadline = time.monotonic() + 5  # read during the round's locate, in a thread
    while object_key(digest) not in opened and time.monotonic() < deadline:
        time.sleep(0.01)
    assert object_key(digest) in opened, opened
    time.sleep(0.1)  # its bytes kept
    opened.clear()
    assert profile.decode(sp.root.objects.get_bytes(digest)) == ([("k/a", 1)], 1)
    assert opened == []  # publication's read of it: no request


def test_the_served_record_sent_by_the_mount_is_not_read(tmp_path: Path) -> None:
    path, _ = _published(tmp_path)
    mount = SharedRoot.open(path).generations()
    mount.record("ns", 1)
    sent = mount.known_record("ns", 1)
    assert sent is not None
    sp = _Namespace({"root": str(path)}, "ns", _Activity())
    opened = _opens(sp)
    sp.locate(1, sent.decode())
    assert sp.located == 1
    assert not [k for k in opened if "/generations/" in k], opened
    # A record that does not parse is read from the root instead, as without one.
    sp2 = _Namespace({"root": str(path)}, "ns", _Activity())
    sp2.locate(1, "{not json")
    assert sp2.located == 1
