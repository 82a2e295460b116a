"""Ledger manager: ledger metadata records at BookKeeper's hierarchical paths.

Versions are the store's record versions; every change after creation is a
compare-and-set (:func:`write_ledger`), so two clients can never both win a close, an
ensemble change or a recovery.
"""
from __future__ import annotations

from typing import Callable, Iterator

from bkspark.errors import (BadRequestError, BadVersionError, MetadataConnectionError,
                            NodeExistsError, NoNodeError, NoSuchLedgerError)

from .layout import (
    LEDGERS_ROOT,
    LONG_LEVELS,
    SHORT_LEVELS,
    check_ledger_id,
    ledger_id_from_path,
    ledger_path,
)
from .ledger_metadata import LedgerMetadata
from .store import MetadataStore
from .update import MAX_UNKNOWN, OutcomeUnknownError, Updated, settled_read, update_record

#: version of a freshly created ledger record (both stores start versions at 0)
CREATED_VERSION = 0


def create_ledger(store: MetadataStore, md: LedgerMetadata) -> LedgerMetadata:
    """Store ``md`` as a new ledger; return it with its ledger id and ctime set (the ctime is
    the store's time, :mod:`metadata.clock`: retention may judge it).

    If ``md.ledger_id`` is -1 an id is allocated with ``store.generate_id()``; otherwise that
    id is used and :class:`NodeExistsError` is raised if the ledger exists. The new record's
    version is :data:`CREATED_VERSION`.
    """
    if not isinstance(md, LedgerMetadata):
        raise BadRequestError(f"create_ledger needs LedgerMetadata, got {type(md).__name__}")
    md = md.copy(ctime_ms=store.clock.now_ms())
    if md.ledger_id != -1:
        check_ledger_id(md.ledger_id)
        _create_record(store, md)
        return md
    md.validate()
    for _ in range(16):
        candidate = md.with_ledger_id(store.generate_id())
        try:
            _create_record(store, candidate)
            return candidate
        except NodeExistsError:  # an explicit-id ledger took it; draw again
            continue
    raise NodeExistsError("could not allocate a free ledger id in 16 attempts")


def _create_record(store: MetadataStore, md: LedgerMetadata) -> None:
    """Create the ledger's record. A create whose answer was lost is settled by a synced
    read: the record holds exactly these bytes (it was applied), it is absent (create it),
    or it holds another ledger (NodeExistsError)."""
    path, data = ledger_path(md.ledger_id), md.serialize()
    for _ in range(MAX_UNKNOWN):
        try:
            store.create(path, data, makepath=True)
            return
        except MetadataConnectionError:
            try:
                stored, _ = settled_read(store, path)
            except NoNodeError:
                continue
            except MetadataConnectionError as exc:
                raise OutcomeUnknownError(f"creating ledger {md.ledger_id}: the answer was "
                                          f"lost and the record cannot be re-read: {exc}") from exc
            if stored == data:
                return
            raise NodeExistsError(f"ledger {md.ledger_id} exists (created by another client)")
    raise OutcomeUnknownError(f"creating ledger {md.ledger_id}: {MAX_UNKNOWN} answers lost")


def read_ledger(store: MetadataStore, ledger_id: int, settle: bool = False
                ) -> tuple[LedgerMetadata, int]:
    """Return ``(metadata, version)``; with ``settle``, read after a sync (see
    :meth:`MetadataStore.sync`).

    :raises NoSuchLedgerError: no such ledger.
    :raises MetadataFormatError: the stored record is corrupt (the message names the ledger).
    """
    try:
        if settle:
            store.sync(ledger_path(ledger_id))
        data, version = store.get(ledger_path(ledger_id))
    except NoNodeError:
        raise NoSuchLedgerError(f"no such ledger: {ledger_id}") from None
    return _decode(ledger_id, data), version


def read_ledgers(store: MetadataStore, ledger_ids) -> list[tuple[LedgerMetadata, int] | None]:
    """:func:`read_ledger` of many ledgers in one pipelined round (``get_many``): one
    ``(metadata, version)`` per id, None for a ledger that does not exist.

    :raises MetadataFormatError: a stored record is corrupt (the message names the ledger).
    """
    ids = list(ledger_ids)
    found = store.get_many([ledger_path(lid) for lid in ids])
    return [None if item is None else (_decode(lid, item[0]), item[1])
            for lid, item in zip(ids, found)]


def _decode(ledger_id: int, data: bytes) -> LedgerMetadata:
    from bkspark.errors import MetadataFormatError
    try:
        md = LedgerMetadata.deserialize(data)
    except MetadataFormatError as e:
        raise MetadataFormatError(f"ledger {ledger_id}: {e}") from None
    if md.ledger_id != ledger_id:
        raise MetadataFormatError(f"ledger {ledger_id}: record holds ledger id {md.ledger_id}")
    return md


def update_ledger(store: MetadataStore, ledger_id: int,
                  transform: Callable[[LedgerMetadata], LedgerMetadata], *,
                  done: Callable[[LedgerMetadata], bool] | None = None,
                  start: tuple[LedgerMetadata, int] | None = None, what: str = ""
                  ) -> Updated[LedgerMetadata]:
    """Change a ledger's metadata through the metadata update loop (:func:`update_record`):
    ``transform`` decides from the latest record (re-run after a conflict, or after a lost
    answer that turned out not applied), may raise :class:`NoChange` or abort.

    :raises NoSuchLedgerError: the ledger was deleted.
    :raises OutcomeUnknownError: an answer was lost and the record could not be re-read.
    """
    try:
        return update_record(store, ledger_path(ledger_id),
                             decode=lambda data: _decode(ledger_id, data),
                             encode=lambda md: md.serialize(), transform=transform,
                             done=done, start=start, what=what or f"ledger {ledger_id}")
    except NoNodeError:
        raise NoSuchLedgerError(f"no such ledger: {ledger_id}") from None


def upgrade_ledger(store: MetadataStore, ledger_id: int) -> bool:
    """Rewrite the ledger's record in the current format if it is stored in an older one
    (format 1 held the ledger's password: :mod:`metadata.ledger_metadata`); return whether
    this call rewrote it. A conflict re-reads (any other write is in the current format
    already); an answer lost raises, and a rerun decides from what is stored.

    :raises NoSuchLedgerError: no such ledger (deleted meanwhile).
    """
    from metadata.ledger_metadata import FORMAT_VERSION
    while True:
        try:
            data, version = store.get(ledger_path(ledger_id))
        except NoNodeError:
            raise NoSuchLedgerError(f"no such ledger: {ledger_id}") from None
        if LedgerMetadata.format_of(data) == FORMAT_VERSION:
            return False
        try:
            write_ledger(store, _decode(ledger_id, data), version)
            return True
        except BadVersionError:
            continue


def write_ledger(store: MetadataStore, md: LedgerMetadata, version: int) -> int:
    """Compare-and-set the ledger's record; return the new version.

    :raises BadVersionError: someone else changed it since ``version`` (re-read, re-decide).
    :raises NoSuchLedgerError: the ledger was deleted.
    """
    try:
        return store.set(ledger_path(md.ledger_id), md.serialize(), version=version)
    except NoNodeError:
        raise NoSuchLedgerError(f"no such ledger: {md.ledger_id}") from None


def delete_ledger(store: MetadataStore, ledger_id: int, version: int = -1) -> None:
    """Delete the ledger's record (empty hierarchy directories are left, as BookKeeper does).

    :raises NoSuchLedgerError: no such ledger.
    """
    try:
        store.delete(ledger_path(ledger_id), version=version)
    except NoNodeError:
        raise NoSuchLedgerError(f"no such ledger: {ledger_id}") from None


#: ledger records one :func:`delete_ledgers` transaction removes, at most
DELETE_BATCH = 128


def delete_ledgers(store: MetadataStore, ledger_ids, batch: int = DELETE_BATCH) -> None:
    """Delete many ledgers' records, ``batch`` per transaction (one metadata write for the
    batch instead of one each: a retention cut removes thousands). Ledgers already gone are
    skipped: a batch that fails because one is missing, or whose answer was lost, is deleted
    record by record. On return none of ``ledger_ids`` exists.

    :raises MetadataConnectionError: a batch's answer was lost and the store did not answer
        again: the batches before it were deleted, it may have been, the later ones were not.
    """
    ids = list(ledger_ids)
    for i in range(0, len(ids), batch):
        chunk = ids[i:i + batch]
        txn = store.transaction()
        for lid in chunk:
            txn.delete(ledger_path(lid))
        try:
            txn.commit()
            continue
        except NoNodeError:
            pass                        # one is gone already: the batch applied nothing
        except MetadataConnectionError:
            store.sync()                # all of it or nothing was applied: once answered,
        for lid in chunk:               # record by record says which
            try:
                delete_ledger(store, lid)
            except NoSuchLedgerError:
                pass


def ledger_exists(store: MetadataStore, ledger_id: int) -> bool:
    return store.exists(ledger_path(ledger_id)) is not None


def list_ledgers(store: MetadataStore) -> Iterator[int]:
    """Yield every ledger id, ascending, by walking the hierarchy (short form, then long)."""
    root = LEDGERS_ROOT or "/"
    for levels in (SHORT_LEVELS, LONG_LEVELS):
        yield from _walk(store, root, levels)


def unlisted_ledgers(store: MetadataStore, ledger_ids) -> list[int]:
    """Those of ``ledger_ids`` that the store does not list, ascending: one children listing
    per directory of the hierarchy they fall in (a leaf holds up to 10,000 ledgers), not a
    read per ledger. A listed ledger exists (or did a moment ago); an unlisted one was deleted
    or never created -- a caller that acts on absence (deletes data) confirms it first with
    :func:`read_ledger` (:class:`NoSuchLedgerError`)."""
    by_parent: dict[str, list[tuple[int, str]]] = {}
    for lid in ledger_ids:
        parent, _, name = ledger_path(lid).rpartition("/")
        by_parent.setdefault(parent, []).append((lid, name))
    out = []
    for parent, members in by_parent.items():
        try:
            names = set(store.children(parent))
        except NoNodeError:
            names = set()
        out.extend(lid for lid, name in members if name not in names)
    return sorted(out)


def _walk(store, path, levels):
    try:
        names = store.children(path)
    except NoNodeError:  # removed while we walked
        return
    pattern, rest = levels[0], levels[1:]
    for name in names:
        if not pattern.match(name):
            continue
        child = ("" if path == "/" else path) + "/" + name
        if rest:
            yield from _walk(store, child, rest)
        else:
            try:
                yield ledger_id_from_path(child)
            except BadRequestError:
                continue


def watch_ledger(store: MetadataStore, ledger_id: int,
                 callback: Callable[[LedgerMetadata | None, int | None], None]) -> Callable[[], None]:
    """Call ``callback(metadata, version)`` now and on every change (``(None, None)`` once
    deleted). A corrupt record is reported as ``(None, version)`` and logged."""
    import logging

    def on_data(data, version):
        if data is None:
            callback(None, None)
            return
        try:
            callback(LedgerMetadata.deserialize(data), version)
        except Exception as e:  # noqa: BLE001 - corrupt record: report, don't kill the watch
            logging.getLogger(__name__).error("ledger %d: %s", ledger_id, e)
            callback(None, version)

    return store.watch_data(ledger_path(ledger_id), on_data)
