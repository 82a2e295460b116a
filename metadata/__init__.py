"""bkspark metadata layer: a versioned, hierarchical store with two implementations.

>>> from metadata import open_store, BadVersionError, NodeExistsError, NoNodeError
>>> store = open_store("sqlite:///tmp/meta.db")        # or "zk://127.0.0.1:2181/ledgers"

See :class:`metadata.store.MetadataStore` for the operations and their semantics, and
:mod:`metadata.layout`, :mod:`metadata.ledgers`, :mod:`metadata.registry` for BookKeeper's
layout on top of it.
"""
from __future__ import annotations

from bkspark.errors import (
    BadRequestError,
    BadVersionError,
    BKError,
    InvalidUriError,
    MetadataConnectionError,
    MetadataError,
    MetadataFormatError,
    NodeExistsError,
    NoNodeError,
    NoSuchLedgerError,
    NotEmptyError,
    SessionExpiredError,
)

from .clock import DEFAULT_SKEW_TOLERANCE_S
from .store import MetadataStore, Transaction
from .uri import SqliteUri, ZkUri, parse_uri

__all__ = [
    "open_store", "parse_uri", "ZkUri", "SqliteUri", "MetadataStore", "Transaction",
    "BKError", "MetadataError", "NodeExistsError", "NoNodeError", "NotEmptyError",
    "BadVersionError", "SessionExpiredError", "MetadataConnectionError",
    "MetadataFormatError", "InvalidUriError", "BadRequestError", "NoSuchLedgerError",
]


def open_store(uri: str, *, session_timeout: float = 10.0,
               connect_timeout: float = 10.0, create: bool = False,
               clock_skew_tolerance: float = DEFAULT_SKEW_TOLERANCE_S) -> MetadataStore:
    """Open the metadata store named by ``uri``.

    * ``zk://host:port[,host:port]/root`` — ZooKeeper (kazoo); ``root`` is a chroot,
      created if missing.
    * ``sqlite:///abs/path.db`` — embedded SQLite file shared by the processes of one machine.
      It must exist unless ``create`` (bookies and ``bkspark localcluster`` create it; clients
      never do, so a mistyped path fails instead of opening a new, empty cluster); its
      directory must exist in any case.

    ``session_timeout``: seconds after which a silent owner's ephemeral records vanish.
    ``connect_timeout``: bound on the time spent reaching the store.
    ``clock_skew_tolerance``: seconds this host's clock may be off the store's before the
    actions that delete by time refuse (:mod:`metadata.clock`).

    :raises InvalidUriError: malformed URI or unknown scheme (the message says which).
    :raises NoMetadataStoreError: a ``sqlite://`` store that does not exist (see ``create``).
    :raises MetadataConnectionError: the store could not be reached within
        ``connect_timeout`` (the message names the address).
    """
    for name, value in (("session_timeout", session_timeout),
                        ("connect_timeout", connect_timeout)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise BadRequestError(f"{name} must be a positive number of seconds, got {value!r}")
    if isinstance(clock_skew_tolerance, bool) or not isinstance(clock_skew_tolerance,
                                                                (int, float)) \
            or not clock_skew_tolerance > 0:
        raise BadRequestError("clock_skew_tolerance must be a positive number of seconds, got "
                              f"{clock_skew_tolerance!r}")
    parsed = parse_uri(uri)
    store: MetadataStore
    if isinstance(parsed, SqliteUri):
        from .sqlite_store import SqliteStore
        store = SqliteStore(parsed.path, uri, session_timeout=session_timeout,
                            connect_timeout=connect_timeout, create=create)
    else:
        from .zk_store import ZkStore
        store = ZkStore(parsed, uri, session_timeout=session_timeout,
                        connect_timeout=connect_timeout)
    store.clock_skew_tolerance = float(clock_skew_tolerance)
    return store
