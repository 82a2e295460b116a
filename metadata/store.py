"""The metadata store interface shared by the ZooKeeper and the SQLite implementations.

A store is a tree of records ("nodes") addressed by absolute slash-separated paths inside
the store root, modelled on ZooKeeper:

* every node has ``data`` (bytes) and an integer ``version`` that starts at 0 when the node is
  created and grows by one on every :meth:`MetadataStore.set`;
* writes may be conditional on a version (compare-and-set); ``version=-1`` means
  unconditional;
* a node may be *ephemeral*: it belongs to the store's session and vanishes when the
  session ends (:meth:`MetadataStore.close`) or expires (the owner stopped heart-beating);
  ephemeral nodes cannot have children;
* a *sequential* create appends a 10-digit, per-parent, increasing counter to the name;
* watches report changes of a node's children or data.

Errors all derive from :class:`bkspark.errors.MetadataError` (re-exported by
:mod:`metadata`). A :class:`MetadataConnectionError` from a *write* means its outcome is
unknown (with ZooKeeper the request may still be applied once the connection is back, CAS
checks included): re-read before deciding, as after a ZooKeeper ConnectionLoss. Invalid
arguments (paths, data, versions) raise :class:`bkspark.errors.BadRequestError`.
"""
from __future__ import annotations

import abc
import re
import threading
from typing import TYPE_CHECKING, Callable

from bkspark.errors import BadRequestError, NoNodeError

from .clock import DEFAULT_SKEW_TOLERANCE_S

if TYPE_CHECKING:
    from .clock import StoreClock

#: ZooKeeper's default maximum znode payload (jute.maxbuffer is 0xfffff minus overhead).
MAX_DATA_SIZE = 1024 * 1024 - 1024

#: the most one ZooKeeper transaction may carry: ZooKeeper refuses (by dropping the
#: connection: to a client, a lost answer, again at every retry) a request over
#: jute.maxbuffer (1 MiB by default); counted as paths + data + a per-operation allowance
#: for the ACL and framing (:data:`OP_OVERHEAD`)
MAX_TRANSACTION_BYTES = MAX_DATA_SIZE
OP_OVERHEAD = 128


def transaction_bytes(ops) -> int:
    """What :data:`MAX_TRANSACTION_BYTES` counts of ``(op, path, data?, ...)`` operations."""
    return sum(len(op[1]) + (len(op[2]) if op[0] in ("create", "set") else 0) + OP_OVERHEAD
               for op in ops)

_BAD_PATH_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_CLOCK_LOCK = threading.Lock()


def validate_path(path: str) -> str:
    """Check ``path`` is an absolute, normalised store path; return it.

    :raises BadRequestError: naming what is wrong with the path.
    """
    if not isinstance(path, str):
        raise BadRequestError(f"metadata path must be a str, got {type(path).__name__}")
    if not path.startswith("/"):
        raise BadRequestError(f"metadata path must be absolute (start with '/'): {path!r}")
    if path == "/":
        return path
    if path.endswith("/"):
        raise BadRequestError(f"metadata path must not end with '/': {path!r}")
    for part in path[1:].split("/"):
        if part == "":
            raise BadRequestError(f"metadata path has an empty component: {path!r}")
        if part in (".", ".."):
            raise BadRequestError(f"metadata path has a relative component {part!r}: {path!r}")
    if _BAD_PATH_CHARS.search(path):
        raise BadRequestError(f"metadata path contains control characters: {path!r}")
    return path


def validate_data(data) -> bytes:
    """Return ``data`` as bytes, rejecting non-bytes and oversized payloads."""
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    if not isinstance(data, bytes):
        raise BadRequestError(f"metadata data must be bytes, got {type(data).__name__}")
    if len(data) > MAX_DATA_SIZE:
        raise BadRequestError(
            f"metadata record of {len(data)} bytes exceeds the {MAX_DATA_SIZE}-byte limit")
    return data


class TransactionTooLargeError(BadRequestError):
    """A transaction would exceed :data:`MAX_TRANSACTION_BYTES`: it was not sent."""


def validate_version(version) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < -1:
        raise BadRequestError(f"version must be an int >= -1 (-1 = any), got {version!r}")
    return version


def parent_of(path: str) -> str:
    parent = path.rsplit("/", 1)[0]
    return parent or "/"


def join(parent: str, name: str) -> str:
    return ("" if parent == "/" else parent) + "/" + name


class Transaction:
    """A multi-operation, all-or-nothing write.

    Operations are queued by :meth:`create`, :meth:`set`, :meth:`delete` and :meth:`check`
    and applied atomically by :meth:`commit`, which returns one result per operation (the
    created path for ``create``, the new version for ``set``, ``None`` otherwise) or raises
    the error of the first failing operation (e.g. :class:`BadVersionError`) having applied
    nothing. Usable as a context manager (commits on a clean exit). One over the store's
    :attr:`MetadataStore.max_transaction_bytes` is refused before it is sent
    (:class:`TransactionTooLargeError`).

    **A lost answer.** :class:`MetadataConnectionError` from :meth:`commit` means the outcome is
    unknown: all of it may have been applied, or none of it (never a part). Tell which from what
    is stored, never by retrying blindly (a retry of an applied transaction fails its checks or
    creates and could be misread as a conflict): give the transaction one operation only it
    performs -- a create of a path no other writer creates, or a set whose data carries a token
    of its own -- and look for it after :meth:`MetadataStore.sync`
    (:func:`metadata.update.transaction_applied`). Absent means not applied *so far*; a
    transaction that also checks (or sets at) a version of a record its retry checks too cannot
    be applied late beside the retry: one of the two fails its check.
    """

    def __init__(self, apply: Callable[[list[tuple]], list], max_bytes: int | None = None):
        """``apply(ops)``: the store's atomic application of the queued operations;
        ``max_bytes``: the most the store takes in one (None: no limit)."""
        self.ops: list[tuple] = []
        self.committed = False
        self._apply = apply
        self._max_bytes = max_bytes

    def _add(self, op: tuple) -> "Transaction":
        if self.committed:
            raise BadRequestError("transaction already committed")
        self.ops.append(op)
        return self

    def create(self, path: str, data: bytes = b"", ephemeral: bool = False,
               sequential: bool = False, makepath: bool = True) -> "Transaction":
        return self._add(("create", validate_path(path), validate_data(data),
                          bool(ephemeral), bool(sequential), bool(makepath)))

    def set(self, path: str, data: bytes, version: int = -1) -> "Transaction":
        return self._add(("set", validate_path(path), validate_data(data),
                          validate_version(version)))

    def delete(self, path: str, version: int = -1) -> "Transaction":
        return self._add(("delete", validate_path(path), validate_version(version)))

    def check(self, path: str, version: int) -> "Transaction":
        return self._add(("check", validate_path(path), validate_version(version)))

    def commit(self) -> list:
        """Apply every queued operation atomically; see the class docstring."""
        if self.committed:
            raise BadRequestError("transaction already committed")
        size = transaction_bytes(self.ops) if self._max_bytes is not None else 0
        if self._max_bytes is not None and size > self._max_bytes:
            raise TransactionTooLargeError(
                f"a transaction of {len(self.ops)} operations and about {size} bytes exceeds "
                f"the {self._max_bytes}-byte limit of one metadata request")
        self.committed = True
        return self._apply(self.ops)

    def __enter__(self) -> "Transaction":
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None and not self.committed:
            self.commit()


class MetadataStore(abc.ABC):
    """Versioned, hierarchical metadata store (see the module docstring).

    Open one with :func:`metadata.open_store`. Thread-safe. Use as a context manager or call
    :meth:`close`.
    """

    #: the URI the store was opened with
    uri: str
    #: the requested session timeout, seconds
    session_timeout: float

    @abc.abstractmethod
    def create(self, path: str, data: bytes = b"", ephemeral: bool = False,
               sequential: bool = False, makepath: bool = True) -> str:
        """Create ``path`` holding ``data``; return the created path (with the sequence
        suffix when ``sequential``). Missing parents are created (persistent) when
        ``makepath``, else :class:`NoNodeError`.

        :raises NodeExistsError: the node already exists.
        """

    @abc.abstractmethod
    def get(self, path: str) -> tuple[bytes, int]:
        """Return ``(data, version)``. :raises NoNodeError: absent."""

    @abc.abstractmethod
    def exists(self, path: str) -> int | None:
        """Return the node's version, or ``None`` if absent."""

    @abc.abstractmethod
    def set(self, path: str, data: bytes, version: int = -1) -> int:
        """Replace the data if the version matches (``-1``: any); return the new version.

        :raises BadVersionError: the node's version is not ``version``.
        :raises NoNodeError: absent.
        """

    @abc.abstractmethod
    def delete(self, path: str, version: int = -1) -> None:
        """Delete the node. :raises NoNodeError, BadVersionError, NotEmptyError:"""

    @abc.abstractmethod
    def sync(self, path: str = "/") -> None:
        """Make the next reads of this store see every write committed before this call.

        ZooKeeper serves reads from the server a client is connected to, which may lag the
        leader (notably right after a reconnect); decisions that must not rest on an old
        view -- what a lost answer did, what may be deleted -- read after ``sync``.

        :raises MetadataConnectionError: the store did not answer.
        """

    @abc.abstractmethod
    def children(self, path: str) -> list[str]:
        """Names of the node's children, sorted. :raises NoNodeError: absent."""

    @abc.abstractmethod
    def watch_children(self, path: str, callback: Callable[[list[str]], None]) -> Callable[[], None]:
        """Call ``callback(sorted_children)`` now and whenever the children change (``[]``
        while the node does not exist). Returns a function that cancels the watch.
        Callbacks run on a store thread; keep them short."""

    @abc.abstractmethod
    def watch_data(self, path: str,
                   callback: Callable[[bytes | None, int | None], None]) -> Callable[[], None]:
        """Call ``callback(data, version)`` now and whenever the node changes;
        ``(None, None)`` while it does not exist. Returns a cancel function."""

    #: the most one transaction may carry (None: no limit; ZooKeeper:
    #: :data:`MAX_TRANSACTION_BYTES`)
    max_transaction_bytes: int | None = None

    @abc.abstractmethod
    def transaction(self) -> Transaction:
        """Start a multi-op transaction (see :class:`Transaction`)."""

    @abc.abstractmethod
    def generate_id(self) -> int:
        """Return a positive 64-bit integer never returned before by any client of this
        store (across processes)."""

    @property
    @abc.abstractmethod
    def session_id(self) -> str:
        """Identifier of the current session (changes after the session is lost)."""

    @abc.abstractmethod
    def on_session_lost(self, callback: Callable[[], None]) -> None:
        """Register ``callback()``, called (on a store thread) after the session expired and
        a new session is in place, so owners can recreate their ephemeral nodes."""

    @abc.abstractmethod
    def close(self) -> None:
        """End the session (its ephemeral nodes vanish) and release resources. Idempotent."""

    @abc.abstractmethod
    def probe_time_ms(self) -> int:
        """The store's own time now (ms since the epoch), by one write stamped by the store,
        not by this process's clock (:mod:`metadata.clock`).

        :raises MetadataConnectionError: no answer (no time is guessed).
        """

    @property
    def clock(self) -> "StoreClock":
        """The store's clock (:class:`metadata.clock.StoreClock`): the one time that stamps
        and judges retention, key expiry, reclaims and cursor activity."""
        clock = self.__dict__.get("_store_clock")
        if clock is None:
            from .clock import StoreClock
            with _CLOCK_LOCK:
                clock = self.__dict__.setdefault(
                    "_store_clock", StoreClock(self.probe_time_ms,
                                               getattr(self, "clock_skew_tolerance",
                                                       DEFAULT_SKEW_TOLERANCE_S)))
        return clock

    def get_many(self, paths: list[str]) -> list[tuple[bytes, int] | None]:
        """``get`` of each path (``None`` where absent), in order; a store may pipeline them
        (ZooKeeper sends them together). Each read is atomic on its own, not all of them
        together: read a record that orders them (a log's head) first."""
        out = []
        for path in paths:
            try:
                out.append(self.get(path))
            except NoNodeError:
                out.append(None)
        return out

    # ---- conveniences shared by both implementations ---------------------------------

    def ensure_path(self, path: str) -> None:
        """Create ``path`` (and parents) with empty data if it does not exist."""
        from bkspark.errors import NodeExistsError
        if self.exists(path) is None:
            try:
                self.create(path, b"", makepath=True)
            except NodeExistsError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<{type(self).__name__} {self.uri!r} session={self.session_id}>"
