from __future__ import annotations

import pytest

from casfs.errors import IndexError_
from casfs.index import keyspace as ks


def test_lower_value_round_trip() -> None:
    raw = bytes(range(32))
    packed = ks.pack_lower(ks.KIND_FILE, raw, 2**40, 0o755, -5, 2**63)
    assert ks.unpack_lower(packed) == (ks.KIND_FILE, raw, 2**40, 0o755, -5, 2**63)


def test_promoted_value_round_trip_keeps_path() -> None:
    raw = b"\xab" * 32
    path = "dir/ünïcode name\udcff.bin"  # surrogate-escaped non-UTF-8 byte survives
    packed = ks.pack_promoted(ks.STATE_PUBLISHED, raw, 7, 0o644, 123, 9, path)
    assert ks.unpack_promoted(packed) == (ks.STATE_PUBLISHED, raw, 7, 0o644, 123, 9, path)


def test_lower_key_layout_and_children_prefix() -> None:
    ns = ks.check_name("triton-abc")
    assert ks.lower_key(ns, "a/b/c.json") == b"triton-abc\0a/b\0c.json"
    assert ks.lower_key(ns, "top") == b"triton-abc\0\0top"
    assert ks.lower_key(ns, "a/b/c.json").startswith(ks.lower_dir_prefix(ns, "a/b"))
    # the NUL terminator keeps "a/b" from matching children of "a/bc"
    assert not ks.lower_key(ns, "a/bc/x").startswith(ks.lower_dir_prefix(ns, "a/b"))


def test_long_paths_fit_lmdb_keys() -> None:
    ns = ks.check_name("n" * ks.NAME_MAX_BYTES)
    long_dir = "/".join(["d" * 200] * 19)  # ~3.8 KB
    key = ks.lower_key(ns, long_dir + "/" + "f" * 255)
    assert len(key) <= 511
    assert ks.lower_key(ns, long_dir + "/x") != ks.lower_key(ns, long_dir + "y/x")
    pkey = ks.promoted_key(ns, long_dir + "/" + "f" * 255)
    assert len(pkey) <= 511


@pytest.mark.parametrize("bad", ["", "a\0b", "x" * (ks.NAME_MAX_BYTES + 1)])
def test_bad_names_refused(bad: str) -> None:
    with pytest.raises(IndexError_):
        ks.check_name(bad)


def test_digest_round_trip_and_refusal() -> None:
    d = "0f" * 32
    assert ks.raw_to_digest(ks.digest_to_raw(d)) == d
    for bad in ("zz" * 32, "ab" * 31, ""):
        with pytest.raises(IndexError_):
            ks.digest_to_raw(bad)


def test_lru_key_orders_by_time() -> None:
    a = ks.lru_key(5, b"\xff" * 32)
    b = ks.lru_key(256, b"\x00" * 32)
    assert a < b
    assert ks.unpack_lru_key(b) == (256, b"\x00" * 32)


def test_json_round_trip_and_non_object_refused() -> None:
    assert ks.unpack_json(ks.pack_json({"seq": 3, "deltas": ["a"]})) == {"seq": 3, "deltas": ["a"]}
    with pytest.raises(IndexError_):
        ks.unpack_json(b"[1]")
