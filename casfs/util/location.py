"""Where a shared root lives: a POSIX directory, or ``s3://bucket/prefix`` on object storage.

The URL form carries the non-secret options an S3-compatible server needs as
query parameters, so one string works for ``casfs init``, ``--root``,
``CASFS_ROOT`` and casfsd's ``[store] root``:

    s3://bucket/some/prefix?endpoint=http://127.0.0.1:8333&region=us-east-1

Credentials never go in it: they come from the standard AWS chain
(environment, ``~/.aws`` profiles, instance/container roles).

``read_cache=URL`` (off unless given) sends the unsigned GETs of objects and packs
to a site HTTP cache in front of the endpoint (casfs.store.sitecache).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

from casfs.errors import ConfigError

BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]\Z")
OPTIONS = ("endpoint", "region", "read_cache")


@dataclass(frozen=True, slots=True)
class S3Location:
    bucket: str
    prefix: str = ""  # no leading or trailing "/"
    endpoint: str = ""  # empty: AWS_ENDPOINT_URL(_S3) or AWS's own
    region: str = ""  # empty: AWS_REGION / the profile's
    read_cache: str = ""  # empty: none; else a site cache's URL (casfs.store.sitecache)

    def __str__(self) -> str:
        q = {k: getattr(self, k) for k in OPTIONS if getattr(self, k)}
        base = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        return f"{base}?{urlencode(q, safe=':/')}" if q else base


RootLocation = Path | S3Location


def is_url(text: str) -> bool:
    return "://" in text


def parse_location(text: str | os.PathLike[str]) -> RootLocation:
    """A root location from user input; a bad URL is a ConfigError (one line)."""
    if isinstance(text, S3Location):
        return text
    s = os.fspath(text)
    if not is_url(s):
        return Path(s).expanduser().absolute()
    u = urlsplit(s)
    if u.scheme != "s3":
        raise ConfigError(f"unsupported root URL scheme {u.scheme!r}: use a directory or s3://")
    if u.username or u.password or "@" in u.netloc:
        raise ConfigError("a root URL must not hold credentials: use the AWS environment"
                          " or profile instead")
    bucket = u.hostname or ""
    if not BUCKET_RE.match(bucket) or u.port is not None:
        raise ConfigError(f"root URL {s.split('?')[0]!r}: {bucket!r} is not a valid bucket name")
    prefix = u.path.strip("/")
    if any(p in ("", ".", "..") for p in prefix.split("/")) and prefix:
        raise ConfigError(f"root URL {s.split('?')[0]!r}: bad prefix {prefix!r}")
    opts: dict[str, str] = {}
    for k, v in parse_qsl(u.query, keep_blank_values=True):
        if k not in OPTIONS:
            raise ConfigError(f"root URL: unknown option {k!r} (known: {', '.join(OPTIONS)})")
        opts[k] = v
    ep = opts.get("endpoint", "")
    if ep:
        check_endpoint(ep, "root URL: endpoint")
    cache = opts.get("read_cache", "")
    if cache:
        check_endpoint(cache, "root URL: read_cache")
    return S3Location(bucket, prefix, ep, opts.get("region", ""), cache)


def check_endpoint(ep: str, what: str) -> str:
    """An S3 endpoint URL: http(s), and never credentials (it is shown in status, logs and
    --json output, and written to configurations)."""
    u = urlsplit(ep)
    if "@" in u.netloc:
        raise ConfigError(f"{what} must not hold credentials: use the AWS environment"
                          " or profile instead")
    if u.scheme not in ("http", "https"):
        raise ConfigError(f"{what} must be http:// or https://, not {ep!r}")
    return ep
