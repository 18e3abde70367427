"""The ``casfs`` command line: store queries and control.

Errors that are the user's or the environment's (CasfsError) print one line
and exit with the error's code; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from casfs import __version__
from casfs.errors import CasfsError
from casfs.util import logtap

log = logging.getLogger("casfs")

# The job's path (casfs run, casfs env) is timed from the job's point of view:
# these commands register only their own module, the others import every module.
_QUICK = frozenset({"run", "env"})
_GLOBAL_WITH_VALUE = frozenset({"--root", "--state-dir"})


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names, skipping the global options before it."""
    it = iter(argv)
    for a in it:
        if a in _GLOBAL_WITH_VALUE:
            next(it, None)
        elif not a.startswith("-"):
            return a
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="casfs",
        description="Keep JIT compiler caches alive across jobs and nodes.",
    )
    p.add_argument("--version", action="version", version=f"casfs {__version__}")
    p.add_argument("--root", help="shared root (default: $CASFS_ROOT or the user data dir)")
    p.add_argument(
        "--state-dir", help="node state dir (default: $CASFS_STATE_DIR or the user state dir)"
    )
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    from casfs.cli import run

    if command in _QUICK:
        run.register(sub)
        return p
    from casfs.cli import doctor, explain, mounts, queries, report, store_cmds

    store_cmds.register(sub)
    mounts.register(sub)
    run.register(sub)
    queries.register(sub)
    doctor.register(sub)
    explain.register(sub)
    report.register(sub)
    return p


def setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    from casfs.node.logfmt import OneLineFormatter

    handler = logging.StreamHandler()  # stderr; a tenant's file names never break a line
    handler.setFormatter(OneLineFormatter("casfs: %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    logtap.install("casfs-cli")


def _raw_names_out() -> None:
    """Write file names that are not UTF-8 back as their raw bytes, as ls(1) does.

    Python names them with surrogate escapes; under a UTF-8 locale other than
    C.UTF-8 (en_US.UTF-8) its streams are strict and printing one would raise.
    """
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # a test's capture may lack it
        if reconfigure is not None:
            reconfigure(errors="surrogateescape")


def main(argv: Sequence[str] | None = None) -> int:
    _raw_names_out()
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_command(args_list))
    args = parser.parse_args(args_list)
    setup_logging(args.verbose)
    if args.root:
        os.environ["CASFS_ROOT"] = args.root
    if args.state_dir:
        os.environ["CASFS_STATE_DIR"] = args.state_dir
    try:
        rc = args.func(args)
        return int(rc or 0)
    except CasfsError as e:
        print(f"casfs: error: {e.message}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("casfs: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:
        # The environment, not a bug (a FIFO or a file where the root has a directory,
        # a full or read-only disk, no permission): one line, like any other error.
        if args.verbose > 1:
            raise
        print(f"casfs: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
