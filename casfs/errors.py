"""One exception hierarchy for every user-facing error.

A ``CasfsError`` is an expected failure (bad input, bad config, a damaged
store): the CLI prints its message on one line and exits with ``exit_code``.
Anything else escaping to the CLI is a bug and gets a traceback.
"""

from __future__ import annotations


class CasfsError(Exception):
    """casfs failed."""

    exit_code = 1

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or self.__class__.__name__).strip())

    @property
    def message(self) -> str:
        return str(self.args[0])


class UsageError(CasfsError):
    """Invalid arguments."""

    exit_code = 2


class ConfigError(CasfsError):
    """Invalid configuration."""

    exit_code = 2


class StoreFormatError(CasfsError):
    """The shared root has an unknown or damaged format."""

    exit_code = 3


class CorruptObjectError(CasfsError):
    """A stored object failed verification."""

    exit_code = 3


class ObjectMissingError(CasfsError):
    """A stored object does not exist."""

    exit_code = 3


class HostileManifestError(CasfsError):
    """A manifest or generation record is malformed or unsafe."""

    exit_code = 3


class UntrustedError(CasfsError):
    """A namespace's records may come from outside its tenant: not served."""

    exit_code = 3


class NotFoundError(CasfsError):
    """No such namespace, generation or path."""

    exit_code = 4


class PublishError(CasfsError):
    """Publication failed."""

    exit_code = 5


class QuotaExceededError(PublishError):
    """The namespace byte bound stops publication."""


class IndexError_(CasfsError):
    """The node index cannot be used."""

    exit_code = 6


class UnsupportedFilesystemError(CasfsError):
    """This path is on a filesystem casfs cannot use for it."""

    exit_code = 6


class DaemonUnavailableError(CasfsError):
    """No casfs daemon or mount answers."""

    exit_code = 7


class DaemonStuckError(DaemonUnavailableError):
    """A casfs process took the request but did not answer in time (stopped or stuck)."""


class FuseUnavailableError(CasfsError):
    """FUSE is not available here."""

    exit_code = 8


class UnreadableHereError(CasfsError):
    """A record or manifest this node cannot read, though it is not damaged.

    Readers serve the newest generation they can read; publishers refuse the
    namespace (building on an older snapshot would drop entries).
    """

    exit_code = 3


class NewerFormatError(UnreadableHereError):
    """A record or manifest has a format newer than this casfs reads (not damage)."""


class OverLimitError(UnreadableHereError):
    """A manifest is larger than this node's configured limit."""


class PublishDeferredError(PublishError):
    """Publication to a namespace waits until its newest record can be read."""


class WorkerBugError(CasfsError):
    """A worker request failed with an unexpected exception (a bug, or an input casfs
    does not handle): retrying the same input fails the same way."""
