"""One exception root for bkspark, with BookKeeper's status codes mapped in one place.

Every error raised by bkspark (client, bookie, metadata, logs, Spark connector) derives from
:class:`BKError`. Errors that correspond to a bookie wire status carry that status as
``status`` (the numeric code of ``bookie.proto``'s ``StatusCode``); :func:`error_for_status`
turns a status received over the wire into the matching exception class, so callers can
``except FencedError`` rather than compare integers.
"""
from __future__ import annotations

# Wire status codes, identical to Apache BookKeeper's v3 protocol StatusCode.
EOK = 0
ENOLEDGER = 402
ENOENTRY = 403
EBADREQ = 404
EIO = 501
EUA = 502
EBADVERSION = 503
EFENCED = 504
EREADONLY = 505
ETOOMANYREQUESTS = 506
EUNKNOWNLEDGERSTATE = 507

STATUS_NAMES = {
    EOK: "EOK", ENOLEDGER: "ENOLEDGER", ENOENTRY: "ENOENTRY", EBADREQ: "EBADREQ",
    EIO: "EIO", EUA: "EUA", EBADVERSION: "EBADVERSION", EFENCED: "EFENCED",
    EREADONLY: "EREADONLY", ETOOMANYREQUESTS: "ETOOMANYREQUESTS",
    EUNKNOWNLEDGERSTATE: "EUNKNOWNLEDGERSTATE",
}

_BY_STATUS: dict[int, type["BKError"]] = {}


def _status(code: int):
    """Class decorator registering an exception class as the one for wire status ``code``."""
    def register(cls):
        cls.status = code
        _BY_STATUS[code] = cls
        return cls
    return register


class BKError(Exception):
    """Root of every bkspark error. ``status`` is the wire status code, if one applies."""

    status: int | None = None


# --- errors that map to a bookie wire status -------------------------------------------

@_status(ENOLEDGER)
class NoSuchLedgerError(BKError):
    """The bookie (or the metadata store) has no such ledger."""


@_status(ENOENTRY)
class NoSuchEntryError(BKError):
    """The bookie has no such entry. Only ever said of entries the bookie never stored."""


@_status(EBADREQ)
class BadRequestError(BKError):
    """A malformed, oversized or otherwise invalid request or argument."""


@_status(EIO)
class BookieIOError(BKError):
    """Storage failure on a bookie: unreadable or corrupt data, failed write or sync.

    A corrupt entry is reported as this, never as :class:`NoSuchEntryError`.
    """


@_status(EUA)
class UnauthorizedError(BKError):
    """Wrong password / master key for the ledger, or a peer that is not authenticated
    (no or a bad token or client certificate: :mod:`bkspark.auth`)."""


class PermissionDeniedError(UnauthorizedError):
    """The peer is authenticated, but its role does not permit the request
    (:mod:`bkspark.auth.roles`)."""


@_status(EBADVERSION)
class BadVersionError(BKError):
    """A compare-and-set lost: the record changed since it was read."""


@_status(EFENCED)
class FencedError(BKError):
    """The ledger was fenced by a recovering client; this writer may no longer add.

    Like a timeout, it does not say whether the add was stored: only recovery decides.
    """


@_status(EREADONLY)
class ReadOnlyError(BKError):
    """The bookie is in read-only mode and refuses adds."""


@_status(ETOOMANYREQUESTS)
class TooManyRequestsError(BKError):
    """The bookie is overloaded; retry later."""


@_status(EUNKNOWNLEDGERSTATE)
class UnknownLedgerStateError(BKError):
    """The bookie cannot tell the state of the ledger."""


# --- errors without a wire status ------------------------------------------------------

class MetadataError(BKError):
    """Failure of the metadata store (connection, session, format)."""


class NodeExistsError(MetadataError):
    """create() of a record that already exists."""


class NoNodeError(MetadataError):
    """get/set/delete of a record that does not exist."""


class NotEmptyError(MetadataError):
    """delete() of a record that still has children."""


class SessionExpiredError(MetadataError):
    """The store session ended; its ephemeral records are gone."""


class MetadataConnectionError(MetadataError):
    """The metadata store cannot be reached (bounded timeout elapsed)."""


class NoMetadataStoreError(MetadataError):
    """The URI names no existing metadata store (and creating one was not asked for)."""


class MetadataFormatError(MetadataError):
    """A stored metadata record is corrupt or of an unknown version."""


class ClockSkewError(MetadataError):
    """This host's wall clock disagrees with the metadata store's by more than the tolerance:
    a destructive action (retention, reclaim) judged here is refused (metadata.clock)."""


class InvalidUriError(MetadataError, ValueError):
    """A metadata service URI that is malformed or has an unknown scheme."""


class LedgerClosedError(BKError):
    """Add to a ledger that is closed (or being recovered) by someone else."""


class LedgerRecoveryError(BKError):
    """Recovery could not decide the end of the ledger (unknown answers); retry later."""


class NotEnoughBookiesError(BKError):
    """Not enough writable bookies to form or repair an ensemble."""


class BookieUnavailableError(BKError):
    """A bookie could not be reached or timed out (an *unknown* answer in recovery)."""


class BookieBackloggedError(BookieUnavailableError):
    """A bookie took too little of the adds queued for it (over the client's backlog bound
    too long): its stream was broken, and every writer with it in its ensemble replaces it,
    even with no add of its own pending (what was queued for it is not resent there)."""


class DigestMismatchError(BKError):
    """An entry failed its digest check (corrupt on the wire or on disk)."""


class OperationTimeoutError(BKError):
    """An operation did not complete in time."""


def error_for_status(status: int, message: str = "") -> BKError:
    """Return the exception instance for a non-OK wire status."""
    cls = _BY_STATUS.get(status, BKError)
    err = cls(message or f"bookie returned {STATUS_NAMES.get(status, status)}")
    err.status = status
    return err


def status_name(status: int) -> str:
    return STATUS_NAMES.get(status, str(status))


class NoSuchLogError(BKError):
    """The named log does not exist."""


class LogFencedError(FencedError):
    """This log writer (or checkpoint-store owner) lost ownership: another one took over."""


class UnknownBookieError(BKError):
    """A bookie id the cluster's metadata does not know (no cookie, not registered, in no
    ledger's ensemble): a typo or another cluster, never "nothing to do"."""


class ReplicationError(BKError):
    """Re-replication of a ledger fragment failed for now; the ledger stays under-replicated."""


class RecoveryFailedError(BKError):
    """Manual bookie recovery or decommission left ledgers on the bookie."""


def did_you_mean(name: str, known, key=str.lower) -> str:
    """``": did you mean 'x'?"`` for the known name closest to ``name`` (compared as
    ``key(name)``: case-insensitive by default), or "" -- for errors about an unknown option or
    setting."""
    import difflib
    lowered = {key(k): k for k in known}
    close = difflib.get_close_matches(key(name), list(lowered), n=1, cutoff=0.6)
    return f": did you mean {lowered[close[0]]!r}?" if close else ""
