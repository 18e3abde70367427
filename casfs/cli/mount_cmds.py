"""Mount commands: mount, umount, run, stats, publish, status, refresh."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pass
