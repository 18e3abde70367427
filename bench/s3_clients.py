"""obstore vs boto3 on a real SeaweedFS server: which S3 client the backend uses.

Usage: ``python -m bench.s3_clients [--objects 2000] [--threads 16] [--size 4096]``

Prints one JSON document: for each client, small-object create-only PUT, GET,
HEAD and ranged GET rates (requests/s), sequential and with ``--threads``
threads, and whether concurrent create-only PUTs of one key had exactly one
winner. Both clients run against the same server, one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from seaweed import seaweed


class Boto3Client:
    name = "boto3"

    def __init__(self, endpoint: str, bucket: str, threads: int) -> None:
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.c = boto3.client("s3", endpoint_url=endpoint,
                              config=Config(max_pool_connections=max(10, threads),
                                            retries={"max_attempts": 1}))
        self.exc = self.c.exceptions.ClientError

    def create(self, key: str, data: bytes) -> bool:
        try:
            self.c.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
            return True
        except self.exc as e:
            if e.response["ResponseMetadata"]["HTTPStatusCode"] in (409, 412):
                return False
            raise

    def get(self, key: str) -> bytes:
        return bytes(self.c.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def head(self, key: str) -> int:
        return int(self.c.head_object(Bucket=self.bucket, Key=key)["ContentLength"])

    def get_range(self, key: str, start: int, length: int) -> bytes:
        r = self.c.get_object(Bucket=self.bucket, Key=key,
                              Range=f"bytes={start}-{start + length - 1}")
        return bytes(r["Body"].read())


class ObstoreClient:
    name = "obstore"

    def __init__(self, endpoint: str, bucket: str, threads: int) -> None:
        import obstore
        from obstore.store import S3Store

        self.ob = obstore
        self.s = S3Store(bucket, endpoint=endpoint, region="us-east-1",
                         client_options={"allow_http": True})

    def create(self, key: str, data: bytes) -> bool:
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        try:
            self.ob.put(self.s, key, data, mode="create")
            return True
        except (AlreadyExistsError, PreconditionError):
            return False

    def get(self, key: str) -> bytes:
        return bytes(self.ob.get(self.s, key).bytes())

    def head(self, key: str) -> int:
        return int(self.ob.head(self.s, key)["size"])

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return bytes(self.ob.get_range(self.s, key, start=start, length=length))


def _rate(fn: Callable[[int], Any], n: int, threads: int) -> float:
    t0 = time.perf_counter()
    if threads <= 1:
        for i in range(n):
            fn(i)
    else:
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(fn, range(n)))
    return round(n / (time.perf_counter() - t0), 1)


def _race(client: Any, key: str, writers: int = 16) -> int:
    bar = threading.Barrier(writers)
    wins: list[int] = []

    def one(i: int) -> None:
        bar.wait()
        if client.create(key, f"writer {i}".encode()):
            wins.append(i)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(writers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return len(wins)


def measure(client: Any, n: int, threads: int, size: int) -> dict[str, Any]:
    data = os.urandom(size)
    seq_n = max(50, n // 8)
    out: dict[str, Any] = {}
    out["put_create_seq_per_s"] = _rate(lambda i: client.create(f"seq/{i}", data), seq_n, 1)
    out["put_create_conc_per_s"] = _rate(lambda i: client.create(f"conc/{i}", data), n, threads)
    out["get_seq_per_s"] = _rate(lambda i: client.get(f"seq/{i}"), seq_n, 1)
    out["get_conc_per_s"] = _rate(lambda i: client.get(f"conc/{i}"), n, threads)
    out["head_conc_per_s"] = _rate(lambda i: client.head(f"conc/{i}"), n, threads)
    out["range_conc_per_s"] = _rate(lambda i: client.get_range(f"conc/{i}", 100, 200), n, threads)
    assert client.get_range("conc/0", 100, 200) == data[100:300]
    assert client.create("conc/0", b"x") is False  # create-only: the second create loses
    out["race_single_winner"] = all(_race(client, f"race/{t}") == 1 for t in range(5))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.s3_clients", description=__doc__)
    ap.add_argument("--objects", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--size", type=int, default=4096)
    args = ap.parse_args(argv)
    result: dict[str, Any] = {"objects": args.objects, "threads": args.threads,
                              "size": args.size, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="casfs-s3bench-") as tmp, seaweed(Path(tmp)) as srv:
        os.environ.update(srv.env())
        for cls in (ObstoreClient, Boto3Client):
            bucket = f"bench-{cls.name}"
            srv.create_bucket(bucket)
            result[cls.name] = measure(cls(srv.endpoint, bucket, args.threads),
                                       args.objects, args.threads, args.size)
    o, b = result["obstore"], result["boto3"]
    result["obstore_over_boto3"] = {k: round(o[k] / b[k], 2) for k in o
                                    if k.endswith("_per_s") and b[k]}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
