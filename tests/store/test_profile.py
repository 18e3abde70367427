"""Access profiles: format, merge order and bounds, the recorder."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from casfs.promote.publisher import profile_options
from casfs.store import profile
from casfs.store.entry import Entry
from casfs.store.root import SharedRoot
from casfs.util.counters import Counters


def test_round_trip_and_bad_input() -> None:
    data = profile.encode([("a/b", 2), ("c", 1)], 3)
    assert profile.decode(data) == ([("a/b", 2), ("c", 1)], 3)
    for bad in (b"[]", b'{"casfs_profile": 2, "runs": 1, "paths": []}', b"not json"):
        with pytest.raises(ValueError):
            profile.decode(bad)
    # Invalid paths inside a profile are dropped, not trusted.
    paths, _ = profile.decode(b'{"casfs_profile":1,"runs":1,"paths":[["../x",1],["ok",1]]}')
    assert paths == [("ok", 1)]


def test_merge_orders_by_hits_then_newest_order(monkeypatch: pytest.MonkeyPatch) -> None:
    merged, runs = profile.merge([("old", 1), ("both", 1)], 1, ["new2", "both", "new1", "both"])
    assert runs == 2
    assert merged == [("both", 2), ("new2", 1), ("new1", 1), ("old", 1)]
    monkeypatch.setattr(profile, "MAX_PATHS", 2)
    merged, _ = profile.merge([("old", 1)], 1, ["a", "b", "c"])
    assert merged == [("a", 1), ("b", 1)]  # bounded: the coldest dropped


def test_recorder_keeps_first_opens_in_order() -> None:
    r = profile.Recorder(limit=3)
    for p in ("x", "y", "x", "z", "w"):
        r.opened(p)
    assert r.paths() == ["x", "y", "z"]
    assert r.unpublished()
    r.mark_published(3)
    assert not r.unpublished()
    many = profile.Recorder(limit=3)  # a batch of observed opens: the same answer
    many.opened("x")
    many.opened_many(["y", "x", "z", "w"])
    assert many.paths() == ["x", "y", "z"]


def test_a_recording_and_a_profile_are_bounded_in_bytes_too() -> None:
    """50,000 paths of 4 KiB made a 200 MB profile that no reader takes, and a publish
    request over the promotion worker's message bound (a review, 2026-12-06)."""
    long = ["/".join(["d" * 240] * 14 + [f"{i:05d}"]) for i in range(5000)]
    r = profile.Recorder()
    r.opened_many(long)
    kept = r.paths()
    assert 0 < len(kept) < len(long) and kept == long[:len(kept)]
    assert sum(profile.path_bytes(p) for p in kept) <= profile.MAX_PATH_BYTES
    r.opened("short")  # past the bound: nothing more, short or long
    assert r.paths() == kept
    merged, _ = profile.merge([], 0, long)
    data = profile.encode(merged, 1)
    assert len(data) <= profile.MAX_PATH_BYTES + 100 and len(merged) == len(kept)
    assert profile.decode(data)[0] == merged  # a profile readers take
    assert profile.path_bytes("é") == len('"\\u00e9"') + 10  # as JSON writes it


@pytest.mark.parametrize("bad", [b"9" * 4300, b"-1", b"NaN", b"1e400", b"2.5", b"true"])
def test_a_profile_with_a_count_past_any_run_is_refused(bad: bytes) -> None:
    """A 4300-digit "runs", plus the merge's 1, is past what json.dumps writes."""
    with pytest.raises(ValueError):
        profile.decode(b'{"casfs_profile":1,"runs":' + bad + b',"paths":[]}')
    hits = b'{"casfs_profile":1,"runs":1,"paths":[["a",' + bad + b'],["b",1]]}'
    if bad in (b"NaN", b"1e400"):  # not JSON numbers (jsonsafe): the whole profile goes
        with pytest.raises(ValueError):
            profile.decode(hits)
    else:  # a path with a bad count is dropped, like a bad path
        assert profile.decode(hits) == ([("b", 1)], 1)


@pytest.mark.expect_log(r"ns: ignoring the profile [0-9a-f]{64}: bad profile")
def test_a_publisher_ignores_a_profile_it_could_not_write_back(tmp_path: Path) -> None:
    """It raised ValueError out of profile_options: every publisher building on the
    record failed every round. Now the bad profile is ignored, a fresh one written."""
    root = SharedRoot.open(str(tmp_path / "root"), create=True)
    gens = root.generations()
    bad = root.objects.put_bytes(b'{"casfs_profile":1,"runs":' + b"9" * 4300
                                 + b',"paths":[["a.so",' + b"9" * 4300 + b"]]}")
    a = root.objects.put_bytes(b"A")
    seq = gens.publish("ns", [Entry("a.so", a.digest, 1, 0o644, 0)], node="n").seq
    base = dataclasses.replace(gens.record("ns", seq), options={"profile": bad.digest})
    out = profile_options(gens, "ns", ["a.so"], [], Counters(), base)
    assert profile.decode(root.objects.get_bytes(out["profile"])) == ([("a.so", 1)], 1)
