"""casfs: keep JIT compiler caches alive across jobs, containers and nodes."""

__version__ = "0.1.0"
