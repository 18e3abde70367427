"""``python -m casfs.node.hoststart``: the node's mount process (casfs.node.host), the
namespaces it was started for (``HostConfig.preopen``) read from the root while it
imports what serving needs.

casfs.node.host imports trio, the view and the mount's layers: ~0.1-0.15 s of a
Python start, and then a lease's attach waits on the root for several round
trips. The pre-opens (casfs.node.preopen) need only the store's modules; their
round trips overlap those imports. A host that replaces or adopts another
serves what that one served: it pre-opens nothing.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from casfs.node import preopen, worker
from casfs.node.config import HostConfig

log = logging.getLogger("casfs.node.host")


def _loader(fresh: bool) -> Callable[[str], HostConfig]:
    def load(text: str) -> HostConfig:
        cfg = HostConfig.from_json(text)
        for tenant, family, namespace in cfg.preopen if fresh else ():
            try:
                preopen.begin(cfg.ns_config(tenant, family, namespace))
            except Exception as e:  # a head start only: the lease's attach says what is wrong
                log.debug("not reading %s ahead: %s", namespace, e)
        return cfg
    return load


def _build(cfg: HostConfig, replace: bool = False,
           adopt: tuple[int, int] | None = None) -> Any:
    from casfs.node.host import NodeHost  # the heavy imports, while the pre-opens wait

    return NodeHost(cfg, replace=replace, adopt=adopt)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    fresh = worker.fresh_start(args)
    return worker.run_child("casfs-host", args, _loader(fresh), _build)


if __name__ == "__main__":
    worker.exit_now(main())
