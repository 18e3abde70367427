"""Whether this interpreter can serve FUSE: pyfuse3 is the optional ``fuse`` extra.

pyfuse3 ships no wheels (it builds against libfuse3's headers), so ``pip install
casfs`` leaves it out and stays pure Python; ``pip install 'casfs[fuse]'`` adds it
where a C compiler and libfuse3-dev are present. Without it, ``casfs run`` serves
the caches as plain directories (dir mode) and ``casfs doctor`` says how to get FUSE.
"""

from __future__ import annotations

import importlib.util

HOW = "pip install 'casfs[fuse]', needs libfuse3-dev and a C compiler"
NOT_INSTALLED = f"FUSE support is not installed ({HOW})"


def fuse_missing(*, load: bool = True) -> str | None:
    """None when pyfuse3 is usable here; else one sentence saying why not and how to get it.

    ``load``: import it (a pyfuse3 built against a libfuse3 that is gone since, or
    missing trio, is found but cannot be loaded); without, only look for it, which
    costs no import (pyfuse3 and trio take ~0.1 s: ``casfs run`` asks before it
    starts a mount process, whose own import failure says the rest).
    """
    if importlib.util.find_spec("pyfuse3") is None:
        return NOT_INSTALLED
    if not load:
        return None
    try:
        import pyfuse3  # noqa: F401
    except ImportError as e:
        return import_failed(e)
    return None


def import_failed(e: ImportError) -> str:
    """The sentence for pyfuse3's import failing with ``e``."""
    if isinstance(e, ModuleNotFoundError) and e.name == "pyfuse3":
        return NOT_INSTALLED
    return f"FUSE support cannot be loaded ({type(e).__name__}: {e}; {HOW})"
