"""The shared store: objects, packs, manifests, generation records and the root holding them.

Every import in this package is at module top and points down. From the
bottom (a module imports only those on lines above its own):

    backend, digests, entry, profile, tenancy   storage, names, rows; trust
    packloc, freshness, reads, s3backend        pack locations and forwards; statements
    objects                                     loose objects; follows pack locations
    manifest, marks, packs, rootlike            parts; gc marks; packs; RootLike
    record                                      the generation record format, name checks
    snapshot                                    Snapshot and the one merge rule
    generations                                 read, merge, publish (on a RootLike)
    root                                        SharedRoot: the handles onto a root
    maintenance, export                         whole-root tools (gc, verify, export)

tests/test_imports.py fails on any import circle in casfs/.
"""
