"""The lower layer as the view sees it: re-exports casfs.index.tree (protocols live below)."""

from casfs.index.tree import DIR, DictLowerTree, LowerNode, LowerTree, ObjectFetcher

__all__ = ["DIR", "DictLowerTree", "LowerNode", "LowerTree", "ObjectFetcher"]
