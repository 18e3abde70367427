"""What a cache family declares, and the rules every family shares.

A family is one frozen ``Family`` value in its own module (``triton.py``,
``vllm.py``, ...), registered in ``casfs/families/__init__.py``. It says:

- ``env_vars``: the variables a job gets, each pointed at the family's
  directory; ``companions``: opt-in variables that change the library's
  behaviour (the CuTe DSL enable flag), set only when asked for;
- ``ingredients``: what makes its artifacts incompatible (host keys, see
  ``HOST_INGREDIENTS``, and package versions, see ``packages``);
- ``scratch``: per-component rules for names that are never published;
- ``commit_records``: files that make other files a hit (Triton's group
  files, vLLM's index); published only with every child they name;
- ``replaced``: paths legitimately rewritten, and their publication rule;
  everything else is first-writer-wins;
- ``path_bearing``: files holding absolute paths of the cache, stored
  path-free and presented with the serving path;
- ``includes``: families whose caches live inside this one's directory
  (Inductor keeps a Triton cache under ``triton/<dev>/``): their rules apply too;
- ``entry_of``: the *entry* a path belongs to (what a job compiles at once and
  hits as a whole: a Triton kernel's key directory, an Inductor FX graph); None
  for paths that are no part of an entry (the directories above them). The
  unit of compile time saved (docs/format.md, ``cs``); a family that does not
  say has one entry per file.

Nothing outside ``casfs/families/`` names a family: the rest of the code asks
the registry (``casfs.families.get``) and a family's ``CacheRules``.
"""

from __future__ import annotations

import fnmatch
import io
import re
import tokenize
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

# Commit records, merged indexes and path-bearing files are parsed by root's
# processes every tenant shares (the promotion worker, the publisher, the view).
# ast.literal_eval takes ~470 bytes of memory a byte of a list of small items ("0,"),
# and an index naming an artifact that never comes was parsed again every round: one
# tenant's 10 MB "index" took the shared worker to 4.7 GB and a core. Past these
# bounds a record is not in the format: a miss (not a group, not merged, not
# rewritten), never parsed. A real vLLM index is ~370 bytes and ~20 items an entry
# (81 piecewise graphs x 35 compile sizes: ~1 MB, ~57,000 items); a Triton group ~1 KB.
MAX_PARSED_BYTES = 8 << 20
# A Python literal's parse grows with its items, not its bytes: at most this many
# separators, brackets and quotes (~150 MB to parse at worst, one parse at a time).
MAX_LITERAL_ITEMS = 150_000


def too_large_to_parse(size: int) -> bool:
    """Whether a commit record or index of ``size`` bytes is past what casfs parses."""
    return size > MAX_PARSED_BYTES


def literal_items(data: bytes) -> int:
    """An upper bound's worth of a Python literal's items: separators, brackets, quotes."""
    return sum(data.count(c) for c in (b",", b":", b"(", b"[", b"{", b"+", b"-", b"'", b'"'))


# ast.literal_eval parses the whole text as any expression before it refuses what is
# not a literal, and characters the items count does not see build nodes too: a
# review's 8 MiB "1<1<1..." (no item counted) took the worker to 3.5 GB and 10 s of
# held GIL. So the text's tokens are walked first (streamed, stopping at the first
# that no literal has), and bounded in number. A real index is ~2 tokens an item.
MAX_LITERAL_TOKENS = 2 * MAX_LITERAL_ITEMS + 20_000
_LITERAL_OPS = frozenset(("{", "}", "[", "]", "(", ")", ",", ":", "-", "+"))
_LITERAL_NAMES = frozenset(("True", "False", "None"))
_LITERAL_LAYOUT = frozenset((tokenize.ENCODING, tokenize.NEWLINE, tokenize.NL,
                             tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT,
                             tokenize.ENDMARKER, tokenize.NUMBER))


def literal_shaped(data: bytes) -> bool:
    """Whether ``data`` is made only of a literal's tokens, and at most MAX_LITERAL_TOKENS."""
    n = 0
    try:
        for tok in tokenize.tokenize(io.BytesIO(data).readline):
            n += 1
            if n > MAX_LITERAL_TOKENS:
                return False
            if tok.type in _LITERAL_LAYOUT:
                continue
            if tok.type == tokenize.STRING:
                # an f-string's fields are expressions, parsed like the rest
                if "f" in tok.string[:_quote(tok.string)].lower():
                    return False
            elif not ((tok.type == tokenize.OP and tok.string in _LITERAL_OPS)
                      or (tok.type == tokenize.NAME and tok.string in _LITERAL_NAMES)):
                return False
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError, ValueError):
        return False
    return True


def _quote(s: str) -> int:
    return min(i for i in (s.find("'"), s.find('"'), len(s)) if i >= 0)


# Host ingredients every probe knows (casfs/fingerprint.py); any other
# ingredient is a package, looked up in ``Family.packages``.
HOST_INGREDIENTS = (
    "python", "platform", "arch", "libc", "cuda", "nvidia_driver", "gpu", "build_key",
)
# The stack compiled Python-side artifacts depend on (Triton/Inductor keys).
FULL_STACK = (
    "python", "platform", "arch", "libc", "torch", "triton", "cuda", "nvidia_driver", "gpu",
    "build_key",
)
# Distribution names of the packages the shared ingredients name.
BASE_PACKAGES: Mapping[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "triton": ("triton", "pytorch-triton"),
}


class CommitRecord(Protocol):
    """A file that makes other files a hit; it must never be published without them."""

    def matches(self, relpath: str) -> bool: ...

    def children(self, relpath: str, data: bytes) -> list[str] | None:
        """Relative paths of the files it names; None if the client would treat it as a miss."""
        ...


class PathBearing(Protocol):
    """A file that holds absolute paths of the cache directory it was written in."""

    def matches(self, relpath: str) -> bool: ...

    def to_pathfree(self, relpath: str, data: bytes) -> bytes | None:
        """The stored form (no absolute paths); None if ``data`` is not in a form we rewrite."""
        ...

    def present(self, relpath: str, data: bytes, root: str) -> bytes | None:
        """The stored form rewritten for a cache served at ``root``; None to serve it as is."""
        ...

    def count(self, relpath: str, data: bytes) -> int | None:
        """How many paths the stored form ``data`` holds; None if it is not a stored form."""
        ...

    def present_size(self, stored_size: int, count: int, root: str) -> int:
        """The size ``present`` gives, from the stored size and ``count`` alone."""
        ...

    def written_root(self, relpath: str, data: bytes) -> str | None:
        """The absolute cache root ``data`` was written under, if it says so consistently."""
        ...


RuleKind = Literal["newest", "merge"]


@dataclass(frozen=True)
class ReplaceRule:
    """How a replaced path is published.

    ``newest``: the version of the newest generation wins (ordered by
    generation, never by clocks). ``merge``: ``merge(older, newer)`` gives the
    bytes to publish (for a dict index: the union of keys, newest per key), or
    None when either side is not in the format, then newest wins.
    """

    kind: RuleKind
    merge: Callable[[bytes, bytes], bytes | None] | None = None
    doc: str = ""


NEWEST = ReplaceRule("newest", doc="newest generation wins")


@dataclass(frozen=True)
class ReplacedPath:
    """A glob on the whole relative path (``fnmatch``: ``*`` crosses ``/``)."""

    pattern: str
    rule: ReplaceRule
    why: str = ""

    def matches(self, relpath: str) -> bool:
        return fnmatch.fnmatchcase(relpath, self.pattern)


@dataclass(frozen=True)
class Family:
    name: str
    summary: str
    env_vars: tuple[str, ...] = ()
    companions: Mapping[str, str] = field(default_factory=dict)
    ingredients: tuple[str, ...] = FULL_STACK
    packages: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    scratch: Callable[[str], bool] | None = None
    commit_records: tuple[CommitRecord, ...] = ()
    replaced: tuple[ReplacedPath, ...] = ()
    path_bearing: tuple[PathBearing, ...] = ()
    includes: tuple[str, ...] = ()
    entry_of: Callable[[str], str | None] | None = None

    @property
    def subdir(self) -> str:
        """The family's directory name under a mount base."""
        return self.name

    def package_dists(self, ingredient: str) -> tuple[str, ...]:
        """Distribution names whose installed version is ``ingredient``'s value."""
        return self.packages.get(ingredient) or BASE_PACKAGES.get(ingredient) or (ingredient,)


def common_scratch(name: str) -> bool:
    """Rules for one path component that hold in any cache.

    - ``*.lock``: filelock's lock files (Inductor, FlashInfer, TileLang, ...)
      are node-local by nature; they never describe content.
    - ``.wh.*``: OCI/overlayfs whiteout markers describe a layer, not a file.
    """
    return name.endswith(".lock") or name.startswith(".wh.")


UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
UUID4_RE = re.compile(UUID4)
