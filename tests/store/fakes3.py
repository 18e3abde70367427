"""Point obstore and boto3 at a small local HTTP server standing in for an S3 endpoint."""

from __future__ import annotations

import os

import pytest


def aim_at(monkeypatch: pytest.MonkeyPatch, port: int) -> None:
    """The AWS environment of this test: dummy keys, the endpoint on 127.0.0.1:``port``."""
    for k in [k for k in list(os.environ) if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
