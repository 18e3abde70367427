"""Fresh nodes behind a site cache: real ``casfs run``s, a real nginx, SeaweedFS (issue 23).

Every node's root is ``s3://...?endpoint=<root>&read_cache=<nginx>``
(casfs.store.sitecache). tests/sitecache.py's Site puts tests/netem.py's proxy
between nginx and SeaweedFS and points the nodes' signed requests at it too,
so it sees everything that reaches the root. Shown here:

- three fresh nodes (each its own state dir and mounts, a real ``casfs run``
  whose job reads and checks every file of a namespace promoted into packs):
  the first one's pack GETs reach the root (through the cache, which fills),
  the next two's never do: they are served from the cache;
- records and listings never pass through the cache: after another node
  publishes a new generation, a fresh node and an old one see it at once;
- publication through such a root works as without the cache;
- the cache serving damaged bytes (its files on disk corrupted) costs the
  job at most a miss, never a wrong byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sitecache import Site, open_site, use_site

from casfs.store.root import SharedRoot

from .conftest import require_fuse

pytestmark = [pytest.mark.fuse, pytest.mark.slow]

KERNELS = 40  # x 8 files, as Triton writes a kernel: 320 files

GEN = r"""
import json, os, random
WORDS = ["tt.load", "tt.store", "arith.addf", "%0", "%1", "=", "ld.global.f32", "mov.u32"]
def files(prefix, n):
    out = {}
    for i in range(n):
        key = f"{prefix}{i:05d}" + "x" * 40
        rng = random.Random(f"{prefix}{i}")
        for ext in ("source", "ttir", "ttgir", "llir", "ptx", "cubin", "json"):
            size = rng.randint(800, 6000)
            text = " ".join(rng.choice(WORDS) for _ in range(size // 6))[:size]
            name = f"k.{ext}"
            out[f"{key}/{name}"] = (json.dumps({"key": key, "text": text}) if ext == "json"
                                    else f"// {key}/{name}\n{text}\n").encode()
    return out
"""

WRITE_JOB = GEN + r"""
import sys
d = os.environ["TRITON_CACHE_DIR"]
groups = {}
for rel, data in files(sys.argv[2], int(sys.argv[1])).items():
    path = os.path.join(d, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)
    groups.setdefault(os.path.dirname(path), {})[os.path.basename(path)] = path
for kdir, children in groups.items():  # the group file last, naming its children
    with open(os.path.join(kdir, "tmp.grp"), "w") as f:
        json.dump({"child_paths": children}, f)
    os.replace(os.path.join(kdir, "tmp.grp"), os.path.join(kdir, "__grp__k.json"))
"""

# Opens every path named in argv[1] and prints its sha256, or the errno name it got.
READ_JOB = r"""
import errno, hashlib, json, os, sys
d = os.environ["TRITON_CACHE_DIR"]
out = {}
for rel in json.load(open(sys.argv[1])):
    try:
        with open(os.path.join(d, rel), "rb") as f:
            out[rel] = hashlib.sha256(f.read()).hexdigest()
    except OSError as e:
        out[rel] = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(out))
"""


def _expected(prefix: str, n: int) -> dict[str, str]:
    ns: dict[str, Any] = {}
    exec(GEN, ns)  # the writer's own generator
    return {rel: hashlib.sha256(b).hexdigest() for rel, b in ns["files"](prefix, n).items()}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    with open_site(tmp_path_factory.mktemp("site")) as s:
        yield s


@pytest.fixture
def env(site: Site, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_site(site, monkeypatch, tmp_path)


def _init(site: Site) -> tuple[str, str]:
    """A new root on the site (``casfs init``, as docs say for an S3 root): (prefix, URL)."""
    prefix = site.new_root()
    url = site.url(prefix)
    SharedRoot.open(url, create=True)
    return prefix, url


def _env(tmp: Path, node: str, url: str, site: Site) -> dict[str, str]:
    env = dict(os.environ, **site.env())
    env.pop("TRITON_CACHE_DIR", None)
    env.update(CASFS_ROOT=url, CASFS_STATE_DIR=str(tmp / node / "state"),
               CASFS_SERVE_BASE=str(tmp / node / "serve"),
               CASFS_MOUNT_BASE=str(tmp / node / "mnt"),
               CASFS_SOCKET=str(tmp / "no-casfsd" / "casfsd.sock"),
               AWS_CONFIG_FILE=str(tmp / "no-aws-config"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-aws-credentials"))
    return env


def _run(tmp: Path, node: str, url: str, site: Site, *job: str) -> str:
    require_fuse()
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "triton",
                        "--namespace", "site", "--stable-after", "0.2",
                        # every byte is checked below: an open past the default 10 s on
                        # a loaded CI machine would be a miss (ENOENT), not this test's point
                        "--fetch-timeout", "60", "--", *job],
                       env=_env(tmp, node, url, site), capture_output=True, text=True,
                       timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-4000:]
    return r.stdout


def _write(tmp: Path, node: str, url: str, site: Site, prefix: str) -> None:
    _run(tmp, node, url, site, sys.executable, "-c", WRITE_JOB, str(KERNELS), prefix)


def _read(tmp: Path, node: str, url: str, site: Site, paths: list[str]) -> dict[str, str]:
    listing = tmp / f"{node}-paths.json"
    listing.write_text(json.dumps(paths))
    out = _run(tmp, node, url, site, sys.executable, "-c", READ_JOB, str(listing))
    return dict(json.loads(out.strip().splitlines()[-1]))


def test_fresh_nodes_are_served_by_the_site_cache(site: Site, env: None, tmp_path: Path
                                                  ) -> None:
    prefix, url = _init(site)
    _write(tmp_path, "writer", url, site, "A")  # publication through the cached root
    want = _expected("A", KERNELS)
    paths = sorted(want)
    assert site.cache is not None

    per_node = []
    for node in ("n1", "n2", "n3"):
        site.net.reset_counts()
        got = _read(tmp_path, node, url, site, paths)
        assert got == want  # every byte right, no miss
        per_node.append(site.root_reads(prefix))
    first, second, third = per_node
    packs = [k for k in first if k.startswith("packs/")]
    assert packs  # promotion wrote packs; the first node's reads filled the cache
    assert all(n == 1 for n in first.values()), first  # once each, however many ranges
    # The next fresh nodes read the same packs and the root never saw them: without
    # the cache each node GETs every pack (tests/store/test_site_cache.py shows it).
    assert second == {} and third == {}, (second, third)
    def hits(st: list[tuple[str, str, int, str]]) -> list[tuple[str, str, int, str]]:
        return [s for s in st if s[3] == "HIT" and "/packs/" in s[1]]

    assert len(hits(site.cache.statuses_when(lambda st: len(hits(st)) >= 2 * len(packs)))
               ) >= 2 * len(packs)
    # nothing but objects and packs ever passed through the cache
    assert {s[1].split(f"/{prefix}/", 1)[1].split("/")[0]
            for s in site.cache.statuses() if f"/{prefix}/" in s[1]} <= {"objects", "packs"}

    # Records and listings are never served from the cache: another node publishes a
    # new generation, and a fresh node and an old one see it at once.
    _write(tmp_path, "writer2", url, site, "B")
    want.update(_expected("B", KERNELS))
    paths = sorted(want)
    assert _read(tmp_path, "n4", url, site, paths) == want
    assert _read(tmp_path, "n1", url, site, paths) == want


def _corrupt_cached_bodies(files: list[Path]) -> int:
    """Flip bytes in the body of each of nginx's cache files (past its key and the
    upstream's response head), as a damaged cache disk would; how many changed."""
    n = 0
    for f in files:
        raw = bytearray(f.read_bytes())
        key = raw.find(b"\nKEY: ")
        head_end = raw.find(b"\r\n\r\n", key)
        if key < 0 or head_end < 0:
            continue
        body = head_end + 4
        for i in range(body + 40, len(raw), 1500):  # member payloads, some headers
            raw[i] ^= 0x5A
        f.write_bytes(bytes(raw))
        n += 1
    return n


@pytest.mark.expect_log(r"rejected object", r"site cache .* failed verification",
                        r"reading its loose copy")
def test_a_cache_serving_damaged_bytes_costs_at_most_a_miss(site: Site, env: None,
                                                             tmp_path: Path) -> None:
    prefix, url = _init(site)
    _write(tmp_path, "writer", url, site, "C")
    want = _expected("C", KERNELS)
    paths = sorted(want)
    assert _read(tmp_path, "n1", url, site, paths) == want  # fills the cache
    assert site.cache is not None
    mine = f"/{prefix}/".encode()
    damaged = [f for f in site.cache.cached_files() if mine in f.read_bytes()[:2048]]
    assert damaged and _corrupt_cached_bodies(damaged) == len(damaged)
    served = len(site.cache.statuses())

    got = _read(tmp_path, "n2", url, site, paths)
    assert site.cache.statuses()[served:], "the damaged cache served nothing"
    wrong = {p for p, h in got.items() if h != want[p] and h != "ENOENT"}
    assert not wrong  # correct bytes or a miss, never wrong bytes
    missed = [p for p, h in got.items() if h == "ENOENT"]
    print(f"damaged cache: {len(paths) - len(missed)} of {len(paths)} files right")
    assert len(missed) < len(paths) // 10, missed  # the root answered what the cache spoiled
    tap = Path(os.environ["CASFS_LOG_TAP"])
    assert any("rejected object" in f.read_text() for f in tap.glob("*.log"))
    # and a node reading again gets every byte
    assert _read(tmp_path, "n2", url, site, paths) == want
