"""Which credential path an S3 root takes (casfs.store.s3backend): keys in the
environment with a known endpoint or region never import boto3 (~0.4 CPU-s in each
of a node's processes); anything else still resolves through boto3's chain."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, sys
from casfs.store.s3backend import S3Backend
from casfs.util.location import parse_location
b = S3Backend(parse_location(sys.argv[1]), staging_dir=__import__("pathlib").Path(sys.argv[2]))
print(json.dumps({"boto3": "boto3" in sys.modules}))
"""


def _probe(url: str, tmp: str, **env: str) -> bool:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    clean.update(AWS_CONFIG_FILE=f"{tmp}/none", AWS_SHARED_CREDENTIALS_FILE=f"{tmp}/none",
                 AWS_EC2_METADATA_DISABLED="true", **env)
    r = subprocess.run([sys.executable, "-c", PROBE, url, tmp], env=clean, capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    return bool(json.loads(r.stdout.splitlines()[-1])["boto3"])


KEYS = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}


@pytest.mark.parametrize(("url", "env", "boto3"), [
    ("s3://bkt/p?endpoint=http://127.0.0.1:9", KEYS, False),
    ("s3://bkt/p", {**KEYS, "AWS_REGION": "eu-west-1"}, False),
    # a region only a profile could name: boto3 reads it
    ("s3://bkt/p", KEYS, True),
    # no keys in the environment: boto3's chain (profiles, SSO, roles)
    ("s3://bkt/p?endpoint=http://127.0.0.1:9", {}, True),
])
def test_keys_in_the_environment_skip_boto3(tmp_path: os.PathLike[str], url: str,
                                            env: dict[str, str], boto3: bool) -> None:
    assert _probe(url, str(tmp_path), **env) is boto3
