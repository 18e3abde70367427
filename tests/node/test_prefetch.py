"""Prefetch from access profiles: a publication names a profile, a fresh node fetches
the hot set in the background and reports warm-ready, prefetch hits and waste."""

from __future__ import annotations

from typing import Any

from waiting import wait_until

from casfs.store import maintenance, profile
from casfs.store.root import SharedRoot

from .test_two_nodes import published


def test_profile_published_and_prefetched(cluster: dict[str, Any]) -> None:
    a, b = cluster["a"], cluster["b"]
    w = a.mount()
    for i in range(6):
        (w.cfg.mountpoint / f"K{i}").mkdir()
        (w.cfg.mountpoint / f"K{i}" / "k.bin").write_bytes(b"%d" % i * 1000)
    wait_until(lambda: a.ask(w, "publish") and len(published(cluster["root"])) >= 6,
               "6 files published", interval=0.2)
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
    wait_until(lambda: b.ask(w, "stats").get("warm_ready_s") is not None, "warm-ready",
               interval=0.1)
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


def test_a_hit_is_counted_once_per_object_single_or_batched() -> None:
    from casfs.index.tree import DictLowerTree
    from casfs.node.prefetch import Prefetcher
    from casfs.util.counters import Counters

    c = Counters()
    p = Prefetcher(None, DictLowerTree(), c)  # type: ignore[arg-type]  # no fetch here
    p._prefetched.update({"d1": 1, "d2": 2})  # what the workers fetched
    p.opened("d1")
    p.opened_many(["d1", "d2", "d3", "d2"])  # overlay's batch of recorded opens
    p.opened_many(["d2"])
    assert c.get("prefetch_hits") == 2
