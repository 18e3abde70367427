"""Read-ahead on a miss (casfs.node.readahead), through real mounts on a fresh node.

A job's first open of a lower file fetches the rest of its directory into the
local object cache in the background; every neighbour is verified before it
is served, so a damaged one is a miss for the job, never wrong bytes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from casfs.store.objects import object_key
from casfs.store.packs import pack_key, parse_location
from tests.faults.conftest import corrupt

from .test_two_nodes import published, seed

pytestmark = pytest.mark.fuse

FILES = {**{f"k1/f{i}": bytes([65 + i]) * (2000 + 37 * i) for i in range(6)},
         **{f"k2/g{i}": bytes([97 + i]) * (1500 + i) for i in range(3)}}


def _local(state: Path, digest: str) -> bool:
    return (state / "objects" / digest[:2] / digest[2:]).is_file()


def test_a_miss_brings_its_directory_local(cluster: dict[str, Any], tmp_path: Path) -> None:
    seed(cluster["root"], FILES, tmp=tmp_path)
    snap = published(cluster["root"])
    b = cluster["b"]
    w = b.mount(readahead=True)
    mp = w.cfg.mountpoint
    assert (mp / "k1/f2").read_bytes() == FILES["k1/f2"]
    siblings = [snap[f"k1/f{i}"].digest for i in range(6) if i != 2]
    wait_until(lambda: all(_local(b.state, d) for d in siblings), "the directory read ahead")
    c = wait_until(lambda: (c := b.ask(w, "stats")["counters"]).get("readahead_files") == 5 and c,
              "the read-ahead counters")
    assert c["readahead_dirs"] == 1
    assert not any(_local(b.state, snap[f"k2/g{i}"].digest) for i in range(3))  # another dir
    fetched = c["objects_fetched"]
    assert fetched == 6
    for rel in (f"k1/f{i}" for i in range(6)):
        assert (mp / rel).read_bytes() == FILES[rel]
    c = b.ask(w, "stats")["counters"]
    assert c["objects_fetched"] == fetched  # the neighbours' opens fetched nothing
    assert c.get("cache_verified", 0) == 0  # trusted as the fetch worker verified them
    assert (mp / "k2/g1").read_bytes() == FILES["k2/g1"]  # the next directory's miss
    wait_until(lambda: b.ask(w, "stats")["counters"].get("readahead_files") == 7, "k2 read ahead")


@pytest.mark.expect_log(
    r"rejected object: object \w+: ",
    r"unavailable, serving a miss: object \w+: ",
)
@pytest.mark.parametrize("kind", ["bitflip", "other-object"])
def test_a_damaged_neighbour_is_never_served(cluster: dict[str, Any], tmp_path: Path,
                                             kind: str) -> None:
    seed(cluster["root"], FILES, tmp=tmp_path)
    snap = published(cluster["root"])
    root = cluster["root"]
    bad = snap["k1/f3"].digest
    corrupt(root / object_key(bad), kind, root / object_key(snap["k2/g0"].digest))
    b = cluster["b"]
    w = b.mount(readahead=True)
    mp = w.cfg.mountpoint
    assert (mp / "k1/f0").read_bytes() == FILES["k1/f0"]
    wait_until(lambda: b.ask(w, "stats")["counters"].get("readahead_errors") == 1,
          "the read-ahead's rejection")
    assert not _local(b.state, bad)  # nothing of it reached the cache
    res = subprocess.run(["cat", str(mp / "k1/f3")], capture_output=True, timeout=20,
                         check=False)
    assert res.returncode != 0 and res.stdout == b"" and b"No such file" in res.stderr
    for i in (1, 2, 4, 5):
        assert (mp / f"k1/f{i}").read_bytes() == FILES[f"k1/f{i}"]
    assert b.ask(w, "stats")["counters"]["rejections"] >= 2  # read-ahead's, the job's own


def test_read_ahead_off(cluster: dict[str, Any], tmp_path: Path) -> None:
    """``readahead = false``: a miss fetches only what the job opens."""
    seed(cluster["root"], FILES, tmp=tmp_path)
    b = cluster["b"]
    w = b.mount(readahead=False)
    assert (w.cfg.mountpoint / "k1/f2").read_bytes() == FILES["k1/f2"]
    c = b.ask(w, "stats")["counters"]
    assert c["objects_fetched"] == 1 and "readahead_dirs" not in c


def _seed_packed(root: Path, tmp_path: Path, files: dict[str, bytes] = FILES) -> None:
    src = tmp_path / "packed-src"
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "--root", str(root),
                        "--state-dir", str(tmp_path / "seed-state"), "import", str(src), "-n",
                        "testns", "--packs"], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr


@pytest.mark.expect_log(
    r"rejected object: object \w+: ",
    r"unavailable, serving a miss: object \w+: ",
)
def test_a_packs_neighbours_come_in_one_read_and_a_damaged_one_is_a_miss(
        cluster: dict[str, Any], tmp_path: Path) -> None:
    root = cluster["root"]
    _seed_packed(root, tmp_path)
    snap = published(root)
    locs = {rel: parse_location((e.extras or {}).get("pack")) for rel, e in snap.items()}
    assert all(locs.values()), "the seed's small files are packed"
    pack, off, _ = locs["k1/f4"]  # flip a byte of one member inside the pack
    path = root / pack_key(pack)
    data = bytearray(path.read_bytes())
    data[off + 20] ^= 0xFF
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    b = cluster["b"]
    w = b.mount(readahead=True)
    mp = w.cfg.mountpoint
    assert (mp / "k1/f0").read_bytes() == FILES["k1/f0"]
    c = wait_until(lambda: (c := b.ask(w, "stats")["counters"]).get("readahead_files") == 4
                   and c.get("readahead_errors") == 1 and c, "the pack's neighbours")
    assert c["pack_span_reads"] >= 1  # the directory's members in one range read
    for i in (1, 2, 3, 5):
        assert _local(b.state, snap[f"k1/f{i}"].digest)
    assert not _local(b.state, snap["k1/f4"].digest)
    fetched = c["objects_fetched"]
    for i in (1, 2, 3, 5):
        assert (mp / f"k1/f{i}").read_bytes() == FILES[f"k1/f{i}"]
    assert b.ask(w, "stats")["counters"]["objects_fetched"] == fetched  # all local already
    res = subprocess.run(["cat", str(mp / "k1/f4")], capture_output=True, timeout=20,
                         check=False)
    assert res.returncode != 0 and res.stdout == b"" and b"No such file" in res.stderr


def test_a_read_member_brings_its_whole_pack(cluster: dict[str, Any], tmp_path: Path) -> None:
    """The other members of the pack (other directories: promoted together) come in one
    read of the whole pack, each verified, trusted at their first open."""
    root = cluster["root"]
    _seed_packed(root, tmp_path)
    snap = published(root)
    packs = {parse_location((e.extras or {}).get("pack")) for e in snap.values()}
    assert len({loc[0] for loc in packs if loc}) == 1, "one pack holds the seed"
    b = cluster["b"]
    w = b.mount(readahead=True)
    mp = w.cfg.mountpoint
    assert (mp / "k1/f0").read_bytes() == FILES["k1/f0"]
    others = [e.digest for rel, e in snap.items() if rel.startswith("k2/")]
    wait_until(lambda: all(_local(b.state, d) for d in others), "the pack's other directory")
    c = wait_until(lambda: (c := b.ask(w, "stats")["counters"]).get("readahead_files") == 8
                   and c, "the read-ahead counters")
    assert c["readahead_packs"] == 1 and c["pack_whole_reads"] == 1
    fetched = c["objects_fetched"]
    for rel, data in FILES.items():
        assert (mp / rel).read_bytes() == data
    c = b.ask(w, "stats")["counters"]
    assert c["objects_fetched"] == fetched and c.get("cache_verified", 0) == 0


def test_a_loose_miss_brings_the_pack_of_its_directory(cluster: dict[str, Any],
                                                       tmp_path: Path) -> None:
    """The missed file is loose (too large for a pack, or a Triton group file), its
    neighbours are packed: their pack, which holds another directory too, comes whole."""
    root = cluster["root"]
    big = bytes(range(256)) * 400  # 100 KB: above SMALL_OBJECT, stored loose
    _seed_packed(root, tmp_path, {**FILES, "k1/big": big})
    snap = published(root)
    assert not (snap["k1/big"].extras or {}).get("pack")
    b = cluster["b"]
    w = b.mount(readahead=True)
    mp = w.cfg.mountpoint
    assert (mp / "k1/big").read_bytes() == big
    others = [e.digest for rel, e in snap.items() if rel.startswith("k2/")]
    wait_until(lambda: all(_local(b.state, d) for d in others), "the pack's other directory")
    assert b.ask(w, "stats")["counters"]["readahead_packs"] == 1
    for rel in ("k2/g0", "k2/g2", "k1/f5"):
        assert (mp / rel).read_bytes() == FILES[rel]
