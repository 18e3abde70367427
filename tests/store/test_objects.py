"""Object format, codec choice, streaming, and rejection of every kind of damage."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import blake3
import pytest
import zstandard

from casfs.errors import CorruptObjectError, ObjectMissingError
from casfs.store.objects import HEADER_SIZE, IN_MEMORY_LIMIT, object_key
from casfs.store.root import SharedRoot


def compiler_text(n_kernels: int = 40) -> bytes:
    """Text shaped like Inductor's generated C++ and Python wrappers."""
    out = []
    for k in range(n_kernels):
        out.append(
            f'#include "/tmp/torchinductor_root/pi/cpicxudqmdsjh5cm4klbtbrvy.h"\n'
            f'extern "C"  void kernel_{k}(const float* in_ptr0, const float* in_ptr1,'
            f" float* out_ptr0)\n{{\n"
            f"    #pragma omp parallel num_threads(2)\n    {{\n"
            f"        for(int64_t x0=static_cast<int64_t>(0L);"
            f" x0<static_cast<int64_t>({16 * k + 16}L);"
            f" x0+=static_cast<int64_t>(8L))\n        {{\n"
            f"            auto tmp0 = at::vec::Vectorized<float>::loadu(in_ptr0 + x0, 8);\n"
            f"            auto tmp1 = at::vec::Vectorized<float>::loadu(in_ptr1 + x0, 8);\n"
            f"            auto tmp2 = tmp0 + tmp1;\n"
            f"            tmp2.store(out_ptr0 + static_cast<int64_t>(x0));\n"
            f"        }}\n    }}\n}}\n"
            f"def call_{k}(args):\n    arg0_1, arg1_1 = args\n    args.clear()\n"
            f"    assert_size_stride(arg0_1, ({16 * k + 16}, ), (1, ))\n"
            f"    buf{k} = empty_strided_cpu(({16 * k + 16}, ), (1, ), torch.float32)\n"
            f"    cpp_fused_add_{k}(arg0_1, arg1_1, buf{k})\n    return (buf{k}, )\n"
        )
    return "".join(out).encode()


def object_path(root: SharedRoot, digest: str) -> Path:
    return root.path / object_key(digest)


def write_raw_object(root: SharedRoot, digest: str, blob: bytes) -> Path:
    """Plant a crafted object file (bypassing put): the store must not trust it."""
    p = object_path(root, digest)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(blob)
    return p


def header(codec: int, size: int, *, magic: bytes = b"CASF", version: int = 1,
           reserved: int = 0) -> bytes:
    return struct.pack("<4sBBHQ", magic, version, codec, reserved, size)


# --- format -----------------------------------------------------------------
def test_header_layout_is_exactly_as_designed(root: SharedRoot) -> None:
    data = compiler_text()
    res = root.objects.put_bytes(data)
    assert res.created and res.size == len(data)
    assert res.digest == blake3.blake3(data).hexdigest()
    blob = object_path(root, res.digest).read_bytes()
    assert HEADER_SIZE == 16
    assert blob[0:4] == b"CASF"
    assert blob[4] == 1  # format version
    assert blob[5] == 1  # zstd: compiler text compresses
    assert blob[6:8] == b"\0\0"
    assert struct.unpack("<Q", blob[8:16])[0] == len(data)
    assert zstandard.ZstdDecompressor().decompress(blob[16:], max_output_size=len(data)) == data
    assert root.objects.get_bytes(res.digest, len(data)) == data


def test_random_bytes_are_stored_raw(root: SharedRoot) -> None:
    data = random.Random(1).randbytes(100_000)
    res = root.objects.put_bytes(data)
    blob = object_path(root, res.digest).read_bytes()
    assert blob[5] == 0
    assert blob[16:] == data  # raw payload is the content itself
    assert root.objects.get_bytes(res.digest) == data


def test_objects_are_read_only_and_put_twice_is_dedup(root: SharedRoot) -> None:
    data = b"same bytes" * 100
    first = root.objects.put_bytes(data)
    second = root.objects.put_bytes(data)
    assert first.created and not second.created
    assert first.digest == second.digest
    assert os.stat(object_path(root, first.digest)).st_mode & 0o222 == 0
    assert list(root.objects.iter_digests()) == [first.digest]
    assert os.listdir(root.path / "tmp") == []  # staging consumed


def test_empty_object_round_trip(root: SharedRoot) -> None:
    res = root.objects.put_bytes(b"")
    assert root.objects.get_bytes(res.digest, 0) == b""


def test_compression_ratio_on_compiler_text(root: SharedRoot) -> None:
    data = compiler_text(200)
    res = root.objects.put_bytes(data)
    stored = root.objects.stored_size(res.digest)
    assert len(data) / stored > 4.0, (len(data), stored)


@pytest.mark.parametrize("kind", ["random", "text"])
def test_large_file_streaming_round_trip(root: SharedRoot, tmp_path: Path, kind: str) -> None:
    src = tmp_path / "big.bin"
    rng = random.Random(7)
    with open(src, "wb") as f:
        if kind == "random":
            f.write(rng.randbytes(IN_MEMORY_LIMIT + 12345))
        else:
            chunk = compiler_text(100)
            while f.tell() <= IN_MEMORY_LIMIT:
                f.write(chunk)
    size = src.stat().st_size
    assert size > IN_MEMORY_LIMIT  # takes the streaming path
    res = root.objects.put_file(src)
    assert res.size == size and res.created
    h = blake3.blake3()
    with open(src, "rb") as f:
        h.update(f.read())
    assert res.digest == h.hexdigest()
    blob_path = object_path(root, res.digest)
    with open(blob_path, "rb") as f:
        hdr = f.read(16)
    assert hdr[:4] == b"CASF" and struct.unpack("<Q", hdr[8:])[0] == size
    if kind == "random":
        assert hdr[5] == 0 and blob_path.stat().st_size == size + 16
    else:
        assert hdr[5] == 1 and blob_path.stat().st_size < size // 4
    out = tmp_path / "out.bin"
    with open(out, "wb") as f:
        assert root.objects.get_into(res.digest, size, f) == size
    assert out.read_bytes() == src.read_bytes()
    assert not root.objects.put_file(src).created  # dedup on the streaming path too
    assert os.listdir(root.path / "tmp") == []


# --- corruption -------------------------------------------------------------
def _good_zstd(root: SharedRoot) -> tuple[str, bytes]:
    data = compiler_text(20)
    res = root.objects.put_bytes(data)
    return res.digest, data


def _good_raw(root: SharedRoot) -> tuple[str, bytes]:
    data = random.Random(3).randbytes(5000)
    res = root.objects.put_bytes(data)
    return res.digest, data


Maker = Callable[[SharedRoot], tuple[str, bytes]]


def _assert_rejected(
    root: SharedRoot, digest: str, expected_size: int | None, *, verify: bool = True
) -> str:
    before = root.counters.get("rejections")
    with pytest.raises(CorruptObjectError) as ei:
        root.objects.get_bytes(digest, expected_size)
    assert root.counters.get("rejections") == before + 1
    if verify:  # the object is damaged in itself, not only relative to a manifest
        with pytest.raises(CorruptObjectError):
            root.objects.verify(digest)
    return str(ei.value)


@pytest.mark.expect_log(r"rejected object: object \w+: ")
@pytest.mark.parametrize("maker", [_good_zstd, _good_raw], ids=["zstd", "raw"])
@pytest.mark.parametrize("offset", [0, 5, 17, -1])
def test_flipped_byte_is_rejected(root: SharedRoot, maker: Maker, offset: int) -> None:
    digest, data = maker(root)
    p = object_path(root, digest)
    blob = bytearray(p.read_bytes())
    blob[offset] ^= 0x40
    p.chmod(0o644)
    p.write_bytes(bytes(blob))
    _assert_rejected(root, digest, len(data))


@pytest.mark.expect_log(r"rejected object: object \w+: ")
@pytest.mark.parametrize("maker", [_good_zstd, _good_raw], ids=["zstd", "raw"])
@pytest.mark.parametrize("keep", [0, 10, 16, 40, -1])
def test_truncated_object_is_rejected(root: SharedRoot, maker: Maker, keep: int) -> None:
    digest, data = maker(root)
    p = object_path(root, digest)
    blob = p.read_bytes()
    p.chmod(0o644)
    p.write_bytes(blob[:keep])
    _assert_rejected(root, digest, len(data))


@pytest.mark.expect_log(r"rejected object: object \w+: ")
@pytest.mark.parametrize("field,value", [
    ("codec", 2), ("codec", 255), ("version", 2), ("reserved", 1), ("magic", b"CASX"),
])
def test_bad_header_fields_are_rejected(root: SharedRoot, field: str, value: object) -> None:
    data = compiler_text(5)
    digest = blake3.blake3(data).hexdigest()
    kw: dict[str, object] = {field: value}
    codec = int(kw.pop("codec", 0))  # type: ignore[call-overload]
    write_raw_object(root, digest, header(codec, len(data), **kw) + data)  # type: ignore[arg-type]
    _assert_rejected(root, digest, len(data))


@pytest.mark.expect_log(r"rejected object: object \w+: ")
def test_wrong_codec_raw_labelled_zstd(root: SharedRoot) -> None:
    data = compiler_text(5)
    digest = blake3.blake3(data).hexdigest()
    write_raw_object(root, digest, header(1, len(data)) + data)
    _assert_rejected(root, digest, len(data))


@pytest.mark.expect_log(r"rejected object: object \w+: ")
def test_wrong_codec_zstd_labelled_raw(root: SharedRoot) -> None:
    data = compiler_text(5)
    digest = blake3.blake3(data).hexdigest()
    frame = zstandard.ZstdCompressor().compress(data)
    write_raw_object(root, digest, header(0, len(data)) + frame)
    _assert_rejected(root, digest, len(data))


@pytest.mark.expect_log(r"rejected object: object \w+: ")
def test_frame_longer_than_header_says(root: SharedRoot) -> None:
    data = compiler_text(10)
    short = data[:500]
    digest = blake3.blake3(short).hexdigest()  # the name even matches the claimed prefix
    frame = zstandard.ZstdCompressor().compress(data)
    write_raw_object(root, digest, header(1, len(short)) + frame)
    msg = _assert_rejected(root, digest, len(short))
    assert digest in msg


@pytest.mark.expect_log(r"rejected object: object \w+: ")
def test_frame_shorter_than_header_says(root: SharedRoot) -> None:
    data = compiler_text(10)
    digest = blake3.blake3(data).hexdigest()
    frame = zstandard.ZstdCompressor().compress(data[:100])
    write_raw_object(root, digest, header(1, len(data)) + frame)
    _assert_rejected(root, digest, len(data))


@pytest.mark.expect_log(r"rejected object: object \w+: ")
def test_header_size_differs_from_manifest_size(root: SharedRoot) -> None:
    digest, data = _good_zstd(root)
    _assert_rejected(root, digest, len(data) + 1, verify=False)


@pytest.mark.expect_log(r"rejected object: object \w+: ")
@pytest.mark.parametrize("lie", [100, 250])
def test_frame_content_size_field_lies(root: SharedRoot, lie: int) -> None:
    data = bytes(range(200))
    digest = blake3.blake3(data).hexdigest()
    frame = bytearray(zstandard.ZstdCompressor(level=3).compress(data))
    # Single-segment frame: descriptor 0x20, then a 1-byte Frame_Content_Size.
    assert frame[4] == 0x20 and frame[5] == len(data)
    frame[5] = lie
    write_raw_object(root, digest, header(1, len(data)) + bytes(frame))
    _assert_rejected(root, digest, len(data))


@pytest.mark.expect_log(r"rejected object: object \w+: ")
def test_content_not_matching_name_is_rejected(root: SharedRoot) -> None:
    a, b = b"content A" * 50, b"content B" * 50
    res = root.objects.put_bytes(a)
    blob = object_path(root, res.digest).read_bytes()
    other = blake3.blake3(b).hexdigest()
    write_raw_object(root, other, blob)  # a valid object, filed under the wrong name
    msg = _assert_rejected(root, other, len(a))
    assert "does not match" in msg


def test_missing_object_is_not_a_rejection(root: SharedRoot) -> None:
    digest = blake3.blake3(b"never stored").hexdigest()
    with pytest.raises(ObjectMissingError):
        root.objects.get_bytes(digest)
    assert root.counters.get("rejections") == 0


@pytest.mark.expect_log(r"rejected object: not a blake2?\w* hex digest")
def test_bad_digest_name_is_rejected(root: SharedRoot) -> None:
    with pytest.raises(CorruptObjectError):
        root.objects.get_bytes("../../etc/passwd")


# --- bounded memory against a zstd bomb ------------------------------------------
BOMB_SIZE = 1 << 30


@pytest.fixture(scope="module")
def bomb_frame() -> bytes:
    """1 GiB of zeros as one zstd frame (a few tens of KB)."""
    cctx = zstandard.ZstdCompressor(level=1)
    chunk = bytes(1 << 20)
    co = cctx.compressobj(size=BOMB_SIZE)
    parts = [co.compress(chunk) for _ in range(BOMB_SIZE >> 20)]
    parts.append(co.flush())
    frame = b"".join(parts)
    assert len(frame) < 1 << 20
    return frame


_BOMB_READER = r"""
import resource, sys
from pathlib import Path
from casfs.errors import CorruptObjectError
from casfs.store.root import SharedRoot
root = SharedRoot.open(Path(sys.argv[1]))
digest, expected = sys.argv[2], sys.argv[3]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    if expected == "none":
        root.objects.verify(digest)  # no manifest size: streams into a null sink
    else:
        root.objects.get_bytes(digest, int(expected))
    print("ACCEPTED")
except CorruptObjectError as e:
    print("REJECTED", root.counters.get("rejections"), e)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("RSS_DELTA_KB", after - before)
"""


@pytest.mark.parametrize("claimed,expected", [
    (4096, "4096"),  # header and manifest both say small: output stops after 4 KiB + 1
    (4096, "none"),  # verify path: no manifest size
    (BOMB_SIZE, "4096"),  # header honest, manifest small: refused before decompressing
    (BOMB_SIZE, "none"),  # honest but wrong name: streamed in bounded chunks, hash mismatch
])
def test_zstd_bomb_is_rejected_with_bounded_memory(
    root: SharedRoot, bomb_frame: bytes, claimed: int, expected: str
) -> None:
    digest = blake3.blake3(bytes(4096)).hexdigest()
    write_raw_object(root, digest, header(1, claimed) + bomb_frame)
    proc = subprocess.run(
        [sys.executable, "-c", _BOMB_READER, str(root.path), digest, expected],
        capture_output=True, text=True, timeout=300, check=True,
    )
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("REJECTED 1 "), proc.stdout + proc.stderr
    rss_delta_kb = int(lines[-1].split()[1])
    assert rss_delta_kb < 64 * 1024, f"reading the bomb grew RSS by {rss_delta_kb} KiB"


@pytest.mark.parametrize("kind", ["compressible", "random"])
def test_a_large_file_changed_between_hashing_and_storing_is_named_by_what_is_stored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """A large file is read twice: hashed, then stored (compressed, or raw). Its owner
    could change it in between, same size, mtime put back: the stored bytes went in
    under the first pass's digest, an object that fails every read (found by a review
    on 2026-12-05). Now what is stored is hashed as written and names the object."""
    root = SharedRoot.open(tmp_path / "root", create=True)
    size = IN_MEMORY_LIMIT + 4096
    first = os.urandom(size) if kind == "random" else b"a" * size
    later = os.urandom(size) if kind == "random" else b"b" * size
    src = tmp_path / "big.bin"
    src.write_bytes(first)
    info = root.backend.info

    def swap_then_info(key: str) -> object:  # between the passes: the file changes
        src.write_bytes(later)
        return info(key)

    monkeypatch.setattr(root.backend, "info", swap_then_info)
    put = root.objects.put_file(src)
    monkeypatch.setattr(root.backend, "info", info)
    assert put.digest == blake3.blake3(later).hexdigest() and put.size == size
    assert root.objects.get_bytes(put.digest) == later  # verified on read
    assert root.backend.info(object_key(blake3.blake3(first).hexdigest())) is None
