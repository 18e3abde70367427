"""A promoter and publisher of one namespace ("ns", triton rules) over a real root and index."""

from __future__ import annotations

from pathlib import Path

from casfs.families import rules as family_rules
from casfs.index.node_index import NodeIndex
from casfs.promote.promoter import Promoter
from casfs.promote.publisher import Publisher
from casfs.promote.tracker import WriteTracker
from casfs.store.root import SharedRoot
from casfs.util.counters import Counters


def promotion_rig(root: SharedRoot, upper: Path, index: NodeIndex
                  ) -> tuple[Promoter, Publisher, Counters, WriteTracker]:
    counters, tracker, rules = Counters(), WriteTracker(), family_rules("triton")
    promoter = Promoter(upper=upper, objects=root.objects, index=index, key="ns",
                        rules=rules, tracker=tracker, counters=counters,
                        lower=index.lower_tree("ns", 0), stable_after=0.0, packs=True,
                        root_id=root.root_id)
    publisher = Publisher(generations=root.generations(), index=index, key="ns",
                          namespace="ns", counters=counters, rules=rules, fingerprint=None,
                          max_bytes=None)
    return promoter, publisher, counters, tracker
