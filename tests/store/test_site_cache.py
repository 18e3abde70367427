"""Reads of objects and packs through a site cache (``?read_cache=URL``, casfs.store.sitecache).

A real nginx ``proxy_cache`` (tests/sitecache.py) in front of SeaweedFS, with
tests/netem.py's proxy between them counting what reaches the root. Several
fresh handles on one root (each what a fresh node opens) read objects and pack
members: the root sees each object and pack GET once, from the cache, and the
nodes' own requests (records, marker, HEADs, LISTs, PUTs) stay signed and go
straight to the endpoint. A cache that is down, refuses, or serves garbage
costs at most a miss, never wrong bytes.
"""

from __future__ import annotations

import http.server
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sitecache import BUCKET, Site, open_site, use_site

from casfs.errors import ConfigError, CorruptObjectError, ObjectMissingError
from casfs.store import sitecache
from casfs.store.packs import PackWriter
from casfs.store.root import SharedRoot
from casfs.store.sitecache import SiteCachedBackend
from casfs.util.location import S3Location, parse_location

pytestmark = pytest.mark.slow


def test_the_option_is_parsed_checked_and_kept() -> None:
    loc = parse_location("s3://casfs-b/root?endpoint=http://e:1&read_cache=http://cache:3128")
    assert loc == S3Location("casfs-b", "root", "http://e:1", "", "http://cache:3128")
    assert parse_location(str(loc)) == loc  # what a mount process gets through its pipe
    assert parse_location("s3://casfs-b/root") == S3Location("casfs-b", "root")  # off
    for bad, words in (("read_cache=http://k:s@cache:1", "credentials"),
                       ("read_cache=ftp://cache", "http")):
        with pytest.raises(ConfigError, match=words):
            parse_location(f"s3://casfs-b/root?{bad}")


def test_casfsd_takes_it_in_its_store_root(tmp_path: Path) -> None:
    from casfs.daemon import config as dconfig
    from casfs.node.worker import config_from_json, config_to_json

    conf = tmp_path / "casfs.toml"
    conf.write_text('[store]\nroot = "s3://casfs-b/team?read_cache=http://cache:3128"\n'
                    'endpoint = "http://127.0.0.1:8333"\n'
                    f'[node]\nstate_dir = "{tmp_path}/state"\n'
                    '[[mounts]]\nname = "kern"\nnamespace = "kern-ns"\n')
    cfg = dconfig.load(conf)
    assert cfg.root == S3Location("casfs-b", "team", "http://127.0.0.1:8333", "",
                                  "http://cache:3128")
    (m,) = cfg.mount_configs()
    assert config_from_json(config_to_json(m)).root == cfg.root  # reaches the mount process


def test_only_object_and_pack_keys_are_cacheable() -> None:
    d = "ab" + "c" * 62
    assert sitecache.cacheable(f"objects/ab/{d[2:]}")
    assert sitecache.cacheable(f"packs/ab/{d[2:]}")
    for key in ("casfs.json", "namespaces/n/generations/000000000001", "repacked/ab/cd",
                "gc/marks/1-2", "namespaces/n/heads/x", "probes/x/0"):
        assert not sitecache.cacheable(key)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    with open_site(tmp_path_factory.mktemp("site")) as s:
        yield s


@pytest.fixture
def env(site: Site, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_site(site, monkeypatch, tmp_path)


def _fill(url: str, n_small: int = 60, n_large: int = 3) -> tuple[dict[str, bytes], dict[
        str, list[object]]]:
    """Small objects in packs and a few loose ones: {digest: bytes}, {digest: pack location}."""
    root = SharedRoot.open(url, create=True)
    data = {}
    pw = PackWriter(root.objects, target=64 << 10)
    for i in range(n_small):
        b = os.urandom(3000) + f"small {i}".encode() * 200
        data[pw.add(b)] = b
    locs = {d: list(loc) for d, loc in pw.flush().items()}
    for i in range(n_large):
        b = os.urandom(1 << 20) + f"large {i}".encode()  # over STREAM_CHUNK: streamed
        data[root.objects.put_bytes(b).digest] = b
    return data, locs


def _read_all(url: str, data: dict[str, bytes], locs: dict[str, list[object]]) -> SharedRoot:
    """What a fresh node does: open the root, read every object (members with one range
    read per pack where it can, as the prefetch does), check every byte."""
    root = SharedRoot.open(url)
    for d, loc in locs.items():
        root.objects.locate(d, loc)
    wanted = {d: root.objects.locations[d] for d in locs}
    stored = root.objects.read_members(wanted, 8 << 20)
    for d, b in data.items():
        if d in stored:
            assert root.objects.decode_member(d, len(b), stored[d]) == b
        else:
            assert root.objects.get_bytes(d, len(b)) == b
    return root


def test_fresh_nodes_read_objects_and_packs_from_the_cache(site: Site, env: None) -> None:
    prefix = site.new_root()
    url = site.url(prefix)
    data, locs = _fill(url)
    packs = {str(loc[0]) for loc in locs.values()}
    assert len(packs) >= 3
    assert site.cache is not None
    site.net.reset_counts()
    for _ in range(3):
        root = _read_all(url, data, locs)
        assert isinstance(root.backend, SiteCachedBackend)
    reads = site.root_reads(prefix)
    # Each pack and each loose object reached the root once (the cache's fill), not once
    # per node; without the cache each of the 3 nodes would GET every one of them.
    assert set(reads) == {f"packs/{p[:2]}/{p[2:]}" for p in packs} | {
        f"objects/{d[:2]}/{d[2:]}" for d in data if d not in locs}
    assert set(reads.values()) == {1}, reads
    def hits(st: list[tuple[str, str, int, str]]) -> list[tuple[str, str, int, str]]:
        return [s for s in st if prefix in s[1] and s[3] == "HIT"]

    statuses = site.cache.statuses_when(lambda st: len(hits(st)) >= 2 * len(reads))
    # nodes 2 and 3 were served from the cache
    assert len(hits(statuses)) >= 2 * len(reads), [s for s in statuses if s[3] != "HIT"]
    # the nodes' own requests: the marker, signed, never through the cache
    assert not [s for s in site.cache.statuses() if "casfs.json" in s[1]]


def test_without_the_option_every_node_reads_the_root(site: Site, env: None) -> None:
    prefix = site.new_root()
    data, locs = _fill(site.url(prefix, cache=False))
    site.net.reset_counts()
    for _ in range(2):
        _read_all(site.url(prefix, cache=False), data, locs)
    reads = site.root_reads(prefix)
    assert reads and set(reads.values()) == {2}  # the comparison the test above rests on


def test_records_and_listings_stay_signed_and_fresh(site: Site, env: None) -> None:
    """Publication through a root with a cache works, and a reader sees each new
    generation at once: records, HEADs and LISTs never pass through the cache."""
    from casfs.store.entry import Entry

    prefix = site.new_root()
    url = site.url(prefix)
    SharedRoot.open(url, create=True)
    gens = SharedRoot.open(url).generations()
    reader = SharedRoot.open(url).generations()
    for i in range(3):
        obj = gens.root.objects.put_bytes(f"file {i}".encode() * 50)
        e = Entry(path=f"f{i}", digest=obj.digest, size=obj.size, mode=0o644, mtime_ns=1)
        gens.publish("ns", [e], node="writer")
        snap = reader.entries("ns")
        assert set(snap.entries) == {f"f{j}" for j in range(i + 1)}
        assert reader.root.objects.get_bytes(obj.digest) == f"file {i}".encode() * 50
    assert site.cache is not None
    through = {s[1].split(f"/{prefix}/", 1)[-1].split("/")[0]
               for s in site.cache.statuses() if f"/{prefix}/" in s[1]}
    assert through == {"objects"}  # manifests and this file's objects: nothing else


def test_the_bucket_lets_anonymous_callers_read_only_objects_and_packs(
        site: Site, env: None) -> None:
    prefix = site.new_root()
    data, locs = _fill(site.url(prefix), n_small=4, n_large=1)
    loose = next(d for d in data if d not in locs)
    pack = str(next(iter(locs.values()))[0])
    ep = f"{site.s3.endpoint}/{BUCKET}/{prefix}"

    def status(path: str, method: str = "GET") -> int:
        req = urllib.request.Request(f"{ep}/{path}" if path else ep, method=method,
                                     data=b"x" if method == "PUT" else None)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    assert status(f"objects/{loose[:2]}/{loose[2:]}") == 200
    assert status(f"packs/{pack[:2]}/{pack[2:]}") == 200
    assert status("casfs.json") == 403
    assert status("namespaces/ns/generations/000000000001") in (403, 404)
    assert status(f"objects/{loose[:2]}/{loose[2:]}", "PUT") == 403
    assert status(f"objects/{loose[:2]}/{loose[2:]}", "DELETE") == 403
    req = f"{site.s3.endpoint}/{BUCKET}?list-type=2&prefix={prefix}/"
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(req, timeout=10)
    assert ei.value.code == 403
    # another prefix of the bucket (no grant): nothing
    assert status("../other/objects/ab/" + "c" * 62) in (400, 403)


def test_a_cache_that_is_down_costs_no_miss(site: Site, env: None, tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens once closed
    prefix = site.new_root()
    data, locs = _fill(site.url(prefix), n_small=10, n_large=1)
    url = f"{site.url(prefix, cache=False)}&read_cache={dead}"
    root = _read_all(url, data, locs)  # every byte right
    # one failed attempt, then the cache rests (COOLDOWN_S) instead of failing each read
    assert root.counters.get("site_cache_failures") == 1
    assert root.counters.get("site_cache_reads") == 0


class _Garbage(http.server.BaseHTTPRequestHandler):
    """A 'cache' answering every GET with wrong bytes of the right length: ``junk``
    (random bytes) or ``rot`` (the real bytes, fetched unsigned from the root, with one
    payload byte flipped: a valid header, a wrong object)."""

    mode = "junk"
    upstream = ""

    def do_GET(self) -> None:
        with urllib.request.urlopen(self.upstream + self.path, timeout=10) as r:
            real = r.read()
        if self.mode == "junk":
            body = os.urandom(len(real))
        else:
            body = bytearray(real)
            for i in range(40, len(body), 997):  # past the first member's header
                body[i] ^= 0x5A
        rng = self.headers.get("Range")
        status = 200
        if rng:
            lo, hi = (int(x) for x in rng.split("=")[1].split("-"))
            body, status = body[lo:hi + 1], 206
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT")
        self.send_header("ETag", '"x"')
        if rng:
            self.send_header("Content-Range", f"bytes {lo}-{lo + len(body) - 1}/{len(real)}")
        self.end_headers()
        self.wfile.write(bytes(body))

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("mode", ["junk", "rot"])
@pytest.mark.expect_log(r"rejected object", r"site cache .* failed verification")
def test_a_cache_serving_garbage_never_yields_wrong_bytes(
        site: Site, env: None, mode: str) -> None:
    prefix = site.new_root()
    data, locs = _fill(site.url(prefix), n_small=30, n_large=2)
    handler = type("H", (_Garbage,), {"mode": mode, "upstream": site.s3.endpoint})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"{site.url(prefix, cache=False)}&read_cache=http://127.0.0.1:{srv.server_port}"
        root = SharedRoot.open(url)
        for d, loc in locs.items():
            root.objects.locate(d, loc)
        right = missed = 0
        for _ in range(2):  # a job reading everything, then reading again what it missed
            for d, b in data.items():
                try:
                    got = root.objects.get_bytes(d, len(b))
                except (CorruptObjectError, ObjectMissingError):
                    missed += 1
                    continue
                assert got == b  # never wrong bytes
                right += 1
        assert right >= len(data)  # every object read right at last
        c = root.counters
        if mode == "junk":  # no object header: refused before any decoding, read at the root
            assert missed == 0 and c.get("rejections") == 0
            assert c.get("site_cache_refused") >= 1 and c.get("site_cache_reads") == 0
        else:  # a valid header, a wrong object: rejected by its hash, then the cache rests
            assert c.get("rejections") >= 1 and c.get("site_cache_distrusted") >= 1
            assert missed <= 1
    finally:
        srv.shutdown()
        srv.server_close()
