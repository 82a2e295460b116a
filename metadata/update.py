"""The one way a metadata record changes: read, decide, transform, compare-and-set, re-read.

Every change of ledger metadata and of log metadata goes through :func:`update_record`
(in the spirit of Apache BookKeeper's ``MetadataUpdateLoop``):

1. read the record (or start from a value the caller already holds);
2. ``done(value)``: is the change the caller wants already there? Then stop: nothing to write;
3. ``transform(value)`` computes the new value; it may raise :class:`NoChange` (leave the record
   as it is) or any other exception (abort: nothing was written by this attempt);
4. compare-and-set the new bytes at the version read;
5. on :class:`BadVersionError` (someone else changed the record) go back to 1;
6. on :class:`MetadataConnectionError` -- **the answer was lost: the write may have been
   applied** -- go back to 1, but read only after :meth:`MetadataStore.sync` (so the read sees
   every write the store committed before it). If the record now holds exactly the bytes
   written, at the version after the one written against, the write was applied: done.
   Otherwise ``done``/``transform`` decide again from what is stored, as after a conflict.

If the record cannot be re-read after a lost answer, the loop raises
:class:`OutcomeUnknownError`: the caller must not act on a guess (delete, close, report
success or failure); the next call, once the store answers, settles it. Conflicts are bounded
(``max_conflicts``), with a short randomised back-off; running out raises
:class:`MetadataError` naming the record.

A record that may not exist yet is created by the same loop (``missing``: the value a missing
record starts from; the transform applies to it and the result is created): someone else's
create is a conflict like any other, and a lost answer is settled the same way (the record
exists with exactly the bytes written at version 0: applied).

A change may be *guarded* by another record's version (``guard=(path, version)``): the
compare-and-set is then one transaction with a check of that version, so the change is
stored only while the guard record is unchanged; once it has changed, the loop raises
:class:`GuardChangedError` instead of writing (a Spark job's commit is guarded by its job
record, which a reclaim of the job changes).

Deleting resources that a record may name (ledgers a log lists) is decided only through
:func:`prove_absent`: after a synced read, a compare-and-set of the record at the version read
(a no-op write) makes sure no write issued earlier -- one whose answer was lost included -- can
still be applied, so what the record does not name then is unreferenced for good.
"""
from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, TypeVar

from bkspark.errors import (
    BadVersionError,
    MetadataConnectionError,
    MetadataError,
    NodeExistsError,
    NoNodeError,
)

from .store import MetadataStore

log = logging.getLogger(__name__)

T = TypeVar("T")

#: conflicts (someone else's write won) tolerated before giving up
MAX_CONFLICTS = 200
#: lost answers tolerated in one loop before it reports the outcome as unknown
MAX_UNKNOWN = 5


class NoChange(Exception):
    """Raised by a transform to leave the record as it is (the loop then returns unchanged)."""


class OutcomeUnknownError(MetadataConnectionError):
    """A write's answer was lost and the record could not be re-read to find out whether it
    was applied. Nothing may be decided from it: retry once the metadata store answers."""


class GuardChangedError(MetadataError):
    """The record guarding a change changed (or vanished): the change was not stored."""


@dataclass
class Updated(Generic[T]):
    """What :func:`update_record` left in the store."""

    value: T            #: the record's value now (decoded)
    version: int        #: its version
    changed: bool       #: True: the caller's change is stored (written now, earlier through a
                        #: lost answer, or found there by ``done``); False: ``NoChange``


def update_record(store: MetadataStore, path: str, *, decode: Callable[[bytes], T],
                  encode: Callable[[T], bytes], transform: Callable[[T], T],
                  done: Callable[[T], bool] | None = None,
                  start: tuple[T, int] | None = None, max_conflicts: int = MAX_CONFLICTS,
                  what: str = "", guard: tuple[str, int] | None = None,
                  missing: Callable[[], T] | None = None) -> Updated[T]:
    """Change the record at ``path`` by compare-and-set until the change is stored (see the
    module docstring for the loop and its failure semantics).

    ``start``: ``(value, version)`` the caller already holds, used for the first attempt
    instead of a read (a stale one only costs a conflict).

    ``guard``: ``(path, version)`` of a record that must still be at that version when the
    change is stored (one transaction); :class:`GuardChangedError` once it is not.

    ``missing``: a record that does not exist (or vanishes meanwhile) starts from
    ``missing()`` and is created (parents included) instead of set.

    :raises NoNodeError: the record does not exist and there is no ``missing``.
    :raises OutcomeUnknownError: an answer was lost and the record could not be re-read.
    :raises MetadataError: ``max_conflicts`` conflicts in a row.
    """
    what = what or f"update of {path}"
    conflicts = unknowns = 0
    in_doubt: tuple[bytes, int] | None = None       # (bytes, version) of a lost answer
    current = start
    while True:
        if current is None:
            try:
                data, version = _read(store, path, settle=in_doubt is not None, what=what)
            except NoNodeError:
                if missing is None:
                    raise
                value, version = missing(), -1     # (a create whose answer was lost: not applied)
            else:
                if in_doubt is not None and (data, version) == (in_doubt[0], in_doubt[1] + 1):
                    log.info("%s: the write whose answer was lost had been applied", what)
                    return Updated(decode(data), version, True)
                value = decode(data)
        else:
            value, version = current
            current = None
        if done is not None and done(value):
            return Updated(value, version, True)
        try:
            new_value = transform(value)
        except NoChange:
            return Updated(value, version, False)
        data = encode(new_value)
        try:
            if guard is None:
                if version == -1:
                    store.create(path, data, makepath=True)
                    new_version = 0
                else:
                    new_version = store.set(path, data, version=version)
            else:
                txn = store.transaction()
                txn.check(guard[0], guard[1])
                if version == -1:
                    txn.create(path, data)
                else:
                    txn.set(path, data, version=version)
                results = txn.commit()
                new_version = 0 if version == -1 else results[1]
            return Updated(new_value, new_version, True)
        except NoNodeError:
            if guard is not None:
                check_guard(store, guard, what)
            if missing is None:
                raise
            conflicts += 1              # deleted meanwhile (or a parent pruned): again
            after_conflict(conflicts, what, max_conflicts=max_conflicts)
        except (BadVersionError, NodeExistsError):
            if guard is not None:
                check_guard(store, guard, what)
            conflicts += 1
            after_conflict(conflicts, what, max_conflicts=max_conflicts)
        except MetadataConnectionError as exc:
            unknowns += 1
            in_doubt = (data, version)
            after_lost_answer(unknowns, what, exc)


def after_conflict(conflicts: int, what: str, detail: str = "", *,
                   max_conflicts: int = MAX_CONFLICTS) -> None:
    """Back off before the ``conflicts``-th retry of a change that lost a race (jittered, from
    the fourth on); MetadataError once there were more than ``max_conflicts`` in a row."""
    if conflicts > max_conflicts:
        raise MetadataError(f"{what}: {conflicts} conflicting concurrent changes in a row; gave "
                            f"up (retry later){': ' + detail if detail else ''}") from None
    if conflicts > 3:
        time.sleep(random.uniform(0, min(0.2, 0.005 * conflicts)))


def after_lost_answer(unknowns: int, what: str, exc: Exception) -> None:
    """Log a write whose answer was lost (the caller re-reads to settle it); after more than
    MAX_UNKNOWN in a row, OutcomeUnknownError."""
    log.info("%s: answer lost (%s); re-reading to find out whether it was applied", what, exc)
    if unknowns > MAX_UNKNOWN:
        raise OutcomeUnknownError(
            f"{what}: {unknowns} answers lost in a row; whether the last write was applied is "
            f"unknown: {exc}") from exc


def check_guard(store: MetadataStore, guard: tuple[str, int], what: str) -> None:
    """GuardChangedError unless the guard record is still at its version."""
    path, version = guard
    try:
        _, now = store.get(path)
    except NoNodeError:
        now = None
    if now != version:
        raise GuardChangedError(f"{what}: {path} changed (version {version} -> {now}); the "
                                "change was not stored") from None


def _read(store, path, *, settle: bool, what: str) -> tuple[bytes, int]:
    try:
        if settle:
            store.sync(path)
        return store.get(path)
    except MetadataConnectionError as exc:
        if settle:
            raise OutcomeUnknownError(
                f"{what}: the answer to a write was lost and {path} cannot be re-read, so "
                f"whether the write was applied is unknown (retry once the metadata store "
                f"answers): {exc}") from exc
        raise


def settled_read(store: MetadataStore, path: str) -> tuple[bytes, int]:
    """``(data, version)`` of ``path`` read after :meth:`MetadataStore.sync`: it reflects every
    write the store committed before this call (on ZooKeeper, also those committed through
    another server than the one this client is connected to)."""
    store.sync(path)
    return store.get(path)


def transaction_applied(store: MetadataStore, marker: str) -> bool:
    """Whether a transaction whose answer was lost was applied, told by ``marker``: a path that
    transaction creates and no other writer does. Transactions are all-or-nothing, so the
    marker is stored exactly when the rest is; read after :meth:`MetadataStore.sync` (see
    :class:`metadata.store.Transaction`, "A lost answer").

    :raises MetadataConnectionError: the store did not answer; decide nothing.
    """
    store.sync(marker)
    return store.exists(marker) is not None


def prove_absent(store: MetadataStore, path: str, names: Callable[[bytes], Iterable[Any]],
                 candidates: Iterable[Any], *, what: str = "") -> set:
    """Which of ``candidates`` the record at ``path`` does not name, for good.

    Reads the record after a sync; when some candidates are absent, compare-and-sets the same
    bytes at the version read: once that succeeds, no write issued before (a lost answer's
    included, whose version check can no longer pass) can put them there, and nothing adds
    an existing resource to a record later. Conflicts re-read. A missing record names nothing.

    :raises MetadataConnectionError: the store did not answer; decide nothing.
    """
    candidates = set(candidates)
    if not candidates:
        return set()
    what = what or f"proof of absence in {path}"
    for _ in range(MAX_CONFLICTS):
        try:
            data, version = settled_read(store, path)
        except NoNodeError:
            return candidates
        absent = candidates - set(names(data))
        if not absent:
            return absent
        try:
            store.set(path, data, version=version)
            return absent
        except BadVersionError:
            continue
        except NoNodeError:
            return candidates
    raise MetadataError(f"{what}: the record kept changing; decided nothing")
