"""How casfs starts its own Python processes: immune to the caller's directory and environment.

A mount, host, worker or standby process is ``python -P -m casfs...`` run from
``/``: ``-P`` keeps the working directory (and a script's) off ``sys.path``, so a
``struct.py`` or ``casfs/`` planted in a shared directory the job was started
from is never imported (it ran as the victim in every ``casfs run`` started
there, and as root in a casfsd started there by hand). ``cwd="/"`` keeps relative
paths from meaning anything (every path in a child's config is absolute).

The environment is an allow-list (docs/security.md, "What casfs's processes
inherit"): what locates the user's files and the shared root, and nothing that
changes how Python itself starts (``PYTHONSTARTUP``, ``PYTHONINSPECT``,
``PYTHONHOME``, ``LD_PRELOAD`` ... are dropped).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

CHILD_CWD = "/"

# Passed on by exact name.
_NAMES = frozenset({
    "PATH",  # fusermount3, mount
    "HOME", "USER", "LOGNAME",  # ~/.aws, platformdirs' defaults
    "LANG", "LANGUAGE", "TZ", "TMPDIR",
    "PYTHONPATH",  # a casfs installed outside the interpreter's site-packages (tests, users)
    "LD_LIBRARY_PATH",  # a libfuse3 outside the system's (a conda env): the caller's own
    "JOURNAL_STREAM", "INVOCATION_ID",  # logging straight to the journal under systemd
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",  # an S3 endpoint's CA
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
})
# Passed on by prefix: casfs's own settings, the AWS credential and endpoint chain,
# the XDG base directories, locale categories.
_PREFIXES = ("CASFS_", "AWS_", "XDG_", "LC_")
# Paths a child may read from its environment: made absolute here, since the child
# runs from "/" (``CASFS_STATE_DIR=state casfs run`` means the caller's ./state).
_PATHS = ("CASFS_STATE_DIR", "CASFS_ROOT", "CASFS_MOUNT_BASE", "CASFS_SERVE_BASE",
          "CASFS_CONFIG", "CASFS_SOCKET")


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allow-listed part of ``env`` (default: this process's environment)."""
    src = os.environ if env is None else env
    out = {k: v for k, v in src.items() if k in _NAMES or k.startswith(_PREFIXES)}
    for k in _PATHS:
        v = out.get(k)
        if v and "://" not in v:
            out[k] = os.path.abspath(os.path.expanduser(v))
    return out


def python_module(module: str) -> list[str]:
    """argv that runs ``module`` with this interpreter, the working directory off sys.path."""
    return [sys.executable, "-P", "-m", module]
