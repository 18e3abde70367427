"""Prefetch from access profiles: a publication names a profile, a fresh node fetches
the hot set in the background and reports warm-ready, prefetch hits and waste."""

from __future__ import annotations

import time
from typing import Any

from casfs.store import maintenance, profile
from casfs.store.root import SharedRoot

from .test_two_nodes import published


def test_profile_published_and_prefetched(cluster: dict[str, Any]) -> None:
    a, b = cluster["a"], cluster["b"]
    w = a.mount()
    for i in range(6):
        (w.cfg.mountpoint / f"K{i}").mkdir()
        (w.cfg.mountpoint / f"K{i}" / "k.bin").write_bytes(b"%d" % i * 1000)
    deadline = time.monotonic() + 20
    while len(published(cluster["root"])) < 6:
        assert time.monotonic() < deadline
        a.ask(w, "publish")
        time.sleep(0.2)
    a.stop(w)
    gens = SharedRoot.open(cluster["root"]).generations()
    rec = gens.latest("testns")
    assert rec is not None and isinstance(rec.options.get("profile"), str)
    objs = SharedRoot.open(cluster["root"]).objects
    paths, runs = profile.decode(objs.get_bytes(rec.options["profile"]))
    assert {p for p, _ in paths} == {f"K{i}/k.bin" for i in range(6)} and runs >= 1
    for _ in range(2):  # mark, then sweep: the profile is kept with its record
        maintenance.gc(SharedRoot.open(cluster["root"]), grace=0)
    assert profile.decode(objs.get_bytes(rec.options["profile"]))[0] == paths

    # A fresh node: the hot set arrives without any job opening it.
    w = b.mount()
    deadline = time.monotonic() + 20
    while b.ask(w, "stats").get("warm_ready_s") is None:
        assert time.monotonic() < deadline, "never warm-ready"
        time.sleep(0.1)
    c = b.ask(w, "stats")["counters"]
    assert c["prefetched_files"] == 6
    assert (w.cfg.mountpoint / "K2" / "k.bin").read_bytes() == b"2" * 1000
    assert (w.cfg.mountpoint / "K3" / "k.bin").read_bytes() == b"3" * 1000
    c = b.ask(w, "stats")["counters"]
    assert c["prefetch_hits"] == 2
    assert c["objects_fetched"] == 6  # the job's opens fetched nothing more
    final = b.stop(w)
    assert final is not None
    assert final["counters"]["prefetch_wasted_bytes"] == 4 * 1000
