"""Any other cache directory (``CASFS_CACHE_DIR``): a tool casfs has no family for.

It depends only on what any native tool would (Python, platform, arch and
the operator's build key) and applies the Triton and Inductor rules, since a
generic cache is often a parent of theirs. Nothing in it is replaced: every
path is first-writer-wins.
"""

from __future__ import annotations

from casfs.families.base import Family, common_scratch

FAMILY = Family(
    name="generic",
    summary="any other cache directory (CASFS_CACHE_DIR)",
    env_vars=("CASFS_CACHE_DIR",),
    ingredients=("python", "platform", "arch", "build_key"),
    scratch=common_scratch,
    includes=("triton", "inductor"),
)
