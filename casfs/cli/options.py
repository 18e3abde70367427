"""Options shared by the commands that mount or lease caches (mount, env, run)."""

from __future__ import annotations

import argparse
import math

from casfs import families
from casfs.node.options import DEFAULTS as D
from casfs.node.options import MODES


def positive(text: str) -> float:
    v = float(text)
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be a number > 0: {text}")
    return v


def non_negative(text: str) -> float:
    v = float(text)
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be a number >= 0: {text}")
    return v


def byte_count(text: str) -> int:
    """A byte count: an integer or "512M", "2GiB", ... (casfs.util.toml.as_bytes)."""
    from casfs.errors import ConfigError
    from casfs.util.toml import as_bytes

    if text.strip() == "0":
        return 0  # never (the help says so; as_bytes refuses 0 for sizes that need one)
    try:
        return as_bytes(text if not text.isdigit() else int(text), "--prefetch-budget")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def family_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--family", default=None,
                   help=f"comma list of {', '.join(families.names())} (default: every"
                        " family; in dir/overlay mode, one process each: "
                        f"{','.join(families.DEFAULT_DAEMON)})")
    p.add_argument("--python", metavar="PATH",
                   help="the job's interpreter, whose packages make the namespace"
                        " (default: the command's, else $VIRTUAL_ENV's, else python3)")
    p.add_argument("--companions", action="store_true",
                   help="also set the families' opt-in companion variables"
                        " (e.g. FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1)")


def mount_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait-warm", type=non_negative, nargs="?", const=60.0, default=0.0,
                   metavar="S",
                   help="overlay mode: start the job only once the namespace's access"
                        " profile (its hot set) is on the node, so the kernel serves it"
                        " natively; at most S seconds (default 60; a shared root"
                        " unreachable at the start is waited for within them), then"
                        " with what is local")
    p.add_argument("--namespace", "-n", help="explicit namespace (default: auto)")
    p.add_argument("--name", help="mount name (default: the family)")
    p.add_argument("--stable-after", type=non_negative, default=D.stable_after, metavar="S")
    p.add_argument("--publish-interval", type=positive, default=D.publish_interval, metavar="S")
    p.add_argument("--refresh-interval", type=positive, default=D.refresh_interval, metavar="S")
    p.add_argument("--fetch-timeout", type=positive, default=D.fetch_timeout, metavar="S",
                   help="the longest an open waits for the shared root before the job"
                        " gets a miss (default 10)")
    p.add_argument("--prefetch-budget", type=byte_count, default=D.prefetch_budget,
                   metavar="BYTES",
                   help="fetch a namespace whose files add up to at most BYTES whole, in"
                        " the background from mount-ready (a larger one stays lazy; 0:"
                        f" never; default {D.prefetch_budget >> 20}M)")
    p.add_argument("--allow-other", action="store_true",  # casfsd's mounts: on
                   help="let other users use the mount (default: only this user)")
    p.add_argument("--exclude", action="append", help="extra scratch glob (repeatable)")
    p.add_argument("--mode", choices=MODES, default=D.mode,
                   help="fuse (default): lazy overlay mount; overlay: kernel overlayfs over"
                        " local objects and a read-only FUSE view (native speed, needs"
                        " CAP_SYS_ADMIN, else fuse); dir: plain directory restored"
                        " by copy and watched with inotify, for hosts without FUSE")
